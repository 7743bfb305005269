//! `settled-bench`: enqueue receipts, settle them with concurrent HTTP
//! workers, measure throughput and latency, check that nothing was lost or
//! settled twice, and compare with the same workload driven straight through
//! the store in-process and, with `--raw`, as plain SQL (the ceiling).
//!
//! Build first: `cargo build --release --bins`, then e.g.
//! `target/release/settled-bench --spawn sqlite --receipts 50000 --workers 8 --batch 256`.

mod args;
mod common;
mod counts;
mod cpu;
mod db_cpu;
mod http;
mod idle;
mod inproc;
mod pg_cost;
mod raw;
mod report;
mod server;
mod settle;
mod tasks;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use args::{Args, Backend};
use clap::Parser;

use common::{Ids, Ledger, Pacer, Res, err, far_future_ms, progress, run_id};
use http::Api;
use inproc::Workload;
use report::Report;
use server::{FreshDb, Server};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        eprintln!("settled-bench: --rate must be a positive number");
        return ExitCode::from(2);
    }
    let mut dbs = Vec::new();
    let result = bench(&args, &mut dbs).await;
    for db in &dbs {
        db.drop_db().await;
    }
    match result {
        Ok(report) => {
            if args.json {
                eprint!("{}", report.human());
                println!("{}", report.json());
            } else {
                print!("{}", report.human());
            }
            if report.invariants_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("settled-bench: {e}");
            ExitCode::from(2)
        }
    }
}

async fn fresh(backend: &str, args: &Args, dbs: &mut Vec<FreshDb>) -> Res<String> {
    let db = match backend {
        "sqlite" => FreshDb::sqlite()?,
        "postgres" => FreshDb::postgres(&args.postgres_url).await?,
        other => return Err(err(format!("unknown backend {other}"))),
    };
    let url = db.url().to_owned();
    dbs.push(db);
    Ok(url)
}

fn workload(args: &Args) -> Workload {
    Workload {
        receipts: args.receipts,
        preload: args.preload,
        enqueue_batch: args.enqueue_batch.clamp(1, 1024),
        producers: args.producers.max(1),
        workers: args.workers.max(1),
        batch: usize::from(args.batch),
        lease_ms: args.lease_ms,
        mix: args.mix.clone(),
        deadline: Duration::from_secs(args.timeout_s),
        groups: args.groups,
        carry: args.carry,
    }
}

async fn bench(args: &Args, dbs: &mut Vec<FreshDb>) -> Res<Report> {
    let begun = Instant::now();
    let w = workload(args);
    let run = run_id();
    let preload_ids = Ids {
        prefix: format!("pre-{run}"),
        groups: 0,
    };
    let mut preload_via = None;
    let (apis, mut servers, backend, policy, target) = if let Some(kind) = args.spawn {
        let backend = if kind == Backend::Sqlite {
            "sqlite"
        } else {
            "postgres"
        };
        let url = fresh(backend, args, dbs).await?;
        if w.preload > 0 {
            // Straight into the database, before the server opens it.
            let store = inproc::open(&url).await?;
            let (n, far) = (w.preload, Some(far_future_ms()));
            let label = "preload (in-process store)";
            inproc::enqueue(&store, &preload_ids, n, 4096, 2, far, label).await?;
            drop(store);
            preload_via = Some("the in-process store, before the server started".to_owned());
        }
        if args.replicas > 1 && kind != Backend::Postgres {
            return Err(err(
                "--replicas needs --spawn postgres (one SQLite file, one process)",
            ));
        }
        let servers = (0..args.replicas)
            .map(|_| Server::spawn(&url, args.forward))
            .collect::<Res<Vec<_>>>()?;
        if args.forward {
            // Each replica looks for the upkeep's holder once a second.
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        let apis = servers
            .iter()
            .map(|s| Api::new(&s.base, None))
            .collect::<Res<Vec<_>>>()?;
        let bases: Vec<&str> = servers.iter().map(|s| s.base.as_str()).collect();
        let target = format!("spawned {}", bases.join(" "));
        (
            apis,
            servers,
            backend.to_owned(),
            server::FAST_RETRY,
            target,
        )
    } else {
        let base = args.url.as_deref().ok_or_else(|| err("--url or --spawn"))?;
        let api = Api::new(base, args.token.as_deref())?;
        let (backend, policy) = api.info().await?;
        if w.preload > 0 {
            let far = Some(far_future_ms());
            let label = "preload (HTTP)";
            api.enqueue(&preload_ids, w.preload, 1024, w.producers, far, label)
                .await?;
            preload_via = Some("HTTP batch".to_owned());
        }
        (vec![api], Vec::new(), backend, policy, base.to_owned())
    };
    let api = &apis[0];
    eprintln!("settled-bench: {backend} at {}", api.base);
    if args.idle_groups > 0 {
        idle::name_and_drain(api, &run, args.idle_groups, w.producers).await?;
    }
    let mut failures = Vec::new();
    let before = api.counts().await?;

    let ids = Ids {
        prefix: format!("bench-{run}"),
        groups: w.groups,
    };
    let started = Instant::now();
    let label = "enqueue (HTTP)";
    let refused = api
        .enqueue(&ids, w.receipts, w.enqueue_batch, w.producers, None, label)
        .await?;
    let enqueue_elapsed_s = started.elapsed().as_secs_f64();
    if refused > 0 {
        failures.push(format!("http: {refused} receipts were not created"));
    }

    let ledger = Arc::new(Ledger::new(w.receipts));
    let (shown, pid) = (ledger.clone(), servers.first().map(|s| s.pid));
    let ticker = progress(
        "settle (HTTP)".into(),
        w.receipts,
        Arc::new(move || {
            let rss = pid
                .and_then(server::vm_rss_mb)
                .map_or_else(String::new, |m| format!(", server RSS {m:.0} MB"));
            let extra = format!(
                ", retries {}, conflicts {}, errors {}{rss}",
                Ledger::get(&shown.retries),
                Ledger::get(&shown.conflicts),
                Ledger::get(&shown.errors)
            );
            (shown.done.load(Ordering::Relaxed), extra)
        }),
    );
    let pacer = args.rate.map(|r| Arc::new(Pacer::new(r)));
    // The spawned server's database is the first one made.
    let spawned = !servers.is_empty();
    let db_cpu = match (spawned, dbs.first()) {
        (true, Some(db)) => db_cpu::DbCpu::start(db.url()).await,
        _ => None,
    };
    let pg_cost = match (spawned, dbs.first()) {
        (true, Some(db)) => pg_cost::PgCost::start(db.url()).await,
        _ => None,
    };
    let cpu_before = server::summed(&servers, Server::cpu_s);
    let written_before = server::summed(&servers, Server::written_bytes);
    let started = Instant::now();
    let stats = settle::run(&apis, &ids, &ledger, &w, pacer).await;
    let elapsed_s = started.elapsed().as_secs_f64();
    let server_cpu_s = server::summed(&servers, Server::cpu_s)
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let server_written_bytes = server::summed(&servers, Server::written_bytes)
        .zip(written_before)
        .map(|(after, before)| after.saturating_sub(before));
    let db_cpu_s = match db_cpu {
        Some(d) => d.finish().await,
        None => None,
    };
    let db_written = match pg_cost {
        Some(c) => c.finish().await,
        None => None,
    };
    ticker.abort();
    let stats = stats?;

    let after = api.counts().await?;
    counts::check(&before, &after, &w, &ledger, spawned, &mut failures);
    ledger.check(&mut failures, "http");
    let verify = (args.verify_all_up_to, args.verify_sample);
    let verified_receipts = api
        .verify(&ids, &ledger, verify, w.workers.min(16), &mut failures)
        .await?;
    // The largest replica's.
    let peak_rss_mb = servers
        .iter()
        .filter_map(Server::peak_rss_mb)
        .reduce(f64::max);
    for server in &mut servers {
        if !server.stop() {
            eprintln!("settled-bench: warning: a server did not exit 0 on SIGTERM");
        }
    }

    let inprocess = if args.no_inprocess {
        None
    } else {
        let url = fresh(&backend, args, dbs).await?;
        let store = inproc::open(&url).await?;
        let result = inproc::run(store, &w, policy).await?;
        failures.extend(result.failures.iter().cloned());
        Some(result)
    };
    let raw = if args.raw {
        let url = fresh(&backend, args, dbs).await?;
        let w = Workload {
            workers: args.raw_workers.unwrap_or(w.workers).max(1),
            ..w.clone()
        };
        let result = raw::run(&url, &w, policy, args.raw_commit_each).await?;
        failures.extend(result.failures.iter().cloned());
        Some(result)
    } else {
        None
    };

    let claim = stats.claim.finish();
    let outcome = stats.outcome.finish();
    Ok(Report {
        backend,
        target,
        receipts: w.receipts,
        workers: w.workers,
        replicas: apis.len(),
        batch: w.batch,
        enqueue_batch: w.enqueue_batch,
        producers: w.producers,
        mix: w.mix.text.clone(),
        rate: args.rate,
        preload: w.preload,
        idle_groups: args.idle_groups,
        preload_via,
        enqueued_per_sec: w.receipts as f64 / enqueue_elapsed_s,
        enqueue_elapsed_s,
        settled_per_sec: ledger.done.load(Ordering::Relaxed) as f64 / elapsed_s,
        elapsed_s,
        claim_requests: claim.0.len(),
        outcome_requests: outcome.0.len(),
        claim,
        outcome,
        empty_claims: Ledger::get(&ledger.empty_claims),
        settled: Ledger::get(&ledger.settled),
        skipped: Ledger::get(&ledger.skipped),
        dead_lettered: Ledger::get(&ledger.dead_lettered),
        retries: Ledger::get(&ledger.retries),
        conflicts: Ledger::get(&ledger.conflicts),
        errors: Ledger::get(&ledger.errors),
        foreign_claims: Ledger::get(&ledger.foreign),
        server_cpu_s,
        server_written_bytes,
        db_cpu_s,
        db_written,
        peak_rss_mb,
        verified_receipts,
        counts_before: serde_json::to_value(before)?,
        counts_after: serde_json::to_value(after)?,
        inprocess_settled_per_sec: inprocess.as_ref().map(|r| r.settled_per_sec),
        inprocess_enqueued_per_sec: inprocess.as_ref().map(|r| r.enqueued_per_sec),
        inprocess_elapsed_s: inprocess.as_ref().map(|r| r.elapsed_s),
        raw,
        failures,
        total_elapsed_s: begun.elapsed().as_secs_f64(),
    })
}
