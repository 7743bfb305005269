//! Extending and releasing leases: through the write queue, merged with
//! other callers' outcomes (`writes`).

use super::PostgresStore;
use super::writes::{Answer, Job};
use crate::domain::{Claim, Claimed, LeaseMs, StoreError, UnixMs};
use crate::store::StoreResult;

impl PostgresStore {
    pub(super) async fn extend_claim(
        &self,
        claim: &Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    ) -> StoreResult<Claimed> {
        let job = Job::Extend {
            claim: claim.clone(),
            extend_ms,
            now_ms,
        };
        self.primary.gate()?;
        match self.watched(self.writes.run(job).await)? {
            Answer::Extend(extended) => self.watched(extended),
            _ => Err(StoreError::internal("an answer of the wrong kind")),
        }
    }

    pub(super) async fn release_claim(&self, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
        let job = Job::Release {
            claim: claim.clone(),
            now_ms,
        };
        self.primary.gate()?;
        match self.watched(self.writes.run(job).await)? {
            Answer::Release(released) => self.watched(released),
            _ => Err(StoreError::internal("an answer of the wrong kind")),
        }
    }
}
