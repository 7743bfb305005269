//! What a producer hands over to be stored, and what storing it did.

use crate::domain::{GroupName, Priority, ReceiptId, UnixMs};

/// A receipt as a producer hands it over, already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct NewReceipt {
    pub receipt_id: ReceiptId,
    /// Unix seconds, at most `i64::MAX`.
    pub finalized_at: u64,
    /// A JSON object, or `None` (same identity as an explicit null).
    pub observation: Option<serde_json::Value>,
    /// When it becomes due; `None` means now.
    pub visible_at_ms: Option<UnixMs>,
    /// Its group (part of its identity).
    pub group: GroupName,
    /// Its priority within the group (part of its identity).
    pub priority: Priority,
    /// The producer's trace context, handed to every claim of it (not part
    /// of its identity: the first one stored is kept).
    pub trace: Option<crate::domain::TraceContext>,
}

/// What enqueueing one receipt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Stored for the first time.
    Created,
    /// An identical receipt was already known; nothing changed.
    Existing,
    /// The id is known with a different `finalized_at` or observation; nothing changed.
    Conflict,
}
