//! What the store reports: receipt state, history, dead letters and status.
//! The HTTP API answers with bodies of its own, converted from these, so
//! these can change without changing the API.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::domain::{SettlementFailureCode, SettlementSkipReason};

/// Where a receipt stands, as seen at one instant of the server clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReceiptState {
    /// Due (or waiting for its `visible_at_ms`), never attempted.
    Pending,
    /// Held by a live lease.
    Leased,
    /// Failed at least once and waiting for its next attempt.
    RetryScheduled,
    /// Accepted by the rail.
    Settled,
    /// Needed no settlement.
    Skipped,
    /// Failed for good; waiting for an operator.
    DeadLettered,
    /// Finished by an operator, never to be settled (`cancel_reason` says why).
    Canceled,
}

impl ReceiptState {
    /// Every state, in the order dashboards list them.
    pub const ALL: [Self; 7] = [
        Self::Pending,
        Self::Leased,
        Self::RetryScheduled,
        Self::Settled,
        Self::Skipped,
        Self::DeadLettered,
        Self::Canceled,
    ];

    /// The snake_case label.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Leased => "leased",
            Self::RetryScheduled => "retry_scheduled",
            Self::Settled => "settled",
            Self::Skipped => "skipped",
            Self::DeadLettered => "dead_lettered",
            Self::Canceled => "canceled",
        }
    }
}

/// The live lease of a receipt (never its token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Worker holding the lease.
    pub owner: String,
    /// Lease deadline, server ms.
    pub until_ms: u64,
}

/// The last failure recorded for a receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureView {
    /// Failure code.
    pub code: SettlementFailureCode,
    /// SHA-256 (hex) of the worker's detail text.
    pub detail_sha256: String,
    /// The rail's own code for the failure (e.g. `card_declined`), when the
    /// worker gave one.
    pub rail_code: Option<String>,
}

/// A receipt that failed for good and waits for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub receipt_id: String,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: u64,
    /// Total invocations, the last (failed) one included.
    pub attempts: u32,
    /// Why the last invocation failed (the same as `last_failure.code`, kept
    /// for clients written before `last_failure`).
    pub code: SettlementFailureCode,
    /// SHA-256 (hex) of the worker's `detail` text; the text itself is not
    /// kept (the same as `last_failure.detail_sha256`).
    pub detail_sha256: String,
    /// The failure that dead-lettered it, in the shape `GET /v1/receipts`
    /// and `GET /v1/receipts/{id}` show it.
    pub last_failure: FailureView,
    /// When it was dead-lettered (server ms).
    pub dead_lettered_at_ms: u64,
    /// The receipt's group (docs/groups.md).
    pub group: String,
}

/// One entry of a receipt's history: an outcome a worker reported, a lease
/// a worker gave back, or an operator's redrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// For an outcome: which invocation of the receipt it reports, counted
    /// from 1 (the claim's `attempts` + 1). The first try is `attempt` 1; a
    /// success after one retry is `attempt` 2 while the receipt says
    /// `attempts: 1` (one failure). For `released` and `redrive`: the
    /// receipt's `attempts` at that moment. A redrive starts the count again.
    pub attempt: u32,
    /// A [`HistoryOutcome`] label.
    pub outcome: String,
    /// The failure code of a `retryable` or `permanent` outcome.
    pub code: Option<SettlementFailureCode>,
    /// SHA-256 (hex) of a failure's `detail` text.
    pub detail_sha256: Option<String>,
    /// The rail's own code for a failure (e.g. `card_declined`), when the
    /// worker gave one.
    pub rail_code: Option<String>,
    /// The rail's transcript id of an `accepted` outcome.
    pub transcript_id: Option<String>,
    /// Why a `skipped` outcome needed no settlement.
    pub reason: Option<SettlementSkipReason>,
    /// The worker that reported it, or `operator`.
    pub worker_id: String,
    /// When the server recorded it (server ms).
    pub observed_at_ms: u64,
    /// What the server did with an outcome; absent for releases and redrives.
    pub route: Option<String>,
    /// The name of the operator's token, for an operator's action taken
    /// with a named token (`--token operator:NAME:TOKEN`).
    pub actor: Option<String>,
    /// The reason an operator gave for a `hold` or a `cancel`.
    pub note: Option<String>,
    /// The rail's own wait a `retryable` outcome carried (`retry_after_ms`),
    /// as the worker reported it; the retry's wait is the longer of it and
    /// the backoff, at most the policy's `backoff_cap_ms`.
    pub retry_after_ms: Option<u64>,
}

/// What a history entry records: the outcome a worker reported (`accepted`,
/// `skipped`, `retryable`, `permanent`), a lease it gave back (`released`),
/// or an operator's action (`redrive`, `hold`, `unhold`, `cancel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryOutcome {
    Accepted,
    Skipped,
    Retryable,
    Permanent,
    Released,
    Redrive,
    Hold,
    Unhold,
    Cancel,
}

impl HistoryOutcome {
    /// Every label.
    pub const ALL: [Self; 9] = [
        Self::Accepted,
        Self::Skipped,
        Self::Retryable,
        Self::Permanent,
        Self::Released,
        Self::Redrive,
        Self::Hold,
        Self::Unhold,
        Self::Cancel,
    ];
}

/// What the server did with an outcome: `no_action` (finished: settled or
/// skipped), `retry_scheduled` (due again after a backoff) or
/// `dead_lettered` (failed for good).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    NoAction,
    RetryScheduled,
    DeadLettered,
}

impl RouteKind {
    /// Every label.
    pub const ALL: [Self; 3] = [Self::NoAction, Self::RetryScheduled, Self::DeadLettered];
}

/// A receipt's full state. Never contains the lease token.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptView {
    pub receipt_id: String,
    /// Its group (docs/groups.md): `default` unless the producer named one.
    pub group: String,
    /// Its priority within the group (docs/groups.md, "Priorities"):
    /// -1000..=1000, higher first; 0 unless the producer gave one.
    pub priority: i64,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: u64,
    pub state: ReceiptState,
    /// How many invocations have failed and been retried: 0 until the first
    /// failure, unchanged by a success or a release. Once dead-lettered, the
    /// total number of invocations, the last one included. A redrive sets it
    /// back to 0. A claim carries this count; history entries number
    /// invocations from 1 instead (see `HistoryEntry.attempt`).
    pub attempts: u32,
    /// Bumped by every claim.
    pub row_version: u64,
    /// When the receipt is next due (server ms); null once finished.
    pub next_visible_at_ms: Option<u64>,
    /// The live lease, while one holds the receipt.
    pub lease: Option<LeaseView>,
    /// The last failure, once there was one.
    pub last_failure: Option<FailureView>,
    /// The rail's transcript id, once settled.
    pub transcript_id: Option<String>,
    /// Why it needed no settlement, once skipped.
    pub skip_reason: Option<SettlementSkipReason>,
    /// The dead letter, while dead-lettered.
    pub dead_letter: Option<DeadLetter>,
    /// Since when an operator holds the receipt (server ms): no claim takes
    /// it until it is unheld. A live lease on it may still report its outcome.
    pub held_at_ms: Option<u64>,
    /// Why an operator canceled it, once canceled.
    pub cancel_reason: Option<String>,
    /// The producer's observation exactly as enqueued, or null.
    pub observation: Option<serde_json::Value>,
    /// Oldest first.
    pub history: Vec<HistoryEntry>,
}

/// A receipt in a status sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptSummary {
    pub receipt_id: String,
    pub finalized_at: u64,
    pub attempts: u32,
}

/// Receipts of one state, ordered by `(finalized_at, receipt_id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSample {
    pub total: u64,
    pub returned: u64,
    pub truncated: bool,
    pub receipts: Vec<ReceiptSummary>,
}

/// Receipt counts per state, and how many of the pending ones are not due yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Never attempted and not leased: due now, or scheduled for later (see `scheduled`).
    pub pending: u64,
    /// Of the `pending` receipts, those whose `visible_at_ms` is still ahead: never attempted,
    /// not yet visible. `pending - scheduled` are due now. Not a state of its own, so the six
    /// states still add up to every receipt.
    pub scheduled: u64,
    /// Of the active receipts (`pending`, `retry_scheduled` or `leased`), those an
    /// operator holds: not claimed again until unheld (docs/operators.md). Not a
    /// state of its own either.
    pub held: u64,
    pub leased: u64,
    pub retry_scheduled: u64,
    pub settled: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
    pub canceled: u64,
}

impl StateCounts {
    /// Add one receipt of `state`.
    pub fn add(&mut self, state: ReceiptState, n: u64) {
        let slot = match state {
            ReceiptState::Pending => &mut self.pending,
            ReceiptState::Leased => &mut self.leased,
            ReceiptState::RetryScheduled => &mut self.retry_scheduled,
            ReceiptState::Settled => &mut self.settled,
            ReceiptState::Skipped => &mut self.skipped,
            ReceiptState::DeadLettered => &mut self.dead_lettered,
            ReceiptState::Canceled => &mut self.canceled,
        };
        *slot += n;
    }

    /// The count of `state`.
    #[must_use]
    pub const fn get(&self, state: ReceiptState) -> u64 {
        match state {
            ReceiptState::Pending => self.pending,
            ReceiptState::Leased => self.leased,
            ReceiptState::RetryScheduled => self.retry_scheduled,
            ReceiptState::Settled => self.settled,
            ReceiptState::Skipped => self.skipped,
            ReceiptState::DeadLettered => self.dead_lettered,
            ReceiptState::Canceled => self.canceled,
        }
    }
}

/// The queue at a glance.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusView {
    pub counts: StateCounts,
    /// How long the oldest claimable receipt has been due, in ms; 0 when none is.
    pub oldest_due_age_ms: u64,
    /// Up to `limit` receipts of each state.
    pub samples: BTreeMap<ReceiptState, StateSample>,
    /// The first 100 groups by name, with their live leases, oldest due
    /// age and limits (depth at `GET /v1/groups`).
    pub groups: Vec<GroupView>,
}

/// A group as `GET /v1/groups` lists it (docs/groups.md).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupView {
    pub group: String,
    /// Nothing in the group is claimed while paused.
    pub paused: bool,
    /// At most this many live leases in the group; null: no cap.
    pub max_leased: Option<u64>,
    /// Claims per second as a token bucket; null: no rate limit.
    pub rate: Option<crate::domain::Rate>,
    /// Active receipts not held by an operator (waiting, due or leased).
    /// Left out of `/v1/status` (it costs one index entry per active receipt).
    pub depth: Option<u64>,
    /// Live leases.
    pub leased: u64,
    /// How long the oldest due, unleased receipt has waited (ms); 0 when none.
    pub oldest_due_age_ms: u64,
}

#[cfg(test)]
#[path = "views_tests.rs"]
mod tests;
