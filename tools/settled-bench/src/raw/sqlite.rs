//! The plain-SQL cycle on SQLite: rusqlite, one connection on one blocking
//! thread (SQLite has one writer anyway, and this avoids any thread hop), so
//! this is as fast as the file allows. The W workers take turns on it: each
//! turn completes the worker's previous batch and claims its next, so up to
//! W batches are leased at once, as with W concurrent workers, and a claim
//! scans past the other workers' leases as settled's does. By default one
//! round of turns is one transaction, one durable commit (group commit, as
//! settled's writer does); `--raw-commit-each` commits every claim and every
//! completion on its own instead.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior, params};
use sqlx::ConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

use super::{Cycle, Done, END_COUNTS, EndCounts, Leased, Phase, RawResult, result, tokens};
use crate::common::{Ids, Res, err, now_ms, progress};

const INSERT: &str = "INSERT INTO receipts (receipt_id, finalized_at, observation, status, \
     attempts, row_version, next_visible_at_ms, created_at_ms) \
     VALUES (?1, ?2, ?3, 'active', 0, 0, ?4, ?4) ON CONFLICT (receipt_id) DO NOTHING";

/// The oldest due rows, in claim order, on the claim index (which holds
/// only rows without a lease; no lease lapses in this cycle).
const PICK: &str = "SELECT receipt_id, attempts FROM receipts INDEXED BY receipts_due \
     WHERE receipt_group = 'default' AND priority = 0 AND status = 'active' AND held_at_ms IS NULL \
     AND lease_token IS NULL AND next_visible_at_ms <= ?1 \
     ORDER BY next_visible_at_ms, receipt_id LIMIT CAST(?2 AS INTEGER)";

const LEASE: &str = "UPDATE receipts SET row_version = row_version + 1, lease_owner = ?1, \
     lease_token = ?2, lease_until_ms = ?3 WHERE receipt_id = ?4";

/// One guarded update for a whole batch of outcomes. `+status` keeps the
/// planner on the primary key, one lookup per row. `jsonb_each`, not
/// `json_each`: each element then stays binary JSON for the `->>` lookups
/// instead of being rendered to text for every one of them (31 → 18 µs of
/// CPU per row in this cycle).
const COMPLETE: &str = "UPDATE receipts SET status = c.status, attempts = c.attempts, \
     next_visible_at_ms = c.nv, failure_code = coalesce(c.fcode, failure_code), \
     failure_sha256 = coalesce(c.fsha, failure_sha256), transcript_id = c.tx, \
     skip_reason = c.skip, finished_at_ms = c.fin, \
     lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL \
     FROM (SELECT value ->> 'id' AS id, value ->> 'token' AS token, value ->> 'prior' AS prior, \
       value ->> 'status' AS status, value ->> 'attempts' AS attempts, value ->> 'nv' AS nv, \
       value ->> 'fcode' AS fcode, value ->> 'fsha' AS fsha, value ->> 'tx' AS tx, \
       value ->> 'skip' AS skip, value ->> 'fin' AS fin FROM jsonb_each(?1)) AS c \
     WHERE receipts.receipt_id = c.id AND +receipts.status = 'active' \
     AND receipts.lease_token = c.token AND receipts.lease_owner = ?2 \
     AND receipts.attempts = c.prior AND receipts.lease_until_ms > ?3";

const HISTORY: &str = "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, \
     detail_sha256, transcript_id, reason, worker_id, observed_at_ms, route) \
     SELECT value ->> 'id', value ->> 'attempt', value ->> 'outcome', value ->> 'fcode', \
     value ->> 'fsha', value ->> 'tx', value ->> 'skip', ?2, ?3, value ->> 'route' \
     FROM jsonb_each(?1)";

fn now() -> Res<i64> {
    Ok(i64::try_from(now_ms())?)
}

/// Create settled's schema with its own migrations, as `settled` would on first start.
async fn migrate(url: &str) -> Res<()> {
    let mut conn = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .connect()
        .await?;
    sqlx::migrate!("../../migrations/sqlite")
        .run(&mut conn)
        .await?;
    Ok(())
}

/// The connection, with settled's settings: WAL, `synchronous=FULL`, foreign keys.
fn open(path: &str) -> Res<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    if mode != "wal" || sync != 2 {
        return Err(err(format!(
            "raw: SQLite runs with journal_mode {mode}, synchronous {sync}"
        )));
    }
    Ok(conn)
}

pub async fn run(url: &str, path: &str, cycle: Cycle, commit_each: bool) -> Res<RawResult> {
    migrate(url).await?;
    let cycle = Arc::new(cycle);
    let (path, c) = (path.to_owned(), cycle.clone());
    let (mut conn, enqueued_per_sec) = tokio::task::spawn_blocking(move || {
        let mut conn = open(&path)?;
        let rate = enqueue(&mut conn, &c)?;
        Ok::<_, crate::common::BenchError>((conn, rate))
    })
    .await??;
    let shown = cycle.clone();
    let ticker = progress(
        "raw SQL settle (SQLite)".into(),
        cycle.w.receipts,
        Arc::new(move || {
            (
                shown.done.load(std::sync::atomic::Ordering::Relaxed),
                String::new(),
            )
        }),
    );
    let c = cycle.clone();
    let settled = tokio::task::spawn_blocking(move || {
        let phase = Phase::start();
        let outcome = settle(&mut conn, &c, commit_each);
        let measured = phase.finish(&c);
        let end: Res<EndCounts> = conn
            .query_row(END_COUNTS, [], |r| {
                Ok(EndCounts {
                    finished: r.get(0)?,
                    active: r.get(1)?,
                    settled: r.get(2)?,
                    accepted: r.get(3)?,
                    accepted_twice: r.get(4)?,
                    retries: r.get(5)?,
                })
            })
            .map_err(Into::into);
        outcome.map(|()| (measured, end))
    })
    .await;
    ticker.abort();
    let (measured, end) = settled??;
    Ok(result(&cycle, enqueued_per_sec, measured, &end?))
}

/// Insert every receipt, one transaction per enqueue batch. Returns rows a second.
fn enqueue(conn: &mut Connection, cycle: &Cycle) -> Res<f64> {
    let started = Instant::now();
    let (n, chunk, now) = (cycle.w.receipts, cycle.w.enqueue_batch.max(1), now()?);
    for start in (0..n).step_by(chunk) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut insert = tx.prepare_cached(INSERT)?;
            for i in start..n.min(start + chunk) {
                let finalized_at = i64::try_from(Ids::finalized_at(i))?;
                let row = params![cycle.ids.id(i), finalized_at, Cycle::observation(i), now];
                if insert.execute(row)? != 1 {
                    return Err(err(format!("raw: receipt {i} was not created")));
                }
            }
        }
        tx.commit()?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Take turns until every row is finished or the deadline passes.
fn settle(conn: &mut Connection, cycle: &Cycle, commit_each: bool) -> Res<()> {
    let workers = cycle.w.workers.max(1);
    let owners: Vec<String> = (0..workers).map(|k| format!("raw-{k}")).collect();
    let mut leased: Vec<Vec<(Leased, String)>> = (0..workers).map(|_| Vec::new()).collect();
    let deadline = Instant::now() + cycle.w.deadline;
    let immediate = TransactionBehavior::Immediate;
    while !cycle.all_done() && Instant::now() < deadline {
        if commit_each {
            for (owner, slot) in owners.iter().zip(&mut leased) {
                let batch = std::mem::take(slot);
                if !batch.is_empty() {
                    let tx = conn.transaction_with_behavior(immediate)?;
                    let done = complete(&tx, cycle, owner, batch)?;
                    tx.commit()?;
                    cycle.tally(&done);
                }
                let tx = conn.transaction_with_behavior(immediate)?;
                *slot = claim(&tx, cycle, owner)?;
                tx.commit()?;
            }
        } else {
            let tx = conn.transaction_with_behavior(immediate)?;
            let mut finished = Vec::new();
            for (owner, slot) in owners.iter().zip(&mut leased) {
                let batch = std::mem::take(slot);
                if !batch.is_empty() {
                    finished.extend(complete(&tx, cycle, owner, batch)?);
                }
                *slot = claim(&tx, cycle, owner)?;
            }
            tx.commit()?;
            cycle.tally(&finished);
        }
        if leased.iter().all(Vec::is_empty) {
            // Only retries are left, waiting out their backoff.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

/// Lease up to `--batch` of the oldest due rows, all or nothing.
/// Runs inside the caller's transaction.
fn claim(tx: &Connection, cycle: &Cycle, owner: &str) -> Res<Vec<(Leased, String)>> {
    let now = now()?;
    let until = now + i64::try_from(cycle.w.lease_ms)?;
    let picked = tx
        .prepare_cached(PICK)?
        .query_map(params![now, i64::try_from(cycle.w.batch)?], |r| {
            Ok(Leased {
                id: r.get(0)?,
                attempts: r.get(1)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let tokens = tokens(picked.len())?;
    {
        let mut lease = tx.prepare_cached(LEASE)?;
        for (row, token) in picked.iter().zip(&tokens) {
            if lease.execute(params![owner, token, until, row.id])? != 1 {
                return Err(err(format!("raw: {} vanished while being leased", row.id)));
            }
        }
    }
    Ok(picked.into_iter().zip(tokens).collect())
}

/// Record a batch of outcomes: one guarded update, one history insert,
/// inside the caller's transaction. Returns them, to count once committed.
fn complete(
    tx: &Connection,
    cycle: &Cycle,
    owner: &str,
    batch: Vec<(Leased, String)>,
) -> Res<Vec<Done>> {
    let now = now()?;
    let done = batch
        .into_iter()
        .map(|(row, token)| cycle.decide(row, token, now))
        .collect::<Res<Vec<Done>>>()?;
    let rows = serde_json::to_string(&done)?;
    let changed = tx
        .prepare_cached(COMPLETE)?
        .execute(params![rows, owner, now])?;
    if changed != done.len() {
        return Err(err(format!(
            "raw: the guarded update matched {changed} of {} leased rows",
            done.len()
        )));
    }
    tx.prepare_cached(HISTORY)?
        .execute(params![rows, owner, now])?;
    Ok(done)
}
