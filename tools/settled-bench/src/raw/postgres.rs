//! The plain-SQL cycle on PostgreSQL: sqlx, one connection per worker, and
//! every step one statement (so one round trip and one commit): a batch
//! insert from arrays, a `FOR UPDATE SKIP LOCKED` claim, and a completion
//! whose guarded `UPDATE … FROM unnest(…)` feeds the history `INSERT` in the
//! same statement.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use super::{Cycle, Done, END_COUNTS, EndCounts, Leased, Phase, RawResult, result, tokens};
use crate::common::{BenchError, Ids, Res, err, now_ms, progress};
use crate::tasks::join_all;

/// `{obs}` is the type of `receipts.observation`, so that this works
/// whether the schema stores the JSON as text or natively.
const INSERT: &str = "INSERT INTO receipts (receipt_id, finalized_at, observation, status, \
     attempts, row_version, next_visible_at_ms, created_at_ms) \
     SELECT id, fin, obs::{obs}, 'active', 0, 0, $4, $4 \
     FROM unnest($1::text[], $2::bigint[], $3::text[]) AS t (id, fin, obs) \
     ON CONFLICT (receipt_id) DO NOTHING";

/// Lock and lease the oldest due rows that no one else holds; tokens pair
/// with rows by position. The claim index holds only rows without a lease
/// (no lease lapses in this cycle).
const CLAIM: &str = "WITH picked AS (SELECT receipt_id FROM receipts \
       WHERE receipt_group = 'default' AND priority = 0 AND status = 'active' AND held_at_ms IS NULL \
       AND lease_token IS NULL AND next_visible_at_ms <= $1 \
       ORDER BY next_visible_at_ms, receipt_id LIMIT $2 FOR UPDATE SKIP LOCKED), \
     numbered AS (SELECT receipt_id AS pick_id, row_number() OVER () AS n FROM picked) \
     UPDATE receipts SET row_version = row_version + 1, lease_owner = $3, \
       lease_token = t.token, lease_until_ms = $4 \
     FROM numbered JOIN unnest($5::text[]) WITH ORDINALITY AS t (token, n) USING (n) \
     WHERE receipt_id = pick_id RETURNING receipt_id, attempts, lease_token";

/// One guarded update for a whole batch, whose matched rows become the history entries.
const COMPLETE: &str = "WITH c AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], \
       $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::text[], $9::text[], $10::text[], \
       $11::bigint[], $12::bigint[], $13::text[], $14::text[]) \
       AS c (id, token, prior, status, attempts, nv, fcode, fsha, tx, skip, fin, attempt, \
       outcome, route)), \
     u AS (UPDATE receipts r SET status = c.status, attempts = c.attempts, \
       next_visible_at_ms = c.nv, failure_code = coalesce(c.fcode, r.failure_code), \
       failure_sha256 = coalesce(c.fsha, r.failure_sha256), transcript_id = c.tx, \
       skip_reason = c.skip, finished_at_ms = c.fin, \
       lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL \
       FROM c WHERE r.receipt_id = c.id AND r.status = 'active' AND r.lease_token = c.token \
       AND r.lease_owner = $15 AND r.attempts = c.prior AND r.lease_until_ms > $16 \
       RETURNING c.id, c.attempt, c.outcome, c.fcode, c.fsha, c.tx, c.skip, c.route) \
     INSERT INTO receipt_history (receipt_id, attempt, outcome, code, detail_sha256, \
       transcript_id, reason, worker_id, observed_at_ms, route) \
     SELECT id, attempt, outcome, fcode, fsha, tx, skip, $15, $16, route FROM u";

fn now() -> Res<i64> {
    Ok(i64::try_from(now_ms())?)
}

pub async fn run(url: &str, cycle: Cycle) -> Res<RawResult> {
    let connections = cycle.w.workers.max(cycle.w.producers).max(1);
    // settled's own schema and migrations, as the service would create them.
    let schema = settled::store::postgres::DEFAULT_SCHEMA;
    let connect = settled::store::postgres::connect_options(url, schema)?;
    settled::store::postgres::prepare(&connect, schema, Duration::from_secs(10)).await?;
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(connections)?)
        .connect_with(connect)
        .await?;
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await?;
    if sync != "on" {
        return Err(err(format!(
            "raw: PostgreSQL runs with synchronous_commit {sync}"
        )));
    }
    let cycle = Arc::new(cycle);
    let enqueued_per_sec = enqueue(&pool, &cycle).await?;
    let shown = cycle.clone();
    let ticker = progress(
        "raw SQL settle (PostgreSQL)".into(),
        cycle.w.receipts,
        Arc::new(move || (shown.done.load(Ordering::Relaxed), String::new())),
    );
    let db_cpu = crate::db_cpu::DbCpu::start(url).await;
    let phase = Phase::start();
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..cycle.w.workers.max(1) {
        let (pool, cycle) = (pool.clone(), cycle.clone());
        tasks.spawn(async move { worker(&pool, &cycle, format!("raw-{k}")).await });
    }
    let joined = join_all(&mut tasks, "raw worker").await;
    let mut measured = phase.finish(&cycle);
    measured.db_cpu_s = match db_cpu {
        Some(d) => d.finish().await,
        None => None,
    };
    ticker.abort();
    joined?;
    let end: EndCounts = sqlx::query_as(END_COUNTS).fetch_one(&pool).await?;
    pool.close().await;
    Ok(result(&cycle, enqueued_per_sec, measured, &end))
}

/// Insert every receipt in statements of `--enqueue-batch` rows, `--producers`
/// at a time. Returns rows a second.
async fn enqueue(pool: &PgPool, cycle: &Arc<Cycle>) -> Res<f64> {
    let obs: String = sqlx::query_scalar(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = 'receipts'::regclass AND attname = 'observation'",
    )
    .fetch_one(pool)
    .await?;
    let sql = Arc::new(INSERT.replace("{obs}", &obs));
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..cycle.w.producers.max(1) {
        let (pool, cycle, next, sql) = (pool.clone(), cycle.clone(), next.clone(), sql.clone());
        tasks.spawn(async move {
            let (n, chunk, now) = (cycle.w.receipts, cycle.w.enqueue_batch.max(1), now()?);
            loop {
                let start = next.fetch_add(chunk, Ordering::Relaxed);
                if start >= n {
                    return Ok(());
                }
                let range = start..n.min(start + chunk);
                let ids: Vec<String> = range.clone().map(|i| cycle.ids.id(i)).collect();
                let fin = range
                    .clone()
                    .map(|i| i64::try_from(Ids::finalized_at(i)))
                    .collect::<Result<Vec<_>, _>>()?;
                let obs: Vec<String> = range.map(Cycle::observation).collect();
                let created = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                    .bind(&ids)
                    .bind(fin)
                    .bind(obs)
                    .bind(now)
                    .execute(&pool)
                    .await?
                    .rows_affected();
                if created != ids.len() as u64 {
                    return Err::<(), BenchError>(err(format!(
                        "raw: {created} of {} receipts created",
                        ids.len()
                    )));
                }
            }
        });
    }
    join_all(&mut tasks, "raw worker").await?;
    Ok(cycle.w.receipts as f64 / started.elapsed().as_secs_f64())
}

/// Claim and complete until every row is finished or the deadline passes.
async fn worker(pool: &PgPool, cycle: &Cycle, owner: String) -> Res<()> {
    let started = Instant::now();
    let batch = i64::try_from(cycle.w.batch)?;
    let lease_ms = i64::try_from(cycle.w.lease_ms)?;
    while !cycle.all_done() && started.elapsed() < cycle.w.deadline {
        let claimed_at = now()?;
        let tokens = tokens(cycle.w.batch)?;
        let rows: Vec<(String, i64, String)> = sqlx::query_as(CLAIM)
            .bind(claimed_at)
            .bind(batch)
            .bind(&owner)
            .bind(claimed_at + lease_ms)
            .bind(&tokens)
            .fetch_all(pool)
            .await?;
        if rows.is_empty() {
            // Nothing due: the rest is leased by others or waiting out a backoff.
            tokio::time::sleep(Duration::from_millis(2)).await;
            continue;
        }
        let observed = now()?;
        let done = rows
            .into_iter()
            .map(|(id, attempts, token)| cycle.decide(Leased { id, attempts }, token, observed))
            .collect::<Res<Vec<Done>>>()?;
        complete(pool, &owner, &done, observed).await?;
        cycle.tally(&done);
    }
    Ok(())
}

/// Record a batch of outcomes in one statement (so one commit).
async fn complete(pool: &PgPool, owner: &str, done: &[Done], now: i64) -> Res<()> {
    let text = |f: fn(&Done) -> Option<&str>| done.iter().map(f).collect::<Vec<_>>();
    let int = |f: fn(&Done) -> Option<i64>| done.iter().map(f).collect::<Vec<_>>();
    let recorded = sqlx::query(COMPLETE)
        .bind(text(|d| Some(&d.id)))
        .bind(text(|d| Some(&d.token)))
        .bind(int(|d| Some(d.prior)))
        .bind(text(|d| Some(d.status)))
        .bind(int(|d| Some(d.attempts)))
        .bind(int(|d| d.nv))
        .bind(text(|d| d.fcode))
        .bind(text(|d| d.fsha.as_deref()))
        .bind(text(|d| d.tx.as_deref()))
        .bind(text(|d| d.skip))
        .bind(int(|d| d.fin))
        .bind(int(|d| Some(d.attempt)))
        .bind(text(|d| Some(d.outcome)))
        .bind(text(|d| Some(d.route)))
        .bind(owner)
        .bind(now)
        .execute(pool)
        .await?
        .rows_affected();
    if recorded != done.len() as u64 {
        return Err(err(format!(
            "raw: the guarded update matched {recorded} of {} leased rows",
            done.len()
        )));
    }
    Ok(())
}
