//! Rows as both backends return them, and their checked conversion into
//! domain values: a value that does not fit is a corrupt record.

use sqlx::FromRow;

use super::{
    DeadLetter, FailureView, HistoryEntry, LeaseView, ReceiptClaim, ReceiptState, ReceiptView,
    Status, StoreResult,
};
use crate::domain::{
    Claim, Claimed, GroupName, LeaseToken, Priority, ReceiptId, SettlementFailureCode,
    SettlementSkipReason, StoreError, TraceContext, U63, WorkerId,
};

/// Every column of `receipts` that the store reads.
#[derive(Debug, Clone, FromRow)]
pub struct ReceiptRow {
    pub receipt_id: String,
    pub finalized_at: i64,
    pub observation: Option<String>,
    #[sqlx(try_from = "String")]
    pub status: Status,
    pub attempts: i64,
    pub row_version: i64,
    pub next_visible_at_ms: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_token: Option<String>,
    pub lease_until_ms: Option<i64>,
    pub failure_code: Option<String>,
    pub failure_sha256: Option<String>,
    pub failure_rail_code: Option<String>,
    pub transcript_id: Option<String>,
    pub skip_reason: Option<String>,
    pub finished_at_ms: Option<i64>,
    /// Set while an operator holds the receipt (docs/operators.md); means
    /// nothing once the receipt is no longer active.
    pub held_at_ms: Option<i64>,
    pub cancel_reason: Option<String>,
    pub receipt_group: String,
    pub priority: i16,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// The column list matching [`ReceiptRow`], for `SELECT` and `RETURNING`.
/// A macro, not a `const`, so that `concat!` can build whole statements
/// at compile time; crate-private (`pub(crate) use` below).
macro_rules! receipt_columns {
    () => {
        "receipt_id, finalized_at, observation, status, attempts, row_version, \
         next_visible_at_ms, lease_owner, lease_token, lease_until_ms, failure_code, \
         failure_sha256, transcript_id, skip_reason, finished_at_ms, held_at_ms, cancel_reason, \
         receipt_group, priority, traceparent, tracestate, failure_rail_code"
    };
}

/// The column list matching [`HistoryRow`].
macro_rules! history_columns {
    () => {
        "attempt, outcome, code, detail_sha256, transcript_id, reason, worker_id, \
         observed_at_ms, route, actor, note, retry_after_ms, rail_code"
    };
}
pub(crate) use {history_columns, receipt_columns};

/// One `receipt_history` row.
#[derive(Debug, Clone, FromRow)]
pub struct HistoryRow {
    pub attempt: i64,
    pub outcome: String,
    pub code: Option<String>,
    pub detail_sha256: Option<String>,
    pub transcript_id: Option<String>,
    pub reason: Option<String>,
    pub worker_id: String,
    pub observed_at_ms: i64,
    pub route: Option<String>,
    pub actor: Option<String>,
    pub note: Option<String>,
    pub retry_after_ms: Option<i64>,
    pub rail_code: Option<String>,
}

fn corrupt(what: &str) -> StoreError {
    StoreError::invalid_record(format!("stored {what} is out of range"))
}

/// A stored integer as `u64`.
pub fn to_u64(value: i64, what: &str) -> StoreResult<u64> {
    u64::try_from(value).map_err(|_| corrupt(what))
}

/// A stored integer as `u32`.
pub fn to_u63(value: i64, what: &str) -> StoreResult<U63> {
    U63::try_from(value).map_err(|_| corrupt(what))
}

pub fn to_u32(value: i64, what: &str) -> StoreResult<u32> {
    u32::try_from(value).map_err(|_| corrupt(what))
}

/// A value bound for the database as `i64`; one that does not fit is refused.
/// A value the store was handed, as it can keep it.
pub fn to_stored(value: u64, what: &str) -> StoreResult<U63> {
    U63::try_from(value).map_err(|_| {
        StoreError::invalid_record(format!("{what} does not fit a signed 64-bit integer"))
    })
}

pub fn to_i64(value: u64, what: &str) -> StoreResult<i64> {
    to_stored(value, what).map(U63::as_i64)
}

fn code(label: &str) -> StoreResult<SettlementFailureCode> {
    SettlementFailureCode::from_label(label).ok_or_else(|| corrupt("failure code"))
}

fn reason(label: &str) -> StoreResult<SettlementSkipReason> {
    SettlementSkipReason::from_label(label).ok_or_else(|| corrupt("skip reason"))
}

fn observation(text: Option<&str>) -> StoreResult<Option<serde_json::Value>> {
    text.map(|t| serde_json::from_str(t).map_err(|_| corrupt("observation")))
        .transpose()
}

impl ReceiptRow {
    /// Whether a lease is live at `now_ms` (a lease expires *at* its deadline).
    #[must_use]
    pub fn lease_live(&self, now_ms: i64) -> bool {
        self.lease_until_ms.is_some_and(|until| until > now_ms)
    }

    /// Why a claim of this receipt by id cannot take it at `now_ms`, or
    /// `None` when it can: the Rust of `claimable_sql!`, for both backends.
    pub fn unclaimable(&self, now_ms: i64) -> Option<ReceiptClaim> {
        if self.status != Status::Active {
            Some(ReceiptClaim::NoActiveWork)
        } else if self.lease_live(now_ms) {
            Some(ReceiptClaim::Leased)
        } else if self.held_at_ms.is_some() {
            Some(ReceiptClaim::Held)
        } else if self.next_visible_at_ms.is_some_and(|v| v > now_ms) {
            Some(ReceiptClaim::NotYetVisible)
        } else {
            None
        }
    }

    /// The state reported at `now_ms`.
    pub fn state(&self, now_ms: i64) -> StoreResult<ReceiptState> {
        Ok(match self.status {
            Status::Active if self.lease_live(now_ms) => ReceiptState::Leased,
            Status::Active if self.attempts == 0 => ReceiptState::Pending,
            Status::Active => ReceiptState::RetryScheduled,
            Status::Settled => ReceiptState::Settled,
            Status::Skipped => ReceiptState::Skipped,
            Status::DeadLettered => ReceiptState::DeadLettered,
            Status::Canceled => ReceiptState::Canceled,
        })
    }

    /// The producer's trace context, if it sent one.
    pub fn trace(&self) -> Option<TraceContext> {
        let parent = self.traceparent.clone()?;
        Some(TraceContext::from_stored(parent, self.tracestate.clone()))
    }

    /// The stored priority; one out of range is a corrupt record.
    pub fn priority(&self) -> StoreResult<Priority> {
        Priority::parse(i64::from(self.priority)).map_err(|_| corrupt("priority"))
    }

    /// The persisted claim, for rows that carry a lease.
    /// The claim the row's lease stands for (live or expired), if it has one.
    pub fn lease(&self) -> StoreResult<Option<Claim>> {
        let (Some(owner), Some(token), Some(until)) =
            (&self.lease_owner, &self.lease_token, self.lease_until_ms)
        else {
            return Ok(None);
        };
        Ok(Some(Claim {
            receipt_id: ReceiptId::from_stored(self.receipt_id.clone()),
            finalized_at: to_u63(self.finalized_at, "finalized_at")?,
            attempts: to_u32(self.attempts, "attempts")?,
            row_version: to_u63(self.row_version, "row_version")?,
            lease_owner: WorkerId::from_stored(owner.clone()),
            lease_token: LeaseToken::from_stored(token.clone()),
            lease_until_ms: to_u63(until, "lease_until_ms")?,
        }))
    }

    /// The row just leased (or extended), as handed to the worker;
    /// `replaced_until` is the end of the expired lease it replaced, if any.
    pub fn claimed(&self, replaced_until: Option<i64>) -> StoreResult<Claimed> {
        let due = self.next_visible_at_ms.unwrap_or(0);
        let queued_since = replaced_until.map_or(due, |until| until.max(due));
        Ok(Claimed {
            claim: self.lease()?.ok_or_else(|| corrupt("lease"))?,
            observation: observation(self.observation.as_deref())?,
            group: GroupName::from_stored(self.receipt_group.clone()),
            priority: self.priority()?,
            after_expiry: replaced_until.is_some(),
            queued_since_ms: to_u64(queued_since, "next_visible_at_ms")?,
            trace: self.trace(),
        })
    }

    /// The last failure recorded, once there was one.
    fn last_failure(&self) -> StoreResult<Option<FailureView>> {
        let (Some(c), Some(sha)) = (&self.failure_code, &self.failure_sha256) else {
            return Ok(None);
        };
        Ok(Some(FailureView {
            code: code(c)?,
            detail_sha256: sha.clone(),
            rail_code: self.failure_rail_code.clone(),
        }))
    }

    pub fn dead_letter(&self) -> StoreResult<Option<DeadLetter>> {
        if self.status != Status::DeadLettered {
            return Ok(None);
        }
        let (Some(failure), Some(at)) = (self.last_failure()?, self.finished_at_ms) else {
            return Err(corrupt("dead letter"));
        };
        Ok(Some(DeadLetter {
            receipt_id: self.receipt_id.clone(),
            finalized_at: to_u64(self.finalized_at, "finalized_at")?,
            attempts: to_u32(self.attempts, "attempts")?,
            code: failure.code,
            detail_sha256: failure.detail_sha256.clone(),
            last_failure: failure,
            dead_lettered_at_ms: to_u64(at, "dead_lettered_at_ms")?,
            group: self.receipt_group.clone(),
        }))
    }

    /// The full view at `now_ms`, with `history` oldest first.
    pub fn view(&self, now_ms: i64, history: Vec<HistoryRow>) -> StoreResult<ReceiptView> {
        let state = self.state(now_ms)?;
        let lease = match (&self.lease_owner, self.lease_until_ms) {
            (Some(owner), Some(until)) if state == ReceiptState::Leased => Some(LeaseView {
                owner: owner.clone(),
                until_ms: to_u64(until, "lease_until_ms")?,
            }),
            _ => None,
        };
        let last_failure = self.last_failure()?;
        Ok(ReceiptView {
            receipt_id: self.receipt_id.clone(),
            group: self.receipt_group.clone(),
            priority: self.priority()?.get(),
            finalized_at: to_u64(self.finalized_at, "finalized_at")?,
            state,
            attempts: to_u32(self.attempts, "attempts")?,
            row_version: to_u64(self.row_version, "row_version")?,
            next_visible_at_ms: self
                .next_visible_at_ms
                .map(|v| to_u64(v, "next_visible_at_ms"))
                .transpose()?,
            lease,
            last_failure,
            transcript_id: self.transcript_id.clone(),
            skip_reason: self.skip_reason.as_deref().map(reason).transpose()?,
            dead_letter: self.dead_letter()?,
            held_at_ms: self
                .held_at_ms
                .filter(|_| self.status == Status::Active)
                .map(|v| to_u64(v, "held_at_ms"))
                .transpose()?,
            cancel_reason: self.cancel_reason.clone(),
            observation: observation(self.observation.as_deref())?,
            history: history
                .into_iter()
                .map(HistoryRow::entry)
                .collect::<StoreResult<_>>()?,
        })
    }
}

impl HistoryRow {
    /// The audit entry.
    pub fn entry(self) -> StoreResult<HistoryEntry> {
        Ok(HistoryEntry {
            attempt: to_u32(self.attempt, "history attempt")?,
            outcome: self.outcome,
            code: self.code.as_deref().map(code).transpose()?,
            detail_sha256: self.detail_sha256,
            rail_code: self.rail_code,
            transcript_id: self.transcript_id,
            reason: self.reason.as_deref().map(reason).transpose()?,
            worker_id: self.worker_id,
            observed_at_ms: to_u64(self.observed_at_ms, "history observed_at_ms")?,
            route: self.route,
            actor: self.actor,
            note: self.note,
            retry_after_ms: self
                .retry_after_ms
                .map(|ms| to_u64(ms, "history retry_after_ms"))
                .transpose()?,
        })
    }
}
