//! Batch claims as the claim queue runs them: the claims of the same groups
//! merged into one statement, in one transaction with the outcomes their
//! workers sent along (`POST /v1/claims` with `outcomes`, src/store/carried.rs);
//! claims of different groups, or a group the database refused, one by one.

use std::sync::Arc;

use sqlx::PgPool;

use super::claim::lease_due;
use super::kept::Kept;
use super::writes::{self, Answer, Job};
use super::{Tx, begin_claim, finish};
use crate::domain::{BackendFault, Claimed, GroupName, StoreError, WorkerId};
use crate::store::StoreResult;
use crate::store::carried::Reported;
use crate::store::fair::{DueClaims, Turn};

/// What the claims of one replica share.
pub(super) struct Claiming {
    /// Where this replica's next claim's turn over the groups starts after.
    pub turn: Turn,
    /// The claim queue's connection, kept while requests wait.
    pub kept: Arc<Kept>,
}

async fn claim_batch(tx: &mut Tx, job: &ClaimJob, turn: &Turn) -> StoreResult<DueClaims<Claimed>> {
    let slots = vec![(job.worker_id.as_str(), job.until); job.limit];
    lease_due(tx, &slots, job.now, &job.only, turn).await
}

/// One worker's batch claim, as the claim queue carries it.
pub(super) struct ClaimJob {
    pub worker_id: WorkerId,
    pub now: i64,
    pub until: i64,
    pub limit: usize,
    pub only: Vec<GroupName>,
    /// The outcomes sent along (a [`Job::Outcomes`]), recorded before the claim.
    pub carried: Option<Job>,
}

impl super::batcher::Mergeable for ClaimJob {
    type Answer = Reported;
    type Shared = Claiming;

    fn size(&self) -> usize {
        self.limit.max(1)
            + self
                .carried
                .as_ref()
                .map_or(0, super::batcher::Mergeable::size)
    }

    fn run(
        pool: &PgPool,
        claiming: &Arc<Claiming>,
        jobs: &[Self],
    ) -> impl Future<Output = (Vec<StoreResult<Self::Answer>>, bool)> + Send {
        claim_jobs(pool, claiming, jobs)
    }
}

/// The answers in job order, and whether the outcomes made work due.
type Answers = (Vec<StoreResult<Reported>>, bool);

/// Merged when every claim names the same groups; one by one otherwise, or
/// when the database refused something of the merged transaction, so that
/// only the claims and outcomes that meet it fail.
async fn claim_jobs(pool: &PgPool, claiming: &Claiming, jobs: &[ClaimJob]) -> Answers {
    if jobs.iter().all(|j| j.only == jobs[0].only) {
        let mut merged = claim_merged(pool, claiming, jobs).await;
        // A kept transaction whose connection the server ended since (its
        // connections terminated, say): nothing of it was committed, so the
        // group runs again on a connection from the pool.
        if let Err((
            StoreError::Backend {
                fault: BackendFault::Connection,
                ..
            },
            true,
        )) = merged
        {
            merged = claim_merged(pool, claiming, jobs).await;
        }
        match merged {
            Ok(Some(answers)) => return answers,
            Ok(None) => {}
            Err((e, _)) => return (jobs.iter().map(|_| Err(e.clone())).collect(), false),
        }
    }
    one_by_one(pool, &claiming.turn, jobs).await
}

/// One claim in a transaction of its own: all or nothing.
async fn claim_alone(
    pool: &PgPool,
    job: &ClaimJob,
    turn: &Turn,
) -> StoreResult<DueClaims<Claimed>> {
    let mut tx = begin_claim(pool).await?;
    let result = claim_batch(&mut tx, job, turn).await;
    finish(tx, result).await
}

/// The outcomes sent along recorded first, as the write queue records them
/// (a refused item fails alone), then each claim in a transaction of its
/// own. A claim whose outcomes could not be recorded is not made.
async fn one_by_one(pool: &PgPool, turn: &Turn, jobs: &[ClaimJob]) -> Answers {
    let carried: Vec<&Job> = jobs.iter().filter_map(|j| j.carried.as_ref()).collect();
    let (recorded, wakes) = if carried.is_empty() {
        (Vec::new(), false)
    } else {
        writes::run_jobs(pool, None, &carried).await
    };
    let mut recorded = recorded.into_iter();
    let mut answers = Vec::with_capacity(jobs.len());
    for job in jobs {
        let results = match job.carried {
            None => Vec::new(),
            Some(_) => match recorded.next().map(|r| r.and_then(Answer::into_routes)) {
                Some(Ok(results)) => results,
                Some(Err(e)) => {
                    answers.push(Err(e));
                    continue;
                }
                None => {
                    answers.push(Err(StoreError::internal("outcomes left unanswered")));
                    continue;
                }
            },
        };
        let claimed = claim_alone(pool, job, turn).await;
        answers.push(Ok(Reported { results, claimed }));
    }
    (answers, wakes)
}

/// The outcomes sent along, then several workers' claims in one statement,
/// in one transaction: one commit for a worker's report and its next claim.
/// Claims are served in arrival order: the first takes the first rows of
/// the round robin up to its limit, the next the following ones. Due is
/// judged at the earliest of their clocks (they arrived together), so a
/// later one may get fewer rows than are due by its own clock, as a claim
/// that meets locked rows may. `Ok(None)`: the database refused a write or
/// a stored row, and everything was rolled back. An error comes with
/// whether it met a kept transaction before its commit was sent.
async fn claim_merged(
    pool: &PgPool,
    claiming: &Claiming,
    jobs: &[ClaimJob],
) -> Result<Option<Answers>, (StoreError, bool)> {
    let now = jobs.iter().map(|j| j.now).min().unwrap_or_default();
    let slots: Vec<(&str, i64)> = jobs
        .iter()
        .flat_map(|j| std::iter::repeat_n((j.worker_id.as_str(), j.until), j.limit))
        .collect();
    let carried: Vec<&Job> = jobs.iter().filter_map(|j| j.carried.as_ref()).collect();
    let kept = &claiming.kept;
    let mut tx = kept.begin(pool).await.map_err(|e| (e, false))?;
    let reused = tx.reused();
    let early = |e| (e, reused);
    let (recorded, wakes) = if carried.is_empty() {
        (Vec::new(), false)
    } else {
        match writes::run_in(&mut tx, &carried).await {
            Ok(Some(done)) => done,
            Ok(None) => {
                Kept::rollback(tx).await.map_err(early)?;
                return Ok(None);
            }
            Err(e) => return kept.finish(tx, Err(e)).await.map_err(early),
        }
    };
    let recorded = match recorded
        .into_iter()
        .map(Answer::into_routes)
        .collect::<StoreResult<Vec<_>>>()
    {
        Ok(recorded) if recorded.len() == carried.len() => recorded,
        Ok(_) => {
            let unanswered = StoreError::internal("outcomes left unanswered");
            return kept.finish(tx, Err(unanswered)).await.map_err(early);
        }
        Err(e) => return kept.finish(tx, Err(e)).await.map_err(early),
    };
    let due = match lease_due(&mut tx, &slots, now, &jobs[0].only, &claiming.turn).await {
        Ok(due) => due,
        // A claim the server failed (a time limit, a lock it gave up on)
        // must not take the outcomes with it: they are recorded alone.
        Err(StoreError::Backend {
            fault: BackendFault::Answered,
            ..
        }) if !carried.is_empty() => {
            Kept::rollback(tx).await.map_err(early)?;
            return Ok(None);
        }
        Err(e @ StoreError::Backend { .. }) => {
            return kept.finish(tx, Err(e)).await.map_err(early);
        }
        Err(_) => {
            Kept::rollback(tx).await.map_err(early)?;
            return Ok(None);
        }
    };
    // Past here the commit was sent: its failure is the group's answer.
    kept.commit(tx).await.map_err(|e| (e, false))?;
    let mut recorded = recorded.into_iter();
    let mut claims = due.claims.into_iter();
    let answers = jobs
        .iter()
        .map(|j| {
            let mine: Vec<_> = claims.by_ref().take(j.limit).collect();
            let short = mine.len() < j.limit;
            // As many as carried, checked before the commit.
            let results = match j.carried {
                Some(_) => recorded.next().unwrap_or_default(),
                None => Vec::new(),
            };
            Ok(Reported {
                results,
                claimed: Ok(DueClaims {
                    claims: mine,
                    look_again_ms: due.look_again_ms.filter(|_| short),
                    held_back: due.held_back && short,
                }),
            })
        })
        .collect();
    Ok(Some((answers, wakes)))
}
