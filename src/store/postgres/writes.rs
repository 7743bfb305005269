//! Outcomes, extensions and releases of one or several callers, run as one
//! transaction with a constant number of statements: per round, one guarded
//! write of every outcome and release, one of every extension, and one read
//! of the rows that missed, each of which is then explained by the shared
//! rules. The answers are those of running the callers one after another,
//! each item in its order.

use std::sync::Arc;

use sqlx::{PgConnection, PgPool};

use super::super::rules;
use super::careful;
use super::kept::Kept;
use super::write_round::{UnitAnswer, run_round, units};
use super::{begin, finish};
use crate::domain::{Claim, Claimed, LeaseMs, Outcome, RetryPolicy, Route, StoreError, UnixMs};
use crate::store::StoreResult;

/// One caller's write request.
#[derive(Debug, Clone)]
pub(super) enum Job {
    Outcomes {
        items: Vec<(Claim, Outcome)>,
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    },
    Extend {
        claim: Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    },
    Release {
        claim: Claim,
        now_ms: UnixMs,
    },
}

/// The answer to a [`Job`], as the store call returns it.
#[derive(Debug, Clone)]
pub(super) enum Answer {
    Outcomes(Vec<StoreResult<Route>>),
    Extend(StoreResult<Claimed>),
    Release(StoreResult<()>),
}

impl super::batcher::Mergeable for Job {
    type Answer = Answer;
    type Shared = Kept;

    fn size(&self) -> usize {
        match self {
            Self::Outcomes { items, .. } => items.len().max(1),
            Self::Extend { .. } | Self::Release { .. } => 1,
        }
    }

    async fn run(
        pool: &PgPool,
        kept: &Arc<Kept>,
        jobs: &[Self],
    ) -> (Vec<StoreResult<Answer>>, bool) {
        let jobs: Vec<&Self> = jobs.iter().collect();
        run_jobs(pool, Some(kept), &jobs).await
    }
}

impl Answer {
    /// The routes of an answer to outcomes.
    pub fn into_routes(self) -> StoreResult<Vec<StoreResult<Route>>> {
        match self {
            Self::Outcomes(routes) => Ok(routes),
            _ => Err(StoreError::internal("an answer of the wrong kind")),
        }
    }
}

impl Job {
    fn empty_answer(&self) -> Answer {
        match self {
            Self::Outcomes { .. } => Answer::Outcomes(Vec::new()),
            Self::Extend { .. } => Answer::Extend(Err(StoreError::internal("no answer"))),
            Self::Release { .. } => Answer::Release(Err(StoreError::internal("no answer"))),
        }
    }
}

/// Run a group in `tx`; `Ok(None)` when the database refused a write.
/// The jobs are borrowed: a claim's outcomes run in its own transaction
/// without being copied out of its job.
pub(super) async fn run_in(
    conn: &mut PgConnection,
    jobs: &[&Job],
) -> StoreResult<Option<(Vec<Answer>, bool)>> {
    let units = units(jobs);
    let mut answers: Vec<Option<UnitAnswer>> = vec![None; units.len()];
    for round in rules::rounds(units.iter().map(|u| u.claim.receipt_id.as_str())) {
        if !run_round(conn, &units, &round, &mut answers).await? {
            return Ok(None);
        }
    }
    let wakes = answers.iter().flatten().any(UnitAnswer::wakes);
    let mut out: Vec<Answer> = jobs.iter().map(|j| j.empty_answer()).collect();
    for (unit, answer) in units.iter().zip(answers) {
        let answer = answer.ok_or_else(|| StoreError::internal("an item was left unanswered"))?;
        match (&mut out[unit.job], answer) {
            (Answer::Outcomes(routes), UnitAnswer::Route(route)) => routes.push(route),
            (Answer::Extend(slot), UnitAnswer::Extended(extended)) => *slot = extended,
            (Answer::Release(slot), UnitAnswer::Released(released)) => *slot = released,
            _ => return Err(StoreError::internal("an answer of the wrong kind")),
        }
    }
    Ok(Some((out, wakes)))
}

/// Each job alone, item by item, in its own transaction.
async fn run_carefully(pool: &PgPool, jobs: &[&Job]) -> Vec<StoreResult<Answer>> {
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        out.push(match job {
            Job::Outcomes {
                items,
                policy,
                observed_at_ms,
            } => careful::record_outcomes(pool, items, *policy, *observed_at_ms)
                .await
                .map(Answer::Outcomes),
            Job::Extend {
                claim,
                extend_ms,
                now_ms,
            } => Ok(Answer::Extend(
                careful::extend_claim(pool, claim, *extend_ms, *now_ms).await,
            )),
            Job::Release { claim, now_ms } => Ok(Answer::Release(
                careful::release_claim(pool, claim, *now_ms).await,
            )),
        });
    }
    out
}

/// Whether an answer made work due at once.
fn answer_wakes(answer: &StoreResult<Answer>) -> bool {
    match answer {
        Ok(Answer::Outcomes(routes)) => routes.iter().any(careful::retried),
        Ok(Answer::Release(Ok(()))) => true,
        _ => false,
    }
}

/// Whether the group's writes are one statement: a single round (no
/// receipt twice) and no extension. That statement is atomic by itself, so
/// it needs no `BEGIN` and `COMMIT` (two round trips of three); the rows
/// that missed are read after it, as they stand, like in a transaction at
/// `READ COMMITTED`.
fn one_statement(jobs: &[&Job]) -> bool {
    let units = units(jobs);
    !jobs.iter().any(|j| matches!(j, Job::Extend { .. }))
        && rules::rounds(units.iter().map(|u| u.claim.receipt_id.as_str())).len() <= 1
}

/// Run a group of jobs as one durable transaction; a backend failure fails
/// every job of the group, as it would have failed each alone. Returns the
/// answers in job order and whether work became due. A single statement
/// runs on the queue's `kept` connection when it has one.
pub(super) async fn run_jobs(
    pool: &PgPool,
    kept: Option<&Arc<Kept>>,
    jobs: &[&Job],
) -> (Vec<StoreResult<Answer>>, bool) {
    let fail_all = |e: StoreError| -> (Vec<StoreResult<Answer>>, bool) {
        (jobs.iter().map(|_| Err(e.clone())).collect(), false)
    };
    if one_statement(jobs) {
        let conn = match kept {
            Some(kept) => kept.acquire(pool).await,
            None => Kept::lend(pool).await,
        };
        let mut conn = match conn {
            Ok(conn) => conn,
            Err(e) => return fail_all(e),
        };
        // The one statement commits by itself: past here, it is answered.
        if let Err(e) = super::commit_gate::may_commit() {
            return fail_all(e);
        }
        return match run_in(&mut conn, jobs).await {
            Ok(Some((answers, wakes))) => {
                if let Some(kept) = kept {
                    kept.done(conn);
                }
                (answers.into_iter().map(Ok).collect(), wakes)
            }
            // The refused statement changed nothing.
            Ok(None) => {
                drop(conn);
                let answers = run_carefully(pool, jobs).await;
                let wakes = answers.iter().any(answer_wakes);
                (answers, wakes)
            }
            Err(e) => fail_all(e),
        };
    }
    let mut tx = match begin(pool).await {
        Ok(tx) => tx,
        Err(e) => return fail_all(e),
    };
    match run_in(&mut tx, jobs).await {
        Ok(Some((answers, wakes))) => match finish(tx, Ok(())).await {
            Ok(()) => (answers.into_iter().map(Ok).collect(), wakes),
            Err(e) => fail_all(e),
        },
        Ok(None) => {
            if let Err(e) = tx.rollback().await {
                return fail_all(e.into());
            }
            let answers = run_carefully(pool, jobs).await;
            let wakes = answers.iter().any(answer_wakes);
            (answers, wakes)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            fail_all(e)
        }
    }
}
