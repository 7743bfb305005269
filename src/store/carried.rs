//! A worker's report and its next claim as one store call
//! (`POST /v1/claims` with `outcomes`): the outcomes are recorded first,
//! then the claim is made. PostgreSQL does both in one transaction where it
//! can (src/store/postgres/claim_batch.rs); any other store makes the two
//! calls one after the other, which [`one_after_the_other`] does.

use super::{DueClaims, SettlementOutcomeStore, StoreResult};
use crate::domain::{
    Claim, ClaimLimit, Claimed, GroupName, LeaseMs, Outcome, RetryPolicy, Route, UnixMs, WorkerId,
};

/// The claim a worker asks for (the arguments of `claim_from`).
#[derive(Debug, Clone, Copy)]
pub struct ClaimAsk<'a> {
    pub worker_id: &'a WorkerId,
    pub now_ms: UnixMs,
    pub lease_ms: LeaseMs,
    pub limit: ClaimLimit,
    pub only: &'a [GroupName],
}

/// What became of a report and its claim: the outcomes' results stand
/// whatever became of the claim.
#[derive(Debug, Clone)]
pub struct Reported {
    /// One per outcome, in order, as `record_claimed_outcomes` answers.
    pub results: Vec<StoreResult<Route>>,
    /// The claim, or why it failed after the outcomes were recorded.
    pub claimed: StoreResult<DueClaims<Claimed>>,
}

/// Record, then claim, as two calls: a claim that fails leaves the
/// recorded outcomes as they are.
pub async fn one_after_the_other<S: SettlementOutcomeStore + ?Sized>(
    store: &S,
    outcomes: &[(Claim, Outcome)],
    policy: RetryPolicy,
    ask: ClaimAsk<'_>,
) -> StoreResult<Reported> {
    let results = store
        .record_claimed_outcomes(outcomes, policy, ask.now_ms)
        .await?;
    let claimed = store
        .claim_from(ask.worker_id, ask.now_ms, ask.lease_ms, ask.limit, ask.only)
        .await;
    Ok(Reported { results, claimed })
}
