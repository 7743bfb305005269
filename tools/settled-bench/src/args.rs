//! The command line.

use clap::{Parser, ValueEnum};

use crate::common::Mix;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Benchmark settled: enqueue, settle over HTTP, check invariants, compare with in-process.
#[derive(Debug, Parser)]
#[command(name = "settled-bench", version)]
pub struct Args {
    /// Start the `settled` binary next to this one on a fresh database of this backend.
    #[arg(long, value_enum, conflicts_with = "url")]
    pub spawn: Option<Backend>,
    /// With --spawn postgres: start this many `settled` processes on the one
    /// fresh database; workers are spread over them in turn (worker n on
    /// replica n mod N), producers enqueue through the first.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub replicas: u16,
    /// Drive a running server instead (receipt ids are unique to the run).
    #[arg(long, required_unless_present = "spawn")]
    pub url: Option<String>,
    /// Bearer token for --url (a role that may enqueue, claim, report and read).
    #[arg(long)]
    pub token: Option<String>,
    /// PostgreSQL server on which fresh databases are created (and dropped at the end).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub postgres_url: String,
    /// Receipts to enqueue and settle.
    #[arg(long, default_value_t = 10_000)]
    pub receipts: usize,
    /// Receipts per `POST /v1/receipts/batch`.
    #[arg(long, default_value_t = 1024)]
    pub enqueue_batch: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Concurrent workers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Claim batch size (1: one outcome per request on /v1/receipts/{id}/outcome).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub batch: u16,
    /// Outcome weights: accepted, retryable (code rpc), permanent, skipped.
    #[arg(long, default_value = "accepted=90,retryable=8,permanent=2")]
    pub mix: Mix,
    /// Claim at most this many receipts a second (to measure latency at a given load).
    /// Retries are claims too, so receipts finish ~10% slower with the default mix.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Spread the receipts over this many groups (`g0000`, `g0001`, …), so
    /// that every claim is shared out over them (0: no group named).
    #[arg(long, default_value_t = 0)]
    pub groups: usize,
    /// Before the run, name this many groups with one receipt each and
    /// cancel those receipts: a group table of idle groups for the run's
    /// claims to meet (the run's `--groups` are among them).
    #[arg(long, default_value_t = 0)]
    pub idle_groups: usize,
    /// Extra receipts enqueued first, never due, sitting pending through the run.
    #[arg(long, default_value_t = 0)]
    pub preload: usize,
    /// HTTP workers send the outcomes of each batch with their next claim
    /// (`outcomes` of `POST /v1/claims`): one request per batch instead of two.
    #[arg(long)]
    pub carry: bool,
    /// With --replicas: each replica advertises its URL (`--advertise-url`),
    /// so that the one doing the upkeep takes the others' claims and outcomes.
    #[arg(long)]
    pub forward: bool,
    /// Lease length of claims.
    #[arg(long, default_value_t = 60_000)]
    pub lease_ms: u64,
    /// Give up settling after this many seconds (invariants then fail).
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// Read every receipt back when there are at most this many, else a sample.
    #[arg(long, default_value_t = 20_000)]
    pub verify_all_up_to: usize,
    /// Receipts read back when sampling.
    #[arg(long, default_value_t = 2_000)]
    pub verify_sample: usize,
    /// Skip the in-process comparison.
    #[arg(long)]
    pub no_inprocess: bool,
    /// Also run the same lease cycle as plain SQL on a fresh database of the
    /// same backend (no HTTP, no settled code) and report settled's share of it.
    #[arg(long)]
    pub raw: bool,
    /// Workers of the plain-SQL run (default: --workers). On SQLite they take
    /// turns on one connection; 1 claims and completes one batch at a time.
    #[arg(long, requires = "raw")]
    pub raw_workers: Option<usize>,
    /// SQLite plain-SQL run: commit every claim and every completion on its
    /// own, instead of one commit per round of the workers' turns.
    #[arg(long, requires = "raw")]
    pub raw_commit_each: bool,
    /// Print one JSON object on stdout (the summary then goes to stderr).
    #[arg(long)]
    pub json: bool,
}
