//! One round of a group of writes (each receipt at most once): every unit
//! prepared in Rust, one guarded write of the outcomes and releases, one of
//! the extensions, and one read of the rows that missed, each of which the
//! shared rules then explain.

use sqlx::PgConnection;

use super::super::rules::{self, Cas};
use super::guarded::{self, Extension, Guard, Write};
use super::row;
use super::writes::Job;
use crate::domain::{Claim, Claimed, LeaseMs, Outcome, RetryPolicy, Route, StoreError, UnixMs};
use crate::store::StoreResult;
use crate::store::rows::ReceiptRow;

/// One item of one job.
pub(super) struct Unit<'a> {
    pub job: usize,
    pub claim: &'a Claim,
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
pub(super) enum UnitAnswer {
    Route(StoreResult<Route>),
    Extended(StoreResult<Claimed>),
    Released(StoreResult<()>),
}

impl UnitAnswer {
    /// Whether it made work due at once (on this or another replica).
    pub fn wakes(&self) -> bool {
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

pub(super) fn units<'a>(jobs: &[&'a Job]) -> Vec<Unit<'a>> {
    let mut units = Vec::new();
    for (job, request) in jobs.iter().enumerate() {
        match *request {
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
pub(super) async fn run_round(
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
