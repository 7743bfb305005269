//! The writer thread: it takes every write that is waiting, runs them in
//! one transaction (each kind merged into one batch, each failed batch
//! again request by request) and answers them after the durable commit.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rusqlite::Connection;
use tokio::sync::mpsc;

use super::super::lease;
use super::super::outcome;
use super::{
    BACKGROUND_PAUSE, Batch, Finish, Job, MAX_GROUP, MAX_ITEMS, in_savepoint, lost, open, stopped,
};
use crate::domain::StoreError;
use crate::store::StoreResult;

/// Run the requests of one kind as one merged batch; on failure, each alone.
fn run_kind<I, R: Send + 'static>(
    conn: &Connection,
    batches: Vec<Batch<I, R>>,
    apply: fn(&Connection, &[I]) -> StoreResult<Vec<R>>,
    finish: &mut Vec<Finish>,
    merged_count: &AtomicU64,
) {
    if batches.is_empty() {
        return;
    }
    let mut items = Vec::new();
    let mut ends = Vec::with_capacity(batches.len());
    let mut replies = Vec::with_capacity(batches.len());
    for b in batches {
        items.extend(b.items);
        ends.push(items.len());
        replies.push(b.reply);
    }
    let merged = if replies.len() > 1 {
        in_savepoint(conn, "merged", |c| {
            let results = apply(c, &items)?;
            if results.len() == items.len() {
                Ok(results)
            } else {
                Err(StoreError::backend("a merged batch lost answers"))
            }
        })
        .map_err(
            |e| tracing::debug!(error = %e, "merged batch refused; running its requests alone"),
        )
        .ok()
    } else {
        None
    };
    if merged.is_some() {
        merged_count.fetch_add(replies.len() as u64, Ordering::Relaxed);
    }
    let mut start = 0;
    let mut merged = merged.map(Vec::into_iter);
    for (end, reply) in ends.into_iter().zip(replies) {
        let result = match merged.as_mut() {
            Some(all) => Ok(all.by_ref().take(end - start).collect()),
            None => in_savepoint(conn, "request", |c| apply(c, &items[start..end])),
        };
        start = end;
        finish.push(Box::new(move |failed: Option<&StoreError>| {
            let _ = reply.send(match failed {
                None => result,
                Some(e) => Err(e.clone()),
            });
        }));
    }
}

pub(super) fn run(
    mut conn: Option<Connection>,
    path: &PathBuf,
    mut jobs: mpsc::Receiver<Job>,
    merged: &AtomicU64,
) {
    let mut failed_at: Option<Instant> = None;
    while let Some(first) = jobs.blocking_recv() {
        let mut size = first.size();
        let mut group = vec![first];
        while group.len() < MAX_GROUP && size < MAX_ITEMS {
            match jobs.try_recv() {
                Ok(job) => {
                    size += job.size();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        let background_only = group.iter().all(|j| matches!(j, Job::Background(_)));
        if background_only && failed_at.is_some_and(|t| t.elapsed() < BACKGROUND_PAUSE) {
            // Dropped: their callers hear that the write was deferred.
            drop(group);
            continue;
        }
        let open = match conn.take() {
            Some(c) => Ok(c),
            None => open(path),
        };
        match open {
            Ok(c) => {
                // After a failed commit SQLite may have rolled back on its
                // own (a full disk, an I/O error); a fresh connection starts
                // clean.
                if commit_group(&c, group, merged) {
                    conn = Some(c);
                    failed_at = None;
                } else {
                    failed_at = Some(Instant::now());
                    tracing::warn!("reopening the SQLite writer connection after a failed commit");
                }
            }
            Err(e) => {
                failed_at = Some(Instant::now());
                let finish = fail_all(group);
                for f in finish {
                    f(Some(&e));
                }
            }
        }
    }
}

/// Answer every job of a group with an error (nothing was written).
fn fail_all(group: Vec<Job>) -> Vec<Finish> {
    group
        .into_iter()
        .map(|job| -> Finish {
            match job {
                Job::Enqueue(b) => Box::new(move |e| drop(b.reply.send(Err(err(e))))),
                Job::Outcomes(b) => Box::new(move |e| drop(b.reply.send(Err(err(e))))),
                Job::Extend(b) => Box::new(move |e| drop(b.reply.send(Err(err(e))))),
                Job::Release(b) => Box::new(move |e| drop(b.reply.send(Err(err(e))))),
                // Dropping a solo job drops its reply: the caller sees "stopped".
                Job::Solo(_) | Job::Background(_) => Box::new(|_| {}),
            }
        })
        .collect()
}

fn err(e: Option<&StoreError>) -> StoreError {
    e.cloned().unwrap_or_else(stopped)
}

/// Run and commit one group; `false` when the connection should be reopened.
fn commit_group(conn: &Connection, group: Vec<Job>, merged: &AtomicU64) -> bool {
    if let Err(e) = conn
        .prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut s| s.execute([]))
    {
        let e = StoreError::from(e);
        for f in fail_all(group) {
            f(Some(&e));
        }
        return false;
    }
    let mut finish: Vec<Finish> = Vec::with_capacity(group.len());
    let (mut enqueue, mut outcomes, mut extend, mut release) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Requests in one group were all in flight together, so any order is one
    // they could have run in alone: solo writes first, then each kind merged.
    for job in group {
        match job {
            Job::Enqueue(b) => enqueue.push(b),
            Job::Outcomes(b) => outcomes.push(b),
            Job::Extend(b) => extend.push(b),
            Job::Release(b) => release.push(b),
            Job::Solo(run) | Job::Background(run) => finish.push(run(conn)),
        }
    }
    run_kind(
        conn,
        enqueue,
        super::super::enqueue::enqueue,
        &mut finish,
        merged,
    );
    run_kind(conn, outcomes, outcome::record, &mut finish, merged);
    run_kind(conn, extend, lease::extend, &mut finish, merged);
    run_kind(conn, release, lease::release, &mut finish, merged);
    // Everything answered so far assumed the group's transaction; if SQLite
    // dropped it, none of it is kept and nobody may hear otherwise.
    if conn.is_autocommit() {
        let e = lost();
        for f in finish {
            f(Some(&e));
        }
        return false;
    }
    let committed = conn.execute_batch("COMMIT").map_err(StoreError::from);
    if committed.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
        // A claim in the group may have read the group table after another
        // spent from a bucket: that copy was never committed.
    }
    let failed = committed.as_ref().err();
    for f in finish {
        f(failed);
    }
    committed.is_ok()
}
