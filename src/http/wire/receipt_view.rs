//! A receipt as the API shows it (`GET /v1/receipts/{id}` and every answer
//! that returns a receipt), and its dead letter, from the store's views. The
//! JSON shape is defined here, not by the store's types, so that renaming a
//! store field cannot change the API.

use serde::Serialize;
use utoipa::ToSchema;

use super::history_entry::HistoryEntry;
use crate::domain::{Observation, SettlementFailureCode, SettlementSkipReason};
use crate::store;

/// Where a receipt stands, as seen at one instant of the server clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
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
    /// Finished by an operator, never to be settled (`cancel_reason` says why).
    Canceled,
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
    /// The rail's own code for the failure (e.g. `card_declined`), when the
    /// worker gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rail_code: Option<String>,
}

/// A receipt that failed for good and waits for an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
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

/// A receipt's full state. Never contains the lease token.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ReceiptView {
    pub receipt_id: String,
    /// Its group (docs/groups.md): `default` unless the producer named one.
    pub group: String,
    /// Its priority within the group (docs/groups.md, "Priorities"):
    /// -1000..=1000, higher first; 0 unless the producer gave one.
    #[schema(minimum = -1000, maximum = 1000)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// The last failure, once there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureView>,
    /// The rail's transcript id, once settled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_id: Option<String>,
    /// Why it needed no settlement, once skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_reason: Option<SettlementSkipReason>,
    /// The dead letter, while dead-lettered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetter>,
    /// Since when an operator holds the receipt (server ms): no claim takes
    /// it until it is unheld. A live lease on it may still report its outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_at_ms: Option<u64>,
    /// Why an operator canceled it, once canceled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    /// The producer's observation exactly as enqueued, or null.
    #[schema(value_type = Option<Observation>)]
    pub observation: Option<serde_json::Value>,
    /// Oldest first.
    pub history: Vec<HistoryEntry>,
}

impl From<store::ReceiptState> for ReceiptState {
    fn from(state: store::ReceiptState) -> Self {
        match state {
            store::ReceiptState::Pending => Self::Pending,
            store::ReceiptState::Leased => Self::Leased,
            store::ReceiptState::RetryScheduled => Self::RetryScheduled,
            store::ReceiptState::Settled => Self::Settled,
            store::ReceiptState::Skipped => Self::Skipped,
            store::ReceiptState::DeadLettered => Self::DeadLettered,
            store::ReceiptState::Canceled => Self::Canceled,
        }
    }
}

impl From<store::LeaseView> for LeaseView {
    fn from(lease: store::LeaseView) -> Self {
        let store::LeaseView { owner, until_ms } = lease;
        Self { owner, until_ms }
    }
}

impl From<store::FailureView> for FailureView {
    fn from(failure: store::FailureView) -> Self {
        let store::FailureView {
            code,
            detail_sha256,
            rail_code,
        } = failure;
        Self {
            code,
            detail_sha256,
            rail_code,
        }
    }
}

impl From<store::DeadLetter> for DeadLetter {
    fn from(letter: store::DeadLetter) -> Self {
        let store::DeadLetter {
            receipt_id,
            finalized_at,
            attempts,
            code,
            detail_sha256,
            last_failure,
            dead_lettered_at_ms,
            group,
        } = letter;
        Self {
            receipt_id,
            finalized_at,
            attempts,
            code,
            detail_sha256,
            last_failure: last_failure.into(),
            dead_lettered_at_ms,
            group,
        }
    }
}

impl From<store::ReceiptView> for ReceiptView {
    fn from(view: store::ReceiptView) -> Self {
        let store::ReceiptView {
            receipt_id,
            group,
            priority,
            finalized_at,
            state,
            attempts,
            row_version,
            next_visible_at_ms,
            lease,
            last_failure,
            transcript_id,
            skip_reason,
            dead_letter,
            held_at_ms,
            cancel_reason,
            observation,
            history,
        } = view;
        Self {
            receipt_id,
            group,
            priority,
            finalized_at,
            state: state.into(),
            attempts,
            row_version,
            next_visible_at_ms,
            lease: lease.map(Into::into),
            last_failure: last_failure.map(Into::into),
            transcript_id,
            skip_reason,
            dead_letter: dead_letter.map(Into::into),
            held_at_ms,
            cancel_reason,
            observation,
            history: history.into_iter().map(Into::into).collect(),
        }
    }
}
