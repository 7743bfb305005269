//! The queue at a glance (`GET /v1/status`), the groups (`GET /v1/groups`)
//! and the backend's name (`GET /v1/info`), as the API shows them.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

use super::receipt_view::ReceiptState;
use crate::store;

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

/// The queue at a glance.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth: Option<u64>,
    /// Live leases.
    pub leased: u64,
    /// How long the oldest due, unleased receipt has waited (ms); 0 when none.
    pub oldest_due_age_ms: u64,
}

/// Which database this server stores receipts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Sqlite,
    Postgres,
}

impl From<store::BackendKind> for BackendKind {
    fn from(kind: store::BackendKind) -> Self {
        match kind {
            store::BackendKind::Sqlite => Self::Sqlite,
            store::BackendKind::Postgres => Self::Postgres,
        }
    }
}

impl From<store::ReceiptSummary> for ReceiptSummary {
    fn from(summary: store::ReceiptSummary) -> Self {
        let store::ReceiptSummary {
            receipt_id,
            finalized_at,
            attempts,
        } = summary;
        Self {
            receipt_id,
            finalized_at,
            attempts,
        }
    }
}

impl From<store::StateSample> for StateSample {
    fn from(sample: store::StateSample) -> Self {
        let store::StateSample {
            total,
            returned,
            truncated,
            receipts,
        } = sample;
        Self {
            total,
            returned,
            truncated,
            receipts: receipts.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<store::StateCounts> for StateCounts {
    fn from(counts: store::StateCounts) -> Self {
        let store::StateCounts {
            pending,
            scheduled,
            held,
            leased,
            retry_scheduled,
            settled,
            skipped,
            dead_lettered,
            canceled,
        } = counts;
        Self {
            pending,
            scheduled,
            held,
            leased,
            retry_scheduled,
            settled,
            skipped,
            dead_lettered,
            canceled,
        }
    }
}

impl From<store::StatusView> for StatusView {
    fn from(status: store::StatusView) -> Self {
        let store::StatusView {
            counts,
            oldest_due_age_ms,
            samples,
            groups,
        } = status;
        Self {
            counts: counts.into(),
            oldest_due_age_ms,
            samples: samples
                .into_iter()
                .map(|(state, sample)| (state.into(), sample.into()))
                .collect(),
            groups: groups.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<store::GroupView> for GroupView {
    fn from(group: store::GroupView) -> Self {
        let store::GroupView {
            group,
            paused,
            max_leased,
            rate,
            depth,
            leased,
            oldest_due_age_ms,
        } = group;
        Self {
            group,
            paused,
            max_leased,
            rate,
            depth,
            leased,
            oldest_due_age_ms,
        }
    }
}
