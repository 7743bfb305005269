//! `/v1/status` assembled from what each backend reads: counts per state
//! from the per-state counters, and a sample of each state's receipts.

use super::rows::{to_u32, to_u64};
use super::{ReceiptState, ReceiptSummary, StateCounts, StateSample, StatusView, StoreResult};
use crate::domain::StoreError;

/// One sampled receipt: `(receipt_id, finalized_at, attempts)`.
pub type SampleRow = (String, i64, i64);

/// The committed buckets kept by the counting triggers: `(fresh, retried,
/// settled, skipped, dead_lettered, canceled)`, where fresh and retried are
/// the active rows with no attempt yet and with some.
pub type Buckets = (i64, i64, i64, i64, i64, i64);

/// Per-state counts from the buckets and the leases live at the moment
/// asked, `(all, those on fresh rows)`: a leased row stays in its bucket, so
/// pending and retry_scheduled are their bucket less its live leases.
pub fn state_counts(buckets: Buckets, live: (i64, i64)) -> StoreResult<Vec<(String, i64)>> {
    let (fresh, retried, settled, skipped, dead_lettered, canceled) = buckets;
    let (live_all, live_fresh) = live;
    let counts = [
        ("pending", fresh - live_fresh),
        ("leased", live_all),
        ("retry_scheduled", retried - (live_all - live_fresh)),
        ("settled", settled),
        ("skipped", skipped),
        ("dead_lettered", dead_lettered),
        ("canceled", canceled),
    ];
    // A negative count means the counters disagree with the rows.
    if counts.iter().any(|(_, n)| *n < 0) {
        return Err(StoreError::invalid_record("stored receipt counters"));
    }
    Ok(counts
        .into_iter()
        .map(|(state, n)| (state.to_owned(), n))
        .collect())
}

/// Assemble `/v1/status` from per-state counts, the pending receipts not
/// yet visible, the receipts held, the oldest due time and per-state
/// samples (each already limited to `limit` rows).
pub fn build_status(
    now: i64,
    counted: Vec<(String, i64)>,
    scheduled: i64,
    held: i64,
    oldest_due_ms: Option<i64>,
    samples: Vec<(ReceiptState, Vec<SampleRow>)>,
) -> StoreResult<StatusView> {
    let mut counts = StateCounts::default();
    for (label, n) in counted {
        let state = ReceiptState::ALL
            .into_iter()
            .find(|s| s.as_str() == label)
            .ok_or_else(|| StoreError::invalid_record("stored status"))?;
        counts.add(state, to_u64(n, "count")?);
    }
    counts.scheduled = to_u64(scheduled, "scheduled")?;
    counts.held = to_u64(held, "held")?;
    let oldest_due_age_ms =
        oldest_due_ms.map_or(Ok(0), |t| to_u64(now.saturating_sub(t).max(0), "age"))?;
    let mut out = std::collections::BTreeMap::new();
    for (state, rows) in samples {
        let receipts = rows
            .into_iter()
            .map(|(receipt_id, finalized_at, attempts)| {
                Ok(ReceiptSummary {
                    receipt_id,
                    finalized_at: to_u64(finalized_at, "finalized_at")?,
                    attempts: to_u32(attempts, "attempts")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        let total = counts.get(state);
        let returned = receipts.len() as u64;
        out.insert(
            state,
            StateSample {
                total,
                returned,
                truncated: total > returned,
                receipts,
            },
        );
    }
    Ok(StatusView {
        counts,
        oldest_due_age_ms,
        samples: out,
        groups: Vec::new(),
    })
}
