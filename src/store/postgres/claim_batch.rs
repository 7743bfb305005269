//! Batch claims as the claim queue runs them: one worker's claim in a
//! transaction of its own, or several workers' claims of the same groups
//! merged into one statement.

use sqlx::PgPool;

use super::claim::lease_due;
use super::{Tx, begin_claim, finish};
use crate::domain::{Claimed, GroupName, StoreError, WorkerId};
use crate::store::StoreResult;
use crate::store::fair::{DueClaims, Turn};

async fn claim_batch(tx: &mut Tx, job: &ClaimJob) -> StoreResult<DueClaims<Claimed>> {
    let slots = vec![(job.worker_id.as_str(), job.until); job.limit];
    lease_due(tx, &slots, job.now, &job.only, &job.turn).await
}

/// One worker's batch claim, as the claim queue carries it.
pub(super) struct ClaimJob {
    pub worker_id: WorkerId,
    pub now: i64,
    pub until: i64,
    pub limit: usize,
    pub only: Vec<GroupName>,
    pub turn: Turn,
}

impl super::batcher::Mergeable for ClaimJob {
    type Answer = DueClaims<Claimed>;

    fn size(&self) -> usize {
        self.limit.max(1)
    }

    fn run(
        pool: &PgPool,
        jobs: &[Self],
    ) -> impl Future<Output = (Vec<StoreResult<Self::Answer>>, bool)> + Send {
        claim_jobs(pool, jobs)
    }
}

/// One claim in a transaction of its own: all or nothing.
async fn claim_alone(pool: &PgPool, job: &ClaimJob) -> StoreResult<DueClaims<Claimed>> {
    let mut tx = begin_claim(pool).await?;
    let result = claim_batch(&mut tx, job).await;
    finish(tx, result).await
}

/// Several workers' claims in one statement and transaction, served in
/// arrival order: the first takes the first rows of the round robin up to
/// its limit, the next the following ones. Due is judged at the earliest
/// of their clocks (they arrived together), so a later one may get fewer
/// rows than are due by its own clock, as a claim that meets locked rows
/// may. Only claims of the same groups are merged. A refusal (a stored row
/// out of range) runs each claim alone, so that only the claims that meet
/// the row fail.
async fn claim_jobs(
    pool: &PgPool,
    jobs: &[ClaimJob],
) -> (Vec<StoreResult<DueClaims<Claimed>>>, bool) {
    let alone = jobs.len() == 1 || jobs.iter().any(|j| j.only != jobs[0].only);
    if !alone {
        match claim_merged(pool, jobs).await {
            Ok(Some(answers)) => return (answers.into_iter().map(Ok).collect(), false),
            Ok(None) => {}
            Err(e) => return (jobs.iter().map(|_| Err(e.clone())).collect(), false),
        }
    }
    let mut answers = Vec::with_capacity(jobs.len());
    for job in jobs {
        answers.push(claim_alone(pool, job).await);
    }
    (answers, false)
}

/// `Ok(None)`: refused, and rolled back; run each claim alone.
async fn claim_merged(
    pool: &PgPool,
    jobs: &[ClaimJob],
) -> StoreResult<Option<Vec<DueClaims<Claimed>>>> {
    let now = jobs.iter().map(|j| j.now).min().unwrap_or_default();
    let slots: Vec<(&str, i64)> = jobs
        .iter()
        .flat_map(|j| std::iter::repeat_n((j.worker_id.as_str(), j.until), j.limit))
        .collect();
    let mut tx = begin_claim(pool).await?;
    let due = match lease_due(&mut tx, &slots, now, &jobs[0].only, &jobs[0].turn).await {
        Ok(due) => due,
        Err(e @ StoreError::Backend { .. }) => return finish(tx, Err(e)).await,
        Err(_) => {
            tx.rollback().await?;
            return Ok(None);
        }
    };
    super::commit(tx).await?;
    let mut claims = due.claims.into_iter();
    Ok(Some(
        jobs.iter()
            .map(|j| {
                let mine: Vec<_> = claims.by_ref().take(j.limit).collect();
                let short = mine.len() < j.limit;
                DueClaims {
                    claims: mine,
                    look_again_ms: due.look_again_ms.filter(|_| short),
                    held_back: due.held_back && short,
                }
            })
            .collect(),
    ))
}
