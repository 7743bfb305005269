//! One entry of a receipt's history as the API shows it (in a receipt, and
//! in the history feed), and the labels it documents.

use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::{SettlementFailureCode, SettlementSkipReason};
use crate::store;

/// One entry of a receipt's history: an outcome a worker reported, a lease
/// a worker gave back, or an operator's redrive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct HistoryEntry {
    /// For an outcome: which invocation of the receipt it reports, counted
    /// from 1 (the claim's `attempts` + 1). The first try is `attempt` 1; a
    /// success after one retry is `attempt` 2 while the receipt says
    /// `attempts: 1` (one failure). For `released` and `redrive`: the
    /// receipt's `attempts` at that moment. A redrive starts the count again.
    pub attempt: u32,
    #[schema(value_type = HistoryOutcome)]
    pub outcome: String,
    /// The failure code of a `retryable` or `permanent` outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<SettlementFailureCode>,
    /// SHA-256 (hex) of a failure's `detail` text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail_sha256: Option<String>,
    /// The rail's own code for a failure (e.g. `card_declined`), when the
    /// worker gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rail_code: Option<String>,
    /// The rail's transcript id of an `accepted` outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transcript_id: Option<String>,
    /// Why a `skipped` outcome needed no settlement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<SettlementSkipReason>,
    /// The worker that reported it, or `operator`.
    pub worker_id: String,
    /// When the server recorded it (server ms).
    pub observed_at_ms: u64,
    /// What the server did with an outcome; absent for releases and redrives.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<RouteKind>)]
    pub route: Option<String>,
    /// The name of the operator's token, for an operator's action taken
    /// with a named token (`--token operator:NAME:TOKEN`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The reason an operator gave for a `hold` or a `cancel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The rail's own wait a `retryable` outcome carried (`retry_after_ms`),
    /// as the worker reported it; the retry's wait is the longer of it and
    /// the backoff, at most the policy's `backoff_cap_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// What a history entry records: the outcome a worker reported (`accepted`,
/// `skipped`, `retryable`, `permanent`), a lease it gave back (`released`),
/// or an operator's action (`redrive`, `hold`, `unhold`, `cancel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
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

/// What the server did with an outcome: `no_action` (finished: settled or
/// skipped), `retry_scheduled` (due again after a backoff) or
/// `dead_lettered` (failed for good).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RouteKind {
    NoAction,
    RetryScheduled,
    DeadLettered,
}

impl From<store::HistoryEntry> for HistoryEntry {
    fn from(entry: store::HistoryEntry) -> Self {
        let store::HistoryEntry {
            attempt,
            outcome,
            code,
            detail_sha256,
            rail_code,
            transcript_id,
            reason,
            worker_id,
            observed_at_ms,
            route,
            actor,
            note,
            retry_after_ms,
        } = entry;
        Self {
            attempt,
            outcome,
            code,
            detail_sha256,
            rail_code,
            transcript_id,
            reason,
            worker_id,
            observed_at_ms,
            route,
            actor,
            note,
            retry_after_ms,
        }
    }
}

impl From<store::HistoryOutcome> for HistoryOutcome {
    fn from(outcome: store::HistoryOutcome) -> Self {
        match outcome {
            store::HistoryOutcome::Accepted => Self::Accepted,
            store::HistoryOutcome::Skipped => Self::Skipped,
            store::HistoryOutcome::Retryable => Self::Retryable,
            store::HistoryOutcome::Permanent => Self::Permanent,
            store::HistoryOutcome::Released => Self::Released,
            store::HistoryOutcome::Redrive => Self::Redrive,
            store::HistoryOutcome::Hold => Self::Hold,
            store::HistoryOutcome::Unhold => Self::Unhold,
            store::HistoryOutcome::Cancel => Self::Cancel,
        }
    }
}

impl From<store::RouteKind> for RouteKind {
    fn from(kind: store::RouteKind) -> Self {
        match kind {
            store::RouteKind::NoAction => Self::NoAction,
            store::RouteKind::RetryScheduled => Self::RetryScheduled,
            store::RouteKind::DeadLettered => Self::DeadLettered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label<T: Serialize>(value: T) -> serde_json::Value {
        serde_json::to_value(value).unwrap()
    }

    /// History entries carry the store's labels as text: the documented
    /// enums must spell each one as the store does (the store's own test
    /// checks that its enums name every label it writes).
    #[test]
    fn documented_history_labels_are_the_stores() {
        for outcome in store::HistoryOutcome::ALL {
            assert_eq!(label(HistoryOutcome::from(outcome)), label(outcome));
        }
        for kind in store::RouteKind::ALL {
            assert_eq!(label(RouteKind::from(kind)), label(kind));
        }
    }
}
