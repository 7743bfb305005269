//! The ceiling: the same lease cycle as plain SQL straight against a fresh
//! database of the same backend, with settled's own schema (its migrations),
//! the same durability (SQLite WAL + `synchronous=FULL`, PostgreSQL
//! `synchronous_commit=on`) and the same outcome mix and retry policy, but no
//! HTTP and no settled code on the path. Claims are all-or-nothing batches of
//! the oldest due rows, each leased with its own random 128-bit token; a
//! batch of outcomes is one guarded `UPDATE` (token, owner, attempts and a
//! live lease must still match) plus one history `INSERT … SELECT`, in one
//! transaction. Every change is durable before the run counts it.

mod postgres;
mod sqlite;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;
use settled::domain::RetryPolicy;
use sha2::{Digest, Sha256};

use super::common::{Ids, Kind, Res, err};
use super::cpu;
use super::inproc::Workload;

/// What the plain-SQL run measured.
pub struct RawResult {
    pub workers: usize,
    /// How often the run commits: `round` (SQLite: once per round of the
    /// workers' turns) or `each` (every claim and every completion).
    pub commit: &'static str,
    pub enqueued_per_sec: f64,
    pub per_sec: f64,
    pub elapsed_s: f64,
    /// This process's CPU per finished row while settling: on SQLite that is
    /// the database engine itself; on PostgreSQL only the client side.
    pub cpu_us_per_row: Option<f64>,
    /// PostgreSQL: its backends' CPU per finished row while settling.
    pub db_cpu_us_per_row: Option<f64>,
    pub retries: u64,
    pub failures: Vec<String>,
}

/// Run the plain-SQL cycle on the fresh database at `url`.
pub async fn run(
    url: &str,
    w: &Workload,
    policy: RetryPolicy,
    commit_each: bool,
) -> Res<RawResult> {
    let ids = Ids {
        prefix: format!("raw-{}", super::common::run_id()),
        groups: 0,
    };
    let sqlite = url.strip_prefix("sqlite:");
    // PostgreSQL: every step is one statement, committed on its own.
    let commit = if commit_each || sqlite.is_none() {
        "each"
    } else {
        "round"
    };
    let cycle = Cycle::new(w.clone(), policy, ids, commit);
    if let Some(path) = sqlite {
        sqlite::run(url, path, cycle, commit_each).await
    } else {
        postgres::run(url, cycle).await
    }
}

/// A row just leased: what its outcome depends on.
pub struct Leased {
    pub id: String,
    pub attempts: i64,
}

/// The change one outcome makes to its row and the history entry it adds,
/// decided as settled decides it (see `rules::plan_outcome`). Field names are
/// the keys the SQLite statements read with `->>`.
#[derive(Debug, Serialize)]
pub struct Done {
    pub id: String,
    pub token: String,
    /// `attempts` of the claim, part of the guard.
    pub prior: i64,
    pub status: &'static str,
    pub attempts: i64,
    pub nv: Option<i64>,
    pub fcode: Option<&'static str>,
    pub fsha: Option<String>,
    pub tx: Option<String>,
    pub skip: Option<&'static str>,
    pub fin: Option<i64>,
    /// History: the attempt this outcome ends.
    pub attempt: i64,
    pub outcome: &'static str,
    pub route: &'static str,
}

/// Settings and running totals shared by every worker of the run.
pub struct Cycle {
    pub w: Workload,
    policy: RetryPolicy,
    pub ids: Ids,
    pub commit: &'static str,
    retry_sha: String,
    permanent_sha: String,
    /// Rows that reached a terminal state.
    pub done: AtomicUsize,
    pub settled: AtomicU64,
    pub retries: AtomicU64,
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `n` random 128-bit lease tokens as hex, from one read of the OS CSPRNG.
pub fn tokens(n: usize) -> Res<Vec<String>> {
    let mut bytes = vec![0u8; 16 * n];
    getrandom::fill(&mut bytes).map_err(|e| err(format!("os rng: {e}")))?;
    Ok(bytes.chunks(16).map(hex::encode).collect())
}

impl Cycle {
    fn new(w: Workload, policy: RetryPolicy, ids: Ids, commit: &'static str) -> Self {
        Self {
            w,
            policy,
            ids,
            commit,
            // The details the HTTP run sends (see `Mix::outcome`).
            retry_sha: sha256_hex("bench: rail timeout"),
            permanent_sha: sha256_hex("bench: bad signature"),
            done: AtomicUsize::new(0),
            settled: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }

    pub fn all_done(&self) -> bool {
        self.done.load(Ordering::Relaxed) >= self.w.receipts
    }

    /// `{"amount_cents": i}`, as settled stores the HTTP run's observations.
    pub fn observation(i: usize) -> String {
        format!("{{\"amount_cents\":{i}}}")
    }

    /// Decide the outcome of a leased row observed at `now`.
    pub fn decide(&self, row: Leased, token: String, now: i64) -> Res<Done> {
        let index = self
            .ids
            .index(&row.id)
            .ok_or_else(|| err(format!("raw: claimed a row of another run: {}", row.id)))?;
        let attempts_before = u32::try_from(row.attempts)?;
        let next = row.attempts + 1;
        let mut done = Done {
            id: row.id,
            token,
            prior: row.attempts,
            status: "settled",
            attempts: row.attempts,
            nv: None,
            fcode: None,
            fsha: None,
            tx: None,
            skip: None,
            fin: Some(now),
            attempt: next,
            outcome: "accepted",
            route: "no_action",
        };
        match self.w.mix.decide(index, attempts_before) {
            Kind::Accepted => done.tx = Some(format!("tx-{index}")),
            Kind::Skipped => {
                (done.status, done.outcome) = ("skipped", "skipped");
                done.skip = Some("zero_charge");
            }
            Kind::Retryable => {
                (done.attempts, done.outcome) = (next, "retryable");
                (done.fcode, done.fsha) = (Some("rpc"), Some(self.retry_sha.clone()));
                if self.policy.allows_retry(attempts_before) {
                    let wait = i64::try_from(self.policy.backoff_ms(attempts_before))?;
                    (done.status, done.route) = ("active", "retry_scheduled");
                    (done.nv, done.fin) = (Some(now + wait), None);
                } else {
                    (done.status, done.route) = ("dead_lettered", "dead_lettered");
                }
            }
            Kind::Permanent => {
                (done.attempts, done.outcome) = (next, "permanent");
                (done.status, done.route) = ("dead_lettered", "dead_lettered");
                done.fcode = Some("invalid_receipt_signature");
                done.fsha = Some(self.permanent_sha.clone());
            }
        }
        Ok(done)
    }

    /// Count a committed batch of outcomes.
    pub fn tally(&self, batch: &[Done]) {
        let count = |status: &str| batch.iter().filter(|d| d.status == status).count();
        let retries = count("active");
        self.retries.fetch_add(retries as u64, Ordering::Relaxed);
        self.settled
            .fetch_add(count("settled") as u64, Ordering::Relaxed);
        self.done
            .fetch_add(batch.len() - retries, Ordering::Relaxed);
    }

    /// Check the database at the end: every row finished, exactly the
    /// settled ones accepted once in history, as many retries as counted.
    pub fn check(&self, end: &EndCounts, failures: &mut Vec<String>) {
        let n = self.w.receipts as i64;
        let settled = i64::try_from(self.settled.load(Ordering::Relaxed)).unwrap_or(-1);
        let retries = i64::try_from(self.retries.load(Ordering::Relaxed)).unwrap_or(-1);
        let problems = [
            (end.finished != n, "finished rows", end.finished, n),
            (end.active != 0, "active rows", end.active, 0),
            (end.settled != settled, "settled rows", end.settled, settled),
            (
                end.accepted != settled,
                "accepted history entries",
                end.accepted,
                settled,
            ),
            (
                end.accepted_twice != 0,
                "rows accepted twice",
                end.accepted_twice,
                0,
            ),
            (
                end.retries != retries,
                "retry history entries",
                end.retries,
                retries,
            ),
        ];
        for (bad, what, found, expected) in problems {
            if bad {
                failures.push(format!("raw: {found} {what}, expected {expected}"));
            }
        }
    }
}

/// What the database holds at the end of a raw run.
#[derive(Debug, Default, sqlx::FromRow)]
pub struct EndCounts {
    pub finished: i64,
    pub active: i64,
    pub settled: i64,
    pub accepted: i64,
    pub accepted_twice: i64,
    pub retries: i64,
}

/// The end-of-run counts, as one query both backends understand.
pub const END_COUNTS: &str = "SELECT \
     (SELECT count(*) FROM receipts WHERE status <> 'active') AS finished, \
     (SELECT count(*) FROM receipts WHERE status = 'active') AS active, \
     (SELECT count(*) FROM receipts WHERE status = 'settled') AS settled, \
     (SELECT count(*) FROM receipt_history WHERE outcome = 'accepted') AS accepted, \
     (SELECT count(*) FROM (SELECT receipt_id FROM receipt_history WHERE outcome = 'accepted' \
        GROUP BY receipt_id HAVING count(*) > 1) AS twice) AS accepted_twice, \
     (SELECT count(*) FROM receipt_history WHERE route = 'retry_scheduled') AS retries";

/// Times the settle phase and this process's CPU over it.
pub struct Phase {
    started: Instant,
    cpu_before: Option<f64>,
}

/// What a finished settle phase measured.
pub struct Measured {
    elapsed_s: f64,
    cpu_us_per_row: Option<f64>,
    /// Set by the PostgreSQL run.
    pub db_cpu_s: Option<f64>,
}

impl Phase {
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            cpu_before: cpu::cpu_s(None),
        }
    }

    /// Stop the clocks once the workers are done.
    pub fn finish(self, cycle: &Cycle) -> Measured {
        let elapsed_s = self.started.elapsed().as_secs_f64();
        let cpu = cpu::cpu_s(None)
            .zip(self.cpu_before)
            .map(|(after, before)| after - before);
        let rows = cycle.done.load(Ordering::Relaxed) as u64;
        Measured {
            elapsed_s,
            cpu_us_per_row: cpu::us_per(cpu, rows),
            db_cpu_s: None,
        }
    }
}

/// Assemble the result of a finished run from what the database holds at its end.
pub fn result(cycle: &Cycle, enqueued_per_sec: f64, m: Measured, end: &EndCounts) -> RawResult {
    let rows = cycle.done.load(Ordering::Relaxed);
    let mut failures = Vec::new();
    if !cycle.all_done() {
        failures.push(format!(
            "raw: only {rows} of {} rows finished before the deadline",
            cycle.w.receipts
        ));
    }
    cycle.check(end, &mut failures);
    RawResult {
        workers: cycle.w.workers,
        commit: cycle.commit,
        enqueued_per_sec,
        per_sec: rows as f64 / m.elapsed_s,
        elapsed_s: m.elapsed_s,
        cpu_us_per_row: m.cpu_us_per_row,
        db_cpu_us_per_row: cpu::us_per(m.db_cpu_s, rows as u64),
        retries: cycle.retries.load(Ordering::Relaxed),
        failures,
    }
}

#[cfg(test)]
#[path = "raw_tests.rs"]
mod tests;
