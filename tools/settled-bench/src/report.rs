//! The figures of one bench run: a human summary and one JSON object.

use serde_json::{Value, json};

use super::common::Latencies;
use super::raw::RawResult;

/// Everything measured.
pub struct Report {
    pub backend: String,
    pub target: String,
    pub receipts: usize,
    pub workers: usize,
    /// `settled` processes the workers were spread over (spawned runs).
    pub replicas: usize,
    pub batch: usize,
    pub enqueue_batch: usize,
    pub producers: usize,
    pub mix: String,
    pub rate: Option<f64>,
    pub preload: usize,
    /// Groups named once and drained before the run.
    pub idle_groups: usize,
    pub preload_via: Option<String>,
    pub enqueued_per_sec: f64,
    pub enqueue_elapsed_s: f64,
    pub settled_per_sec: f64,
    pub elapsed_s: f64,
    pub claim: Latencies,
    pub outcome: Latencies,
    pub claim_requests: usize,
    pub outcome_requests: usize,
    pub empty_claims: u64,
    pub settled: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
    pub retries: u64,
    pub conflicts: u64,
    pub errors: u64,
    pub foreign_claims: u64,
    pub server_cpu_s: Option<f64>,
    /// Bytes the server processes sent to storage while settling (SQLite:
    /// the database's writes; PostgreSQL writes in its own processes).
    pub server_written_bytes: Option<u64>,
    /// CPU of the PostgreSQL backends serving the spawned server, while settling.
    pub db_cpu_s: Option<f64>,
    /// What PostgreSQL wrote while settling (WAL, index entries).
    pub db_written: Option<super::pg_cost::Written>,
    pub peak_rss_mb: Option<f64>,
    pub verified_receipts: usize,
    pub counts_before: Value,
    pub counts_after: Value,
    pub inprocess_settled_per_sec: Option<f64>,
    pub inprocess_enqueued_per_sec: Option<f64>,
    pub inprocess_elapsed_s: Option<f64>,
    /// The plain-SQL run (`--raw`).
    pub raw: Option<RawResult>,
    pub failures: Vec<String>,
    pub total_elapsed_s: f64,
}

fn round(x: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (x * k).round() / k
}

impl Report {
    pub fn invariants_ok(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn http_over_inprocess(&self) -> Option<f64> {
        self.inprocess_settled_per_sec
            .filter(|r| *r > 0.0)
            .map(|r| self.settled_per_sec / r)
    }

    /// Settled's settle rate as a share of the plain-SQL one.
    pub fn settled_over_raw(&self) -> Option<f64> {
        self.raw
            .as_ref()
            .filter(|r| r.per_sec > 0.0)
            .map(|r| self.settled_per_sec / r.per_sec)
    }

    /// Server CPU (user + system) per finished receipt while settling, in µs.
    pub fn server_cpu_us_per_receipt(&self) -> Option<f64> {
        let finished = self.settled + self.skipped + self.dead_lettered;
        super::cpu::us_per(self.server_cpu_s, finished)
    }

    /// Bytes the server wrote to storage per finished receipt while settling.
    pub fn server_written_bytes_per_receipt(&self) -> Option<f64> {
        let finished = self.settled + self.skipped + self.dead_lettered;
        self.server_written_bytes
            .filter(|_| finished > 0)
            .map(|b| b as f64 / finished as f64)
    }

    /// PostgreSQL backends' CPU per finished receipt while settling, in µs.
    pub fn db_cpu_us_per_receipt(&self) -> Option<f64> {
        let finished = self.settled + self.skipped + self.dead_lettered;
        super::cpu::us_per(self.db_cpu_s, finished)
    }

    /// One of PostgreSQL's write figures per finished receipt while settling.
    fn db_written_per_receipt(&self, f: fn(&super::pg_cost::Written) -> f64) -> Option<f64> {
        let finished = self.settled + self.skipped + self.dead_lettered;
        let written = self.db_written.as_ref()?;
        (finished > 0).then(|| f(written) / finished as f64)
    }

    pub fn json(&self) -> Value {
        let mut all = json!({
            "backend": self.backend,
            "target": self.target,
            "receipts": self.receipts,
            "workers": self.workers,
            "replicas": self.replicas,
            "batch": self.batch,
            "enqueue_batch": self.enqueue_batch,
            "producers": self.producers,
            "mix": self.mix,
            "rate": self.rate,
            "preload": self.preload,
            "idle_groups": self.idle_groups,
            "preload_via": self.preload_via,
            "enqueued_per_sec": round(self.enqueued_per_sec, 1),
            "enqueue_elapsed_s": round(self.enqueue_elapsed_s, 3),
            "settled_per_sec": round(self.settled_per_sec, 1),
            "elapsed_s": round(self.elapsed_s, 3),
            "claim_p50_ms": round(self.claim.ms(0.50), 3),
            "claim_p99_ms": round(self.claim.ms(0.99), 3),
            "claim_max_ms": round(self.claim.ms(1.0), 3),
            "outcome_p50_ms": round(self.outcome.ms(0.50), 3),
            "outcome_p99_ms": round(self.outcome.ms(0.99), 3),
            "outcome_max_ms": round(self.outcome.ms(1.0), 3),
        });
        let more = json!({
            "claim_requests": self.claim_requests,
            "outcome_requests": self.outcome_requests,
            "empty_claims": self.empty_claims,
            "settled": self.settled,
            "skipped": self.skipped,
            "dead_lettered": self.dead_lettered,
            "retries": self.retries,
            "conflicts": self.conflicts,
            "errors": self.errors,
            "foreign_claims": self.foreign_claims,
            "server_cpu_s": self.server_cpu_s.map(|c| round(c, 2)),
            "server_cpu_us_per_receipt": self.server_cpu_us_per_receipt().map(|c| round(c, 1)),
            "server_written_bytes_per_receipt": self
                .server_written_bytes_per_receipt()
                .map(|b| round(b, 0)),
            // 4 KiB pages, SQLite's default page size.
            "server_pages_written_per_receipt": self
                .server_written_bytes_per_receipt()
                .map(|b| round(b / 4096.0, 2)),
            "db_cpu_us_per_receipt": self.db_cpu_us_per_receipt().map(|c| round(c, 1)),
            "db_wal_bytes_per_receipt": self.db_written_per_receipt(|w| w.wal_bytes).map(|c| round(c, 0)),
            "db_index_entries_per_receipt": self.db_written_per_receipt(|w| w.index_entries).map(|c| round(c, 1)),
            "db_rows_inserted_per_receipt": self.db_written_per_receipt(|w| w.rows_inserted).map(|c| round(c, 2)),
            "db_rows_updated_per_receipt": self.db_written_per_receipt(|w| w.rows_updated).map(|c| round(c, 2)),
            "db_hot_updates_per_receipt": self.db_written_per_receipt(|w| w.hot_updates).map(|c| round(c, 2)),
            "db_wal_range": self.db_written.as_ref().map(|w| w.wal_range.clone()),
            "db_relations": self.db_written.as_ref().map(|w| w.relations.clone()),
            "peak_rss_mb": self.peak_rss_mb.map(|m| round(m, 1)),
            "verified_receipts": self.verified_receipts,
            "counts_before": self.counts_before,
            "counts_after": self.counts_after,
        });
        let last = json!({
            "inprocess_settled_per_sec": self.inprocess_settled_per_sec.map(|r| round(r, 1)),
            "inprocess_enqueued_per_sec": self.inprocess_enqueued_per_sec.map(|r| round(r, 1)),
            "inprocess_elapsed_s": self.inprocess_elapsed_s.map(|r| round(r, 3)),
            "http_over_inprocess": self.http_over_inprocess().map(|r| round(r, 3)),
            "raw_per_sec": self.raw.as_ref().map(|r| round(r.per_sec, 1)),
            "raw_workers": self.raw.as_ref().map(|r| r.workers),
            "raw_commit": self.raw.as_ref().map(|r| r.commit),
            "raw_enqueued_per_sec": self.raw.as_ref().map(|r| round(r.enqueued_per_sec, 1)),
            "raw_elapsed_s": self.raw.as_ref().map(|r| round(r.elapsed_s, 3)),
            "raw_retries": self.raw.as_ref().map(|r| r.retries),
            "raw_cpu_us_per_row": self.raw.as_ref().and_then(|r| r.cpu_us_per_row.map(|c| round(c, 1))),
            "raw_db_cpu_us_per_row": self.raw.as_ref().and_then(|r| r.db_cpu_us_per_row.map(|c| round(c, 1))),
            "settled_over_raw": self.settled_over_raw().map(|r| round(r, 3)),
            "invariants_ok": self.invariants_ok(),
            "invariant_failures": self.failures,
            "total_elapsed_s": round(self.total_elapsed_s, 3),
        });
        for part in [more, last] {
            if let (Some(all), Value::Object(part)) = (all.as_object_mut(), part) {
                all.extend(part);
            }
        }
        all
    }

    pub fn human(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!(
            "settled-bench: {} ({}), {} receipts, {} workers, batch {}, mix {}{}",
            self.backend,
            self.target,
            self.receipts,
            self.workers,
            self.batch,
            self.mix,
            self.rate
                .map_or_else(String::new, |r| format!(", rate limit {r}/s")),
        ));
        if self.idle_groups > 0 {
            line(format!(
                "  idle       {} groups named once and drained before the run",
                self.idle_groups
            ));
        }
        if self.preload > 0 {
            line(format!(
                "  preload    {} never-due receipts pending, enqueued via {}",
                self.preload,
                self.preload_via.as_deref().unwrap_or("?")
            ));
        }
        line(format!(
            "  enqueue    {:>9.0}/s  ({} in {:.2} s, batches of {}, {} producers, HTTP)",
            self.enqueued_per_sec,
            self.receipts,
            self.enqueue_elapsed_s,
            self.enqueue_batch,
            self.producers
        ));
        line(format!(
            "  settle     {:>9.0}/s  ({} finished in {:.2} s over HTTP)",
            self.settled_per_sec, self.receipts, self.elapsed_s
        ));
        line(format!(
            "  claim      p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({} requests, {} empty)",
            self.claim.ms(0.5),
            self.claim.ms(0.99),
            self.claim.ms(1.0),
            self.claim_requests,
            self.empty_claims
        ));
        line(format!(
            "  outcome    p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  ({} requests)",
            self.outcome.ms(0.5),
            self.outcome.ms(0.99),
            self.outcome.ms(1.0),
            self.outcome_requests
        ));
        line(format!(
            "  routes     settled {}, skipped {}, dead-lettered {}, retries {}, conflicts {}, errors {}",
            self.settled,
            self.skipped,
            self.dead_lettered,
            self.retries,
            self.conflicts,
            self.errors
        ));
        if let Some(rss) = self.peak_rss_mb {
            let cpu = self.server_cpu_s.map_or_else(String::new, |c| {
                format!(
                    ", {c:.1} s CPU while settling ({:.0}% of a core, {:.0} µs per receipt)",
                    100.0 * c / self.elapsed_s,
                    self.server_cpu_us_per_receipt().unwrap_or(0.0)
                )
            });
            let mut db = self.db_cpu_us_per_receipt().map_or_else(String::new, |c| {
                format!("; its PostgreSQL backends {c:.0} µs per receipt")
            });
            if let (Some(wal), Some(entries)) = (
                self.db_written_per_receipt(|w| w.wal_bytes),
                self.db_written_per_receipt(|w| w.index_entries),
            ) {
                db.push_str(&format!(
                    ", {wal:.0} WAL bytes and ≤ {entries:.1} index entries"
                ));
            }
            line(format!("  server     peak RSS {rss:.1} MB{cpu}{db}"));
        }
        if self.foreign_claims > 0 {
            line(format!(
                "  note       {} claims of other receipts on the server were released",
                self.foreign_claims
            ));
        }
        match (self.inprocess_settled_per_sec, self.http_over_inprocess()) {
            (Some(rate), Some(ratio)) => line(format!(
                "  in-process {rate:>9.0}/s settle, {:.0}/s enqueue (no HTTP)  ->  http/in-process {ratio:.2}",
                self.inprocess_enqueued_per_sec.unwrap_or(0.0)
            )),
            _ => line("  in-process skipped".into()),
        }
        if let (Some(raw), Some(share)) = (&self.raw, self.settled_over_raw()) {
            let cpu = raw
                .cpu_us_per_row
                .map_or_else(String::new, |c| format!(", bench CPU {c:.0} µs per row"));
            let cpu = raw.db_cpu_us_per_row.map_or(cpu.clone(), |c| {
                format!("{cpu}, PostgreSQL backends {c:.0} µs per row")
            });
            let commits = if raw.commit == "round" {
                "a commit per round of turns"
            } else {
                "a commit per claim and per completion"
            };
            line(format!(
                "  raw SQL    {:>9.0}/s settle, {:.0}/s enqueue (plain SQL, {} workers, {commits}{cpu})  ->  settled/raw {share:.2}",
                raw.per_sec, raw.enqueued_per_sec, raw.workers
            ));
        }
        if self.invariants_ok() {
            line(format!(
                "  invariants ok: every receipt finished exactly once, none accepted twice \
                 ({} read back by GET)",
                self.verified_receipts
            ));
        } else {
            line("  INVARIANTS FAILED:".into());
            for failure in &self.failures {
                line(format!("    - {failure}"));
            }
        }
        out
    }
}
