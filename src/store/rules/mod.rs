//! What the store writes for the routing rules (`domain::decide`,
//! `domain::refusal`): a backend asks for a [`Plan`], applies it with one
//! guarded write that repeats the whole claim compare-and-swap, and falls
//! back to [`explain_miss`] when the guard matched no row.

use super::rows::{ReceiptRow, to_stored, to_u64};
use super::{Enqueued, NewReceipt, Status, StoreResult};
use crate::domain::{
    self, Claim, DEFAULT_GROUP, Decision, LeaseToken, Outcome, RetryPolicy, Route, StoreError, U63,
    UnixMs,
};

mod miss;
mod sql;
pub use miss::{changed_while_claimed, explain_miss, mismatch, refused_plan};
pub(crate) use sql::{
    cas_sql, claim_groups_sql, claimable_sql, history_insert, lapsed_sql, next_group_sql,
    outcome_set_sql, priority_below_sql, top_priority_sql, unleased_sql,
};

/// The claim fields of the compare-and-swap, as the database binds them.
#[derive(Debug, Clone)]
pub struct Cas<'a> {
    pub receipt_id: &'a str,
    pub finalized_at: i64,
    pub attempts: i64,
    pub row_version: i64,
    pub lease_owner: &'a str,
    pub lease_token: &'a str,
    pub lease_until_ms: i64,
}

impl<'a> Cas<'a> {
    #[must_use]
    pub fn of(claim: &'a Claim) -> Self {
        Self {
            receipt_id: claim.receipt_id.as_str(),
            finalized_at: claim.finalized_at.as_i64(),
            attempts: i64::from(claim.attempts),
            row_version: claim.row_version.as_i64(),
            lease_owner: claim.lease_owner.as_str(),
            lease_token: claim.lease_token.as_str(),
            lease_until_ms: claim.lease_until_ms.as_i64(),
        }
    }
}

/// The row change an outcome makes, in the database's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Settled with this transcript.
    Settle { transcript_id: String },
    /// Skipped for this reason.
    Skip { reason: &'static str },
    /// Scheduled again: the new attempt count and due time.
    Retry {
        attempts: i64,
        next_visible_at_ms: i64,
        code: &'static str,
        sha256: String,
        rail_code: Option<String>,
    },
    /// Dead-lettered after `attempts` invocations.
    DeadLetter {
        attempts: i64,
        code: &'static str,
        sha256: String,
        rail_code: Option<String>,
    },
}

/// A history entry to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHistory {
    pub attempt: i64,
    pub outcome: &'static str,
    pub code: Option<&'static str>,
    pub detail_sha256: Option<String>,
    pub transcript_id: Option<String>,
    pub reason: Option<&'static str>,
    pub retry_after_ms: Option<i64>,
    pub rail_code: Option<String>,
    pub worker_id: String,
    pub observed_at_ms: i64,
    pub route: Option<&'static str>,
    pub actor: Option<String>,
    pub note: Option<String>,
}

/// Everything one outcome writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub change: Change,
    pub route: Route,
    pub history: NewHistory,
    pub observed_at_ms: i64,
    /// Whether the claim's lease is live at `observed_at_ms` (a dead lease
    /// fails the guard anyway; this saves the write).
    pub lease_live: bool,
}

/// The new values of a row that an outcome or release writes: the one
/// description of that write for both backends (each writes it with one
/// statement, whether for one item or a batch). `None` in `attempts` or the
/// failure keeps the stored value (a retry's failure stays on the row once
/// it settles); the rest is written as it is (an active row holds no
/// transcript or reason). The lease is always cleared. A new failure
/// replaces the rail code too, absent or not (it belongs to that failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewValues {
    pub status: Status,
    pub attempts: Option<i64>,
    pub next_visible_at_ms: Option<i64>,
    pub failure_code: Option<&'static str>,
    pub failure_sha256: Option<String>,
    pub failure_rail_code: Option<String>,
    pub transcript_id: Option<String>,
    pub skip_reason: Option<&'static str>,
    pub finished_at_ms: Option<i64>,
}

impl NewValues {
    /// What an outcome's plan writes.
    pub fn of_plan(plan: &Plan) -> Self {
        let now = plan.observed_at_ms;
        let finished = |status| Self {
            status,
            attempts: None,
            next_visible_at_ms: None,
            failure_code: None,
            failure_sha256: None,
            failure_rail_code: None,
            transcript_id: None,
            skip_reason: None,
            finished_at_ms: Some(now),
        };
        match &plan.change {
            Change::Settle { transcript_id } => Self {
                transcript_id: Some(transcript_id.clone()),
                ..finished(Status::Settled)
            },
            Change::Skip { reason } => Self {
                skip_reason: Some(reason),
                ..finished(Status::Skipped)
            },
            Change::Retry {
                attempts,
                next_visible_at_ms,
                code,
                sha256,
                rail_code,
            } => Self {
                attempts: Some(*attempts),
                next_visible_at_ms: Some(*next_visible_at_ms),
                failure_code: Some(code),
                failure_sha256: Some(sha256.clone()),
                failure_rail_code: rail_code.clone(),
                finished_at_ms: None,
                ..finished(Status::Active)
            },
            Change::DeadLetter {
                attempts,
                code,
                sha256,
                rail_code,
            } => Self {
                attempts: Some(*attempts),
                failure_code: Some(code),
                failure_sha256: Some(sha256.clone()),
                failure_rail_code: rail_code.clone(),
                ..finished(Status::DeadLettered)
            },
        }
    }

    /// What a release writes: due again at once, attempts unchanged.
    pub fn release(now: i64) -> Self {
        Self {
            status: Status::Active,
            attempts: None,
            next_visible_at_ms: Some(now),
            failure_code: None,
            failure_sha256: None,
            failure_rail_code: None,
            transcript_id: None,
            skip_reason: None,
            finished_at_ms: None,
        }
    }
}

fn overflow(what: &str) -> StoreError {
    StoreError::invalid_record(format!("{what} overflows"))
}

/// Decide the outcome (`domain::decide`) and say what to write for it.
pub fn plan_outcome(
    claim: &Claim,
    input: &Outcome,
    policy: RetryPolicy,
    observed_at_ms: UnixMs,
) -> StoreResult<Plan> {
    let observed = U63::from(observed_at_ms);
    let decision =
        domain::decide(claim, input, &policy, observed).map_err(|too_big| overflow(too_big.0))?;
    let route = decision.route();
    let retry_after_ms = input
        .retry_after_ms()
        .map(|ms| to_stored(ms, "retry_after_ms").map(U63::as_i64))
        .transpose()?;
    let failure = input.failure();
    let mut history = NewHistory {
        attempt: i64::from(claim.attempts) + 1,
        outcome: input.kind(),
        code: failure.map(|f| f.code.as_str()),
        detail_sha256: failure.map(|f| f.detail_sha256.clone()),
        transcript_id: None,
        reason: None,
        retry_after_ms,
        rail_code: failure.and_then(|f| f.rail_code.as_ref().map(|r| r.as_str().to_owned())),
        worker_id: claim.lease_owner.as_str().to_owned(),
        observed_at_ms: observed.as_i64(),
        route: Some(route.kind()),
        actor: None,
        note: None,
    };
    let change = match decision {
        Decision::Settle { transcript_id } => {
            let transcript_id = transcript_id.as_str().to_owned();
            history.transcript_id = Some(transcript_id.clone());
            Change::Settle { transcript_id }
        }
        Decision::Skip { reason } => {
            history.reason = Some(reason.as_str());
            Change::Skip {
                reason: reason.as_str(),
            }
        }
        Decision::Retry {
            attempt,
            next_visible_at_ms,
            failure,
        } => Change::Retry {
            attempts: i64::from(attempt),
            next_visible_at_ms: next_visible_at_ms.as_i64(),
            code: failure.code.as_str(),
            rail_code: failure.rail_code.map(|r| r.as_str().to_owned()),
            sha256: failure.detail_sha256,
        },
        Decision::DeadLetter { attempts, failure } => Change::DeadLetter {
            attempts: i64::from(attempts),
            code: failure.code.as_str(),
            rail_code: failure.rail_code.map(|r| r.as_str().to_owned()),
            sha256: failure.detail_sha256,
        },
    };
    Ok(Plan {
        change,
        route,
        history,
        observed_at_ms: observed.as_i64(),
        lease_live: claim.lease_until_ms > observed,
    })
}

/// Positions of a batch split into rounds in which every receipt id appears
/// once: an `UPDATE … FROM` with a repeated key applies an arbitrary one of
/// the repeats, while the serial answer is "first come, first served". Round
/// `n` holds each id's `n`-th occurrence, so repeats keep their order.
pub fn rounds<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (position, id) in ids.enumerate() {
        let n = seen.entry(id).or_insert(0);
        if rounds.len() <= *n {
            rounds.push(Vec::new());
        }
        rounds[*n].push(position);
        *n += 1;
    }
    rounds
}

/// A fresh store binding: 256 bits from the OS CSPRNG.
/// A new lease token (`LeaseToken::generate`), as the database keeps it.
pub fn new_lease_token(now_ms: i64) -> StoreResult<String> {
    LeaseToken::generate(u64::try_from(now_ms).unwrap_or(0))
        .map(String::from)
        .map_err(|e| StoreError::backend(format!("os rng: {e}")))
}

pub fn new_binding() -> StoreResult<[u8; 32]> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::backend(format!("os rng: {e}")))?;
    Ok(bytes)
}

/// `now + lease`, checked and bounded by the database integer range.
pub fn lease_deadline(now_ms: UnixMs, lease_ms: u64) -> StoreResult<i64> {
    now_ms
        .checked_add(lease_ms)
        .map(UnixMs::as_i64)
        .ok_or_else(|| overflow("lease_until_ms"))
}

/// The next row version of a claim, checked.
pub fn next_row_version(row_version: i64) -> StoreResult<i64> {
    if row_version < 0 {
        return Err(StoreError::invalid_record(
            "stored row_version is out of range",
        ));
    }
    row_version
        .checked_add(1)
        .ok_or_else(|| overflow("row_version"))
}

/// Enqueueing an id that exists: identical (`finalized_at` and observation)
/// is a no-op, anything else a conflict. Observations compare as JSON values,
/// so key order does not matter.
pub fn same_identity(existing: &ReceiptRow, new: &NewReceipt) -> StoreResult<Enqueued> {
    let stored: Option<serde_json::Value> = existing
        .observation
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|_| StoreError::invalid_record("stored observation is not JSON"))?;
    // An absent observation and an explicit JSON null are the same identity.
    let stored = stored.filter(|v| !v.is_null());
    let offered = new.observation.as_ref().filter(|v| !v.is_null());
    let same = to_u64(existing.finalized_at, "finalized_at")? == new.finalized_at
        && stored.as_ref() == offered
        && existing.receipt_group == new.group.as_str()
        && existing.priority == new.priority.stored();
    Ok(if same {
        Enqueued::Existing
    } else {
        Enqueued::Conflict
    })
}

/// The groups a batch of receipts names, other than the default group
/// (which always exists), each once: the rows `receipt_groups` must have.
pub fn named_groups<'a>(receipts: impl IntoIterator<Item = &'a NewReceipt>) -> Vec<&'a str> {
    let mut names: Vec<&str> = receipts
        .into_iter()
        .map(|r| r.group.as_str())
        .filter(|g| *g != DEFAULT_GROUP)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The history entry of a lease release.
pub fn release_entry(claim: &Claim, now: i64) -> NewHistory {
    NewHistory {
        attempt: i64::from(claim.attempts),
        outcome: "released",
        code: None,
        detail_sha256: None,
        transcript_id: None,
        reason: None,
        retry_after_ms: None,
        rail_code: None,
        worker_id: claim.lease_owner.as_str().to_owned(),
        observed_at_ms: now,
        route: None,
        actor: None,
        note: None,
    }
}
