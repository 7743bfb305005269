//! Batches: their size, and their items parsed one by one so that one bad
//! item does not refuse the rest.

use serde_json::Value;
use serde_json::value::RawValue;

use super::MAX_BATCH_ITEMS;
use crate::http::error::{ApiError, ProblemCode};

/// Check a batch's size.
pub fn check_batch_len(len: usize) -> Result<(), ApiError> {
    if len == 0 || len > MAX_BATCH_ITEMS {
        return Err(ApiError::validation(
            ProblemCode::BatchSize,
            "a batch holds 1..=1024 items",
        ));
    }
    Ok(())
}

/// Parse one batch item on its own, so one bad item does not refuse the
/// rest. Items are read from the text sent (not from a parsed value), so
/// duplicate keys are still seen and numbers keep their exact text.
pub fn parse_item<T: serde::de::DeserializeOwned>(item: &RawValue) -> Result<T, ApiError> {
    serde_json::from_str(item.get()).map_err(|e| {
        if e.is_syntax() || e.is_eof() {
            // Too deeply nested: the batch parses around it, the item does not.
            ApiError::malformed(e.to_string())
        } else {
            ApiError::validation(ProblemCode::InvalidBody, e.to_string())
        }
    })
}

/// The `receipt_id` of a batch item that could not be parsed, when it has a
/// usable one.
#[must_use]
pub fn item_receipt_id(item: &RawValue, path: &[&str]) -> Option<String> {
    let item: Value = serde_json::from_str(item.get()).ok()?;
    let mut at = &item;
    for key in path {
        at = at.get(key)?;
    }
    at.as_str().map(str::to_owned)
}
