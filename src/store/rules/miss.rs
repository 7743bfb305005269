//! When a guarded write matched no row: the row's standing as the refusal
//! rules (`domain::refusal`) see it, and the conflict each claim is told.

use super::super::Status;
use super::super::rows::{ReceiptRow, to_u63};
use crate::domain::{self, Claim, Outcome, Route, Standing, StoreError, U63, UnixMs};
use crate::store::StoreResult;

impl ReceiptRow {
    /// The row as the refusal rules see it.
    pub fn standing(&self) -> StoreResult<Standing> {
        Ok(match self.status {
            Status::DeadLettered => {
                let letter = self
                    .dead_letter()?
                    .ok_or_else(|| StoreError::invalid_record("dead letter"))?;
                Standing::DeadLettered {
                    failure: domain::SettlementFailureReason {
                        code: letter.code,
                        detail_sha256: letter.detail_sha256,
                        rail_code: letter
                            .last_failure
                            .rail_code
                            .as_deref()
                            .map(domain::RailCode::parse)
                            .transpose()
                            .map_err(|_| StoreError::invalid_record("rail code"))?,
                    },
                    finalized_at: to_u63(self.finalized_at, "finalized_at")?,
                    attempts: letter.attempts,
                    row_version: to_u63(self.row_version, "row_version")?,
                }
            }
            finished @ (Status::Settled | Status::Skipped | Status::Canceled) => {
                Standing::Finished(finished.as_str())
            }
            Status::Active => Standing::Active {
                lease: self.lease()?,
            },
        })
    }
}

fn standing(row: Option<&ReceiptRow>) -> StoreResult<Standing> {
    row.map_or(Ok(Standing::Unknown), ReceiptRow::standing)
}

/// Why `claim`'s guarded write matched no row (`domain::refusal`), or the
/// route already recorded when `replay` repeats the dead-lettering outcome.
pub fn explain_miss(
    row: Option<&ReceiptRow>,
    claim: &Claim,
    replay: Option<&Outcome>,
    observed_at_ms: UnixMs,
) -> StoreResult<Route> {
    let at = U63::from(observed_at_ms);
    domain::refusal(&standing(row)?, claim, replay, at)
        .map_err(|refusal| StoreError::conflict(refusal.kind, refusal.detail))
}

/// A claim that no longer matches its row, said without reading the row.
pub fn mismatch() -> StoreError {
    StoreError::conflict(
        domain::ConflictKind::LeaseMismatch,
        "claim does not match the persisted row",
    )
}

/// The row changed between the claim's read and its write.
pub fn changed_while_claimed() -> StoreError {
    StoreError::conflict(
        domain::ConflictKind::LeaseMismatch,
        "row changed while being claimed",
    )
}

/// An outcome that could not be planned (`refusal`, e.g. an attempt count
/// that would overflow): the claim that still holds its receipt is told
/// that; any other claim is told why it no longer holds it, as if it had
/// been planned and its write had missed.
pub fn refused_plan(
    row: Option<&ReceiptRow>,
    claim: &Claim,
    refusal: StoreError,
    observed_at_ms: UnixMs,
) -> StoreError {
    let at = U63::from(observed_at_ms);
    let Ok(standing) = standing(row) else {
        return refusal;
    };
    if domain::holds(&standing, claim, at) {
        return refusal;
    }
    match domain::refusal(&standing, claim, None, at) {
        Err(conflict) => StoreError::conflict(conflict.kind, conflict.detail),
        Ok(_) => refusal,
    }
}
