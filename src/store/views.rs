//! What the store reports: receipt state, history, dead letters and status.
//! These are also the HTTP response bodies.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{SettlementFailureCode, SettlementSkipReason};

/// Where a receipt stands, as seen at one instant of the server clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
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
}

impl ReceiptState {
    /// Every state, in the order dashboards list them.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Leased,
        Self::RetryScheduled,
        Self::Settled,
        Self::Skipped,
        Self::DeadLettered,
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
        }
    }
}

/// The live lease of a receipt (never its token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct LeaseView {
    /// Worker holding the lease.
    pub owner: String,
    /// Lease deadline, server ms.
    pub until_ms: u64,
}

/// The last failure recorded for a receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FailureView {
    /// Failure code.
    pub code: SettlementFailureCode,
    /// SHA-256 (hex) of the worker's detail text.
    pub detail_sha256: String,
}

/// A receipt that failed for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct DeadLetter {
    pub receipt_id: String,
    pub finalized_at: u64,
    /// Total invocations, the last one included.
    pub attempts: u32,
    pub code: SettlementFailureCode,
    pub detail_sha256: String,
    pub dead_lettered_at_ms: u64,
}

/// One audit entry: a committed outcome, a release or a redrive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct HistoryEntry {
    /// 1-based invocation number for outcomes; the attempts count for releases and redrives.
    pub attempt: u32,
    /// `accepted`, `skipped`, `retryable`, `permanent`, `released` or `redrive`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<SettlementFailureCode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<SettlementSkipReason>,
    /// The worker that reported it, or `operator`.
    pub worker_id: String,
    pub observed_at_ms: u64,
    /// `no_action`, `retry_scheduled` or `dead_lettered`; absent for releases and redrives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
}

/// A receipt's full state. Never contains the lease token.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ReceiptView {
    pub receipt_id: String,
    pub finalized_at: u64,
    pub state: ReceiptState,
    /// Failed attempts so far; once dead-lettered, the total number of invocations.
    pub attempts: u32,
    pub row_version: u64,
    /// When the receipt is next due; null once finished.
    pub next_visible_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<SettlementSkipReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// The producer's observation, or null.
    #[schema(value_type = Option<Object>)]
    pub observation: Option<serde_json::Value>,
    /// Oldest first.
    pub history: Vec<HistoryEntry>,
}

/// A receipt in a status sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ReceiptSummary {
    pub receipt_id: String,
    pub finalized_at: u64,
    pub attempts: u32,
}

/// Receipts of one state, ordered by `(finalized_at, receipt_id)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct StateSample {
    pub total: u64,
    pub returned: u64,
    pub truncated: bool,
    pub receipts: Vec<ReceiptSummary>,
}

/// Receipt counts per state, and how many of the pending ones are not due yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct StateCounts {
    /// Never attempted and not leased: due now, or scheduled for later (see `scheduled`).
    pub pending: u64,
    /// Of the `pending` receipts, those whose `visible_at_ms` is still ahead: never attempted,
    /// not yet visible. `pending - scheduled` are due now. Not a state of its own, so the six
    /// states still add up to every receipt.
    pub scheduled: u64,
    pub leased: u64,
    pub retry_scheduled: u64,
    pub settled: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
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
        }
    }
}

/// The queue at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct StatusView {
    pub counts: StateCounts,
    /// How long the oldest claimable receipt has been due, in ms; 0 when none is.
    pub oldest_due_age_ms: u64,
    /// Up to `limit` receipts of each state.
    pub samples: BTreeMap<ReceiptState, StateSample>,
}
