//! The API's bodies: requests as they arrive and their parsing into domain
//! values (everything a handler passes to the store has been checked here),
//! and the answers built from the store's views.

mod batch;
mod claim;
mod feed;
mod history_entry;
mod outcome;
mod rates;
mod receipt_in;
mod receipt_view;
mod search;
mod status;

pub use batch::{check_batch_len, item_receipt_id, parse_item};
pub use claim::{ClaimBody, parse_claim};
pub use feed::FeedEntry;
pub use history_entry::{HistoryEntry, HistoryOutcome, RouteKind};
pub use outcome::{OutcomeIn, OutcomeRequest, OutcomeResult};
pub use rates::StatsCounts;
pub use receipt_in::{ReceiptIn, header_trace};
pub use receipt_view::{DeadLetter, FailureView, LeaseView, ReceiptState, ReceiptView};
pub use search::{FoundReceipt, SearchOrder, StateFilter};
pub use status::{BackendKind, GroupView, ReceiptSummary, StateCounts, StateSample, StatusView};

use crate::domain::{GroupName, Priority, RailCode, ReceiptId, WorkerId};
use crate::http::error::{ApiError, ProblemCode};

/// Largest serialized observation, in bytes.
pub const MAX_OBSERVATION_BYTES: usize = 64 * 1024;
/// Largest request body, in bytes.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Most items in one batch request.
pub const MAX_BATCH_ITEMS: usize = 1024;
/// Longest long-poll wait, in ms.
pub const MAX_WAIT_MS: u64 = 20_000;

fn fits_i64(value: u64) -> bool {
    i64::try_from(value).is_ok()
}

/// A receipt id from a path or body.
pub fn parse_receipt_id(value: &str) -> Result<ReceiptId, ApiError> {
    ReceiptId::parse(value)
        .map_err(|e| ApiError::bad_id(ProblemCode::InvalidReceiptId, "receipt_id", e))
}

/// A priority from a body or a query.
pub fn parse_priority(value: i64) -> Result<Priority, ApiError> {
    Priority::parse(value)
        .map_err(|e| ApiError::validation(ProblemCode::InvalidPriority, e.to_string()))
}

/// A group name from a path, a query or a body.
pub fn parse_group(value: &str) -> Result<GroupName, ApiError> {
    GroupName::parse(value)
        .map_err(|e| ApiError::validation(ProblemCode::InvalidGroup, e.to_string()))
}

/// A rail code (`domain::RailCode`).
pub fn parse_rail_code(value: &str) -> Result<RailCode, ApiError> {
    RailCode::parse(value)
        .map_err(|e| ApiError::validation(ProblemCode::InvalidRailCode, e.to_string()))
}

/// A worker id: 1..=128 bytes, and no control characters.
pub fn parse_worker_id(value: &str) -> Result<WorkerId, ApiError> {
    Ok(WorkerId::parse(value)?)
}
