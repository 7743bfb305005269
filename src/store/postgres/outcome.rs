//! Outcomes, extensions and releases of one or several callers, run as one
//! transaction with a constant number of statements: per round, one guarded
//! write of every outcome and release, one of every extension, and one read
//! of the rows that missed, each of which is then explained by the shared
//! rules. The answers are those of running the callers one after another,
//! each item in its order.

use sqlx::{PgConnection, PgPool};

use super::super::rules::{self, Cas};
use super::careful;
use super::guarded::{self, Extension, Guard, Write};
use super::{begin, finish, row};
use crate::domain::{Claim, Claimed, LeaseMs, Outcome, RetryPolicy, Route, StoreError, UnixMs};
use crate::store::StoreResult;
use crate::store::rows::ReceiptRow;

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

    fn size(&self) -> usize {
        match self {
            Self::Outcomes { items, .. } => items.len().max(1),
            Self::Extend { .. } | Self::Release { .. } => 1,
        }
    }

    fn run(
        pool: &PgPool,
        jobs: &[Self],
    ) -> impl Future<Output = (Vec<StoreResult<Answer>>, bool)> + Send {
        run_jobs(pool, jobs)
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

/// One item of one job.
struct Unit<'a> {
    job: usize,
    claim: &'a Claim,
    kind: UnitKind<'a>,
}

enum UnitKind<'a> {
    Outcome {
        input: &'a Outcome,
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    },
    Extend {
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    },
    Release {
        now_ms: UnixMs,
    },
}

/// What a unit needs before the database is asked.
enum Prep {
    /// Answered without looking at the row (a value that does not fit).
    Done(UnitAnswer),
    /// A guarded write to try; on a miss the row explains why.
    Write(Box<Write>, Option<Route>),
    Extend(Extension),
    /// No guard can match: the row explains why.
    Explain,
    /// The outcome's plan was refused; the row may turn it into a conflict.
    Refused(StoreError),
}

#[derive(Debug, Clone)]
enum UnitAnswer {
    Route(StoreResult<Route>),
    Extended(StoreResult<Claimed>),
    Released(StoreResult<()>),
}

impl UnitAnswer {
    /// Whether it made work due at once (on this or another replica).
    fn wakes(&self) -> bool {
        matches!(
            self,
            Self::Route(Ok(Route::RetryScheduled { .. })) | Self::Released(Ok(()))
        )
    }
}

/// A guard without a replay never matches; its answer is the error.
fn miss(explained: StoreResult<Route>) -> StoreError {
    explained.err().unwrap_or_else(rules::mismatch)
}

fn units(jobs: &[Job]) -> Vec<Unit<'_>> {
    let mut units = Vec::new();
    for (job, request) in jobs.iter().enumerate() {
        match request {
            Job::Outcomes {
                items,
                policy,
                observed_at_ms,
            } => units.extend(items.iter().map(|(claim, input)| Unit {
                job,
                claim,
                kind: UnitKind::Outcome {
                    input,
                    policy: *policy,
                    observed_at_ms: *observed_at_ms,
                },
            })),
            Job::Extend {
                claim,
                extend_ms,
                now_ms,
            } => units.push(Unit {
                job,
                claim,
                kind: UnitKind::Extend {
                    extend_ms: *extend_ms,
                    now_ms: *now_ms,
                },
            }),
            Job::Release { claim, now_ms } => units.push(Unit {
                job,
                claim,
                kind: UnitKind::Release { now_ms: *now_ms },
            }),
        }
    }
    units
}

fn prepare(unit: &Unit<'_>) -> Prep {
    let claim = unit.claim;
    match unit.kind {
        UnitKind::Outcome {
            input,
            policy,
            observed_at_ms,
        } => match rules::plan_outcome(claim, input, policy, observed_at_ms) {
            Err(refusal) => Prep::Refused(refusal),
            Ok(plan) => {
                if plan.lease_live {
                    Prep::Write(Box::new(Write::outcome(claim, &plan)), Some(plan.route))
                } else {
                    Prep::Explain
                }
            }
        },
        UnitKind::Extend { extend_ms, now_ms } => {
            match rules::lease_deadline(now_ms, extend_ms.get()) {
                Err(e) => Prep::Done(UnitAnswer::Extended(Err(e))),
                Ok(until) => Prep::Extend(Extension {
                    guard: Guard::of(&Cas::of(claim), now_ms.as_i64()),
                    until,
                }),
            }
        }
        UnitKind::Release { now_ms } => {
            Prep::Write(Box::new(Write::release(claim, now_ms.as_i64())), None)
        }
    }
}

/// The answer of a unit whose guard did not match (or was never tried), from
/// the row as it stands now.
fn explain(unit: &Unit<'_>, prep: &Prep, row: Option<&ReceiptRow>) -> UnitAnswer {
    let claim = unit.claim;
    match (&unit.kind, prep) {
        (UnitKind::Outcome { observed_at_ms, .. }, Prep::Refused(refusal)) => {
            UnitAnswer::Route(Err(rules::refused_plan(
                row,
                claim,
                refusal.clone(),
                *observed_at_ms,
            )))
        }
        (
            UnitKind::Outcome {
                input,
                observed_at_ms,
                ..
            },
            _,
        ) => UnitAnswer::Route(rules::explain_miss(
            row,
            claim,
            Some(input),
            *observed_at_ms,
        )),
        (UnitKind::Extend { now_ms, .. }, _) => {
            UnitAnswer::Extended(Err(miss(rules::explain_miss(row, claim, None, *now_ms))))
        }
        (UnitKind::Release { now_ms }, _) => {
            UnitAnswer::Released(Err(miss(rules::explain_miss(row, claim, None, *now_ms))))
        }
    }
}

/// Run one round (each receipt at most once). `Ok(false)`: the database
/// refused a write, which changed nothing (the statement or the transaction
/// is undone), and the group must be run again one caller at a time.
async fn run_round(
    conn: &mut PgConnection,
    units: &[Unit<'_>],
    round: &[usize],
    answers: &mut [Option<UnitAnswer>],
) -> StoreResult<bool> {
    let preps: Vec<(usize, Prep)> = round.iter().map(|&u| (u, prepare(&units[u]))).collect();
    let mut writes = Vec::new();
    let mut extensions = Vec::new();
    let mut unexplained = Vec::new();
    for (position, (unit, prep)) in preps.iter().enumerate() {
        match prep {
            Prep::Done(answer) => answers[*unit] = Some(answer.clone()),
            Prep::Write(write, _) => writes.push((position, Write::clone(write))),
            Prep::Extend(extension) => extensions.push((position, extension.clone())),
            Prep::Explain | Prep::Refused(_) => unexplained.push(position),
        }
    }
    // In id order, so that concurrent groups lock shared rows alike.
    writes.sort_by(|(_, a), (_, b)| a.guard.receipt_id.cmp(&b.guard.receipt_id));
    extensions.sort_by(|(_, a), (_, b)| a.guard.receipt_id.cmp(&b.guard.receipt_id));
    let batch: Vec<Write> = writes.iter().map(|(_, w)| w.clone()).collect();
    let matched = match guarded::write_round(conn, &batch).await {
        Ok(matched) => matched,
        Err(e @ StoreError::Backend { .. }) => return Err(e),
        Err(_) => return Ok(false),
    };
    for ((position, _), hit) in writes.iter().zip(matched) {
        let (unit, prep) = &preps[*position];
        match (hit, prep) {
            (true, Prep::Write(_, Some(route))) => {
                answers[*unit] = Some(UnitAnswer::Route(Ok(*route)));
            }
            (true, _) => answers[*unit] = Some(UnitAnswer::Released(Ok(()))),
            (false, _) => unexplained.push(*position),
        }
    }
    let batch: Vec<Extension> = extensions.iter().map(|(_, e)| e.clone()).collect();
    let extended = match guarded::extend_round(conn, &batch).await {
        Ok(extended) => extended,
        Err(e @ StoreError::Backend { .. }) => return Err(e),
        Err(_) => return Ok(false),
    };
    for ((position, _), row) in extensions.iter().zip(extended) {
        let unit = preps[*position].0;
        match row {
            // A row that does not convert is refused like any other value;
            // the careful run answers it alone, rolled back.
            Some(row) => match row.claimed(None) {
                Ok(claim) => answers[unit] = Some(UnitAnswer::Extended(Ok(claim))),
                Err(_) => return Ok(false),
            },
            None => unexplained.push(*position),
        }
    }
    if unexplained.is_empty() {
        return Ok(true);
    }
    let ids: Vec<&str> = unexplained
        .iter()
        .map(|&p| units[preps[p].0].claim.receipt_id.as_str())
        .collect();
    match guarded::rows_of(conn, &ids).await {
        Ok(rows) => {
            for position in unexplained {
                let (unit, prep) = &preps[position];
                let row = rows.get(units[*unit].claim.receipt_id.as_str());
                answers[*unit] = Some(explain(&units[*unit], prep, row));
            }
        }
        Err(e @ StoreError::Backend { .. }) => return Err(e),
        // A stored row that does not decode: read them one by one, so that
        // only its own item is answered with the error.
        Err(_) => {
            for position in unexplained {
                let (unit, prep) = &preps[position];
                let id = units[*unit].claim.receipt_id.as_str();
                let found = row(conn, id).await;
                answers[*unit] = Some(match found {
                    Ok(found) => explain(&units[*unit], prep, found.as_ref()),
                    Err(e @ StoreError::Backend { .. }) => return Err(e),
                    Err(e) => refusal(&units[*unit], e),
                });
            }
        }
    }
    Ok(true)
}

/// The answer of a unit refused before its row could be judged.
fn refusal(unit: &Unit<'_>, error: StoreError) -> UnitAnswer {
    match unit.kind {
        UnitKind::Outcome { .. } => UnitAnswer::Route(Err(error)),
        UnitKind::Extend { .. } => UnitAnswer::Extended(Err(error)),
        UnitKind::Release { .. } => UnitAnswer::Released(Err(error)),
    }
}

/// Run a group in `tx`; `Ok(None)` when the database refused a write.
async fn run_in(conn: &mut PgConnection, jobs: &[Job]) -> StoreResult<Option<(Vec<Answer>, bool)>> {
    let units = units(jobs);
    let mut answers: Vec<Option<UnitAnswer>> = vec![None; units.len()];
    for round in rules::rounds(units.iter().map(|u| u.claim.receipt_id.as_str())) {
        if !run_round(conn, &units, &round, &mut answers).await? {
            return Ok(None);
        }
    }
    let wakes = answers.iter().flatten().any(UnitAnswer::wakes);
    let mut out: Vec<Answer> = jobs.iter().map(Job::empty_answer).collect();
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
async fn run_carefully(pool: &PgPool, jobs: &[Job]) -> Vec<StoreResult<Answer>> {
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
fn one_statement(jobs: &[Job]) -> bool {
    let units = units(jobs);
    !jobs.iter().any(|j| matches!(j, Job::Extend { .. }))
        && rules::rounds(units.iter().map(|u| u.claim.receipt_id.as_str())).len() <= 1
}

/// Run a group of jobs as one durable transaction; a backend failure fails
/// every job of the group, as it would have failed each alone. Returns the
/// answers in job order and whether work became due.
async fn run_jobs(pool: &PgPool, jobs: &[Job]) -> (Vec<StoreResult<Answer>>, bool) {
    let fail_all = |e: StoreError| -> (Vec<StoreResult<Answer>>, bool) {
        (jobs.iter().map(|_| Err(e.clone())).collect(), false)
    };
    if one_statement(jobs) {
        let mut conn = match pool.acquire().await {
            Ok(conn) => conn,
            Err(e) => return fail_all(e.into()),
        };
        // The one statement commits by itself: past here, it is answered.
        if let Err(e) = super::commit_gate::may_commit() {
            return fail_all(e);
        }
        return match run_in(&mut conn, jobs).await {
            Ok(Some((answers, wakes))) => (answers.into_iter().map(Ok).collect(), wakes),
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
