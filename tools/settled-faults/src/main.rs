//! `settled-faults`: run the real `settled` under injected faults with
//! producers and workers as clients write them, record every answer, then
//! check the final database and history against what was acknowledged and
//! print one table: lost, settled twice, stale commits accepted, overlapping
//! leases, outcomes missing from history, history contradicting state, and
//! recovery times. Exits non-zero when a count that must be zero is not.
//!
//! Build first (`cargo build --release --bins`), then, as root (it mounts a
//! small tmpfs for SQLite and may restart the local PostgreSQL cluster):
//! `target/release/settled-faults run --duration 5m --allow-postgres-restart`.
//! `--scenario postgres-ha` runs on a Patroni cluster of its own
//! (tests/ha/cluster.sh, ports 55431-55433). See RELIABILITY.md.

mod check;
mod cluster;
mod database;
mod faults;
mod ha;
mod ha_faults;
mod proxy;
mod record;
mod recovery;
mod scenario;
mod table;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use faults::Fault;
use scenario::{Scenario, Settings};

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Settle receipts under injected faults and count what went wrong.
#[derive(Debug, Parser)]
#[command(name = "settled-faults", version)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run scenarios against the `settled` binary next to this one.
    Run(RunArgs),
    /// Check recordings of earlier runs again (`recording.json` files).
    Check { files: Vec<PathBuf> },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Scenarios to run (default: sqlite, postgres and postgres-3).
    #[arg(long = "scenario", value_enum)]
    scenarios: Vec<Scenario>,
    /// Faults to inject (default: every fault the scenario's backend has).
    #[arg(long = "fault", value_enum)]
    faults: Vec<Fault>,
    /// Time under faults, per scenario (the drain and the check come after).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Quiet time before each fault of the first half.
    #[arg(long, default_value = "6s", value_parser = humantime::parse_duration)]
    gap: Duration,
    /// PostgreSQL server on which a fresh database is made (and dropped).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    postgres_url: String,
    /// Restart the local PostgreSQL cluster (`pg_ctlcluster`) as a fault:
    /// only where nothing else uses it.
    #[arg(long)]
    allow_postgres_restart: bool,
    /// Receipts enqueued per second (all producers together).
    #[arg(long, default_value_t = 300)]
    rate: u64,
    /// Workers (half claim in batches of up to 16, half one by one).
    #[arg(long, default_value_t = 6)]
    workers: usize,
    /// Lease asked for by every claim and extension.
    #[arg(long, default_value_t = 1_500)]
    lease_ms: u64,
    /// Where each run's recording, report and server logs go.
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// postgres-ha: replicate asynchronously (`cluster.sh up --async`); lost
    /// and settled twice are then counted but do not fail the run.
    #[arg(long)]
    ha_async: bool,
    /// postgres-ha: the script that runs the cluster.
    #[arg(long, default_value = ha::DEFAULT_SCRIPT)]
    ha_cluster: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("settled-faults: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.command {
        Command::Check { files } => recheck(&files),
        Command::Run(run) => runtime.block_on(run_all(run)),
    }
}

fn recheck(files: &[PathBuf]) -> ExitCode {
    let mut reports = Vec::new();
    for file in files {
        let read = std::fs::read(file)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                serde_json::from_slice::<record::Recording>(&b).map_err(|e| e.to_string())
            });
        match read {
            Ok(recording) => reports.push(check::check(&recording)),
            Err(e) => {
                eprintln!("settled-faults: {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        }
    }
    print!("{}", table::render(&reports));
    table::verdict(&reports, 0)
}

async fn run_all(args: RunArgs) -> ExitCode {
    let scenarios = if args.scenarios.is_empty() {
        vec![Scenario::Sqlite, Scenario::Postgres, Scenario::Postgres3]
    } else {
        args.scenarios.clone()
    };
    let settings = Settings {
        duration: args.duration,
        gap: args.gap,
        postgres_url: args.postgres_url.clone(),
        allow_postgres_restart: args.allow_postgres_restart,
        rate: args.rate,
        workers: args.workers.max(2),
        lease_ms: args.lease_ms,
        out: args.out.clone(),
        seed: args.seed,
        faults: args.faults.clone(),
        ha_script: args.ha_cluster.clone(),
        ha_async: args.ha_async,
    };
    // A cluster is started in sessions of its own: take it down on an
    // interrupt too (drops take it down on errors and panics).
    tokio::spawn(async {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("settled-faults: interrupted");
        let _ = tokio::task::spawn_blocking(ha::down_all).await;
        std::process::exit(130);
    });
    let mut reports = Vec::new();
    let mut failed = 0;
    for scenario in scenarios {
        eprintln!("scenario {}", scenario.name());
        match scenario::run(scenario, &settings).await {
            Ok(report) => {
                for finding in &report.examples {
                    eprintln!("  finding: {finding}");
                }
                reports.push(report);
            }
            Err(e) => {
                eprintln!(
                    "settled-faults: scenario {} could not run: {e}",
                    scenario.name()
                );
                failed += 1;
            }
        }
    }
    print!("{}", table::render(&reports));
    table::verdict(&reports, failed)
}
