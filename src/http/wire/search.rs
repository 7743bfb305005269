//! Finding receipts (`GET /v1/receipts`) as the API names it: the state
//! filter and the order it reads, and a receipt as a search shows it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::receipt_view::{FailureView, LeaseView, ReceiptState};
use crate::store;

/// Which receipts a state filter selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StateFilter {
    /// Never attempted and not leased: due now or scheduled for later (as
    /// `pending` in `/v1/status`).
    Pending,
    /// The `pending` receipts not due yet (`next_visible_at_ms` ahead).
    Scheduled,
    /// Held by a live lease.
    Leased,
    /// Failed at least once, not leased, waiting for the next attempt.
    RetryScheduled,
    Settled,
    Skipped,
    DeadLettered,
    /// Canceled by an operator.
    Canceled,
}

/// Page order by `(finalized_at, receipt_id)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SearchOrder {
    /// Latest `finalized_at` first (ties: greatest id first).
    #[default]
    Newest,
    /// Earliest `finalized_at` first (ties: smallest id first).
    Oldest,
}

/// A receipt as a search returns it (never its lease token or observation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FoundReceipt {
    pub receipt_id: String,
    /// Its group (docs/groups.md).
    pub group: String,
    /// Its priority within the group.
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: i64,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: u64,
    pub state: ReceiptState,
    /// As in a receipt's view.
    pub attempts: u32,
    /// When the receipt is next due (server ms); null once finished.
    pub next_visible_at_ms: Option<u64>,
    /// The live lease, while one holds the receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// The last failure, once there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureView>,
    /// When it finished (settled, skipped, dead-lettered or canceled), server ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// Since when an operator holds it (server ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_at_ms: Option<u64>,
}

impl From<StateFilter> for store::search::StateFilter {
    fn from(state: StateFilter) -> Self {
        match state {
            StateFilter::Pending => Self::Pending,
            StateFilter::Scheduled => Self::Scheduled,
            StateFilter::Leased => Self::Leased,
            StateFilter::RetryScheduled => Self::RetryScheduled,
            StateFilter::Settled => Self::Settled,
            StateFilter::Skipped => Self::Skipped,
            StateFilter::DeadLettered => Self::DeadLettered,
            StateFilter::Canceled => Self::Canceled,
        }
    }
}

impl From<SearchOrder> for store::SearchOrder {
    fn from(order: SearchOrder) -> Self {
        match order {
            SearchOrder::Newest => Self::Newest,
            SearchOrder::Oldest => Self::Oldest,
        }
    }
}

impl From<store::search::FoundReceipt> for FoundReceipt {
    fn from(found: store::search::FoundReceipt) -> Self {
        let store::search::FoundReceipt {
            receipt_id,
            group,
            priority,
            finalized_at,
            state,
            attempts,
            next_visible_at_ms,
            lease,
            last_failure,
            finished_at_ms,
            held_at_ms,
        } = found;
        Self {
            receipt_id,
            group,
            priority,
            finalized_at,
            state: state.into(),
            attempts,
            next_visible_at_ms,
            lease: lease.map(Into::into),
            last_failure: last_failure.map(Into::into),
            finished_at_ms,
            held_at_ms,
        }
    }
}
