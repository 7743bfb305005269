//! Recording outcomes: each caller's outcomes go to the write queue, which
//! runs them with other callers' writes as one transaction (`writes`).

use super::PostgresStore;
use super::writes::Job;
use crate::domain::{Claim, Outcome, RetryPolicy, Route, UnixMs};
use crate::store::StoreResult;

impl PostgresStore {
    /// Bounded by the write queue itself, which gives up only before commit.
    pub(super) async fn record_outcomes(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        let job = Job::Outcomes {
            items: outcomes.to_vec(),
            policy,
            observed_at_ms,
        };
        self.primary.gate()?;
        self.watched(self.writes.run(job).await)?.into_routes()
    }
}
