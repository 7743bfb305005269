//! One scenario: a database, `settled` replicas on it, the workload, the
//! fault schedule, a drain, the final state read back, and the check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use futures_util::StreamExt;
use serde_json::Value;

use settled_test_support::process;
use settled_test_support::rng::Rng;

use super::Res;
use super::check::{self, Report};
use super::cluster::{LIBFAKETIME, Replica};
use super::database::Database;
use super::faults::{self, Fault, Target};
use super::ha::PG_TCP_TIMEOUT_MS;
use super::record::{Entry, Final, OpKind, Recorder};
use super::workload::Workload;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// One server on a SQLite file in a small tmpfs.
    Sqlite,
    /// One server on PostgreSQL, through the harness's TCP proxy.
    Postgres,
    /// Three servers on one PostgreSQL; one host's clock is 30 s fast.
    #[value(name = "postgres-3")]
    Postgres3,
    /// As `postgres-3`, each replica advertising its URL (`--advertise-url`):
    /// the one doing the upkeep takes the others' worker writes.
    #[value(name = "postgres-3-forwarding")]
    Postgres3Forwarding,
    /// Two servers on a Patroni cluster of three PostgreSQL nodes
    /// (tests/ha/cluster.sh), through a proxy per node.
    #[value(name = "postgres-ha")]
    PostgresHa,
}

impl Scenario {
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }

    fn faults(self, allow_restart: bool) -> Vec<Fault> {
        let mut faults = Vec::new();
        if self == Self::PostgresHa {
            // First, so that a short run has each of them alone in time.
            faults.extend([
                Fault::Switchover,
                Fault::Failover,
                Fault::DemoteInPlace,
                Fault::IsolatePrimary,
                Fault::LoseStandby,
            ]);
        }
        faults.extend([Fault::Kill, Fault::PauseServer, Fault::PauseWorkers]);
        if self == Self::Sqlite {
            faults.push(Fault::DiskFull);
        } else {
            faults.extend([
                Fault::TerminateBackends,
                Fault::ProxyDelay,
                Fault::ProxyStall,
                Fault::ProxyCut,
            ]);
            // The local cluster's restart; not the HA cluster's nodes.
            if allow_restart && self != Self::PostgresHa {
                faults.push(Fault::RestartPostgres);
            }
        }
        faults.push(Fault::ClockStep);
        faults
    }
}

pub struct Settings {
    pub duration: Duration,
    pub gap: Duration,
    pub postgres_url: String,
    pub allow_postgres_restart: bool,
    pub rate: u64,
    pub workers: usize,
    pub lease_ms: u64,
    pub out: PathBuf,
    pub seed: u64,
    /// Only these faults (empty: all the scenario has).
    pub faults: Vec<Fault>,
    /// `postgres-ha`: the cluster's script, and asynchronous replication.
    pub ha_script: PathBuf,
    pub ha_async: bool,
}

fn settled_exe() -> Res<PathBuf> {
    let me = std::env::current_exe()?;
    let exe = me.with_file_name("settled");
    if exe.exists() {
        Ok(exe)
    } else {
        Err(format!(
            "no settled binary beside {} (cargo build --bins)",
            me.display()
        )
        .into())
    }
}

pub async fn run(scenario: Scenario, settings: &Settings) -> Res<Report> {
    let exe = settled_exe()?;
    let run = format!(
        "{}_{}",
        scenario.name().replace('-', "_"),
        std::process::id()
    );
    let dir = std::path::absolute(settings.out.join(format!(
        "{}-{}",
        scenario.name(),
        std::process::id()
    )))?;
    std::fs::create_dir_all(&dir)?;
    let database = Database::make(scenario, settings, &dir, &run).await?;
    let result = run_on(scenario, settings, &exe, &dir, &run, &database).await;
    database.remove().await;
    let report = result?;
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(&report)?)?;
    eprintln!("  recording, report and server logs: {}", dir.display());
    Ok(report)
}

async fn run_on(
    scenario: Scenario,
    settings: &Settings,
    exe: &Path,
    dir: &Path,
    run: &str,
    database: &Database,
) -> Res<Report> {
    let url = database.url()?;
    let mut faults = scenario.faults(settings.allow_postgres_restart);
    if !settings.faults.is_empty() {
        faults.retain(|f| settings.faults.contains(f));
    }
    if faults.is_empty() {
        return Err(format!("none of the chosen faults applies to {}", scenario.name()).into());
    }
    let fake_clock = Path::new(LIBFAKETIME).exists();
    if !fake_clock && faults.contains(&Fault::ClockStep) {
        return Err(format!(
            "clock-step needs libfaketime ({LIBFAKETIME}, Debian's faketime); \
             install it, or choose the faults with --fault"
        )
        .into());
    }
    let count = match scenario {
        Scenario::Postgres3 | Scenario::Postgres3Forwarding => 3,
        Scenario::PostgresHa => 2,
        _ => 1,
    };
    let tcp_timeout = PG_TCP_TIMEOUT_MS.to_string();
    let extra: &[&str] = if scenario == Scenario::PostgresHa {
        &["--pg-tcp-timeout-ms", &tcp_timeout]
    } else {
        &[]
    };
    let mut replicas = Vec::new();
    for i in 0..count {
        // The third host's clock is 30 s fast all along.
        let skew = fake_clock.then_some(if i == 2 { 30 } else { 0 });
        let mut replica =
            Replica::new(&format!("settled-{i}"), exe, &url, dir, skew).with_args(extra);
        if scenario == Scenario::Postgres3Forwarding {
            // One address for the whole run: the others forward to it across restarts.
            replica = replica.advertised(&process::free_loopback_address()?);
        }
        replica.start(Duration::from_secs(60))?;
        replicas.push(Arc::new(Mutex::new(replica)));
    }
    let bases = replicas
        .iter()
        .map(|r| r.lock().unwrap_or_else(|p| p.into_inner()).base.clone())
        .collect();
    let rec = Arc::new(Recorder::new());
    let work = Arc::new(Workload::new(
        rec.clone(),
        bases,
        run,
        settings.rate,
        settings.lease_ms,
    )?);
    let target = Arc::new(Target {
        replicas,
        proxy: match database {
            Database::Postgres { proxy, .. } => Some(proxy.clone()),
            _ => None,
        },
        disk: match database {
            Database::Sqlite { disk } => Some(disk.dir.clone()),
            _ => None,
        },
        postgres: match database {
            Database::Postgres { admin, name, .. } => Some((admin.clone(), name.clone())),
            _ => None,
        },
        cluster: match database {
            Database::Cluster(cluster) => Some(cluster.clone()),
            _ => None,
        },
        work: work.clone(),
    });

    let producers = 2;
    let mut producing = tokio::task::JoinSet::new();
    for p in 0..producers {
        producing.spawn(work.clone().produce(producers, settings.seed * 1_000 + p));
    }
    let mut working = tokio::task::JoinSet::new();
    for w in 0..settings.workers {
        let batch = if w % 2 == 0 { 16 } else { 1 };
        working.spawn(
            work.clone()
                .work(w, batch, settings.seed * 1_000 + 100 + w as u64),
        );
    }

    let until = Instant::now() + settings.duration;
    let expected: Vec<String> = faults.iter().map(|f| f.name()).collect();
    // On the cluster, each of its faults at least once a minute of the run.
    let cluster_min = usize::try_from(settings.duration.as_secs() / 60)
        .unwrap_or(1)
        .max(1);
    faults::schedule(
        target.clone(),
        faults,
        until,
        settings.gap,
        settings.seed,
        cluster_min,
    )
    .await;
    // A quiet tail at the full rate, so that recovery from the last faults is
    // measured against the same work as before them.
    tokio::time::sleep(Duration::from_secs(10).min(settings.gap * 2)).await;
    // What is read back must be the primary's: every replica writes there.
    let problems = match database {
        Database::Cluster(cluster) => cluster.check_followers(&work).await,
        _ => Vec::new(),
    };

    // Every fault is over: stop producing, let every batch be acknowledged,
    // then let the workers finish everything that is active.
    work.stop_producing.store(true, Ordering::SeqCst);
    while producing.join_next().await.is_some() {}
    let mut rng = Rng::new(settings.seed ^ 0xD5A1);
    let drain_until = Instant::now() + Duration::from_secs(180);
    let mut total = 0;
    while Instant::now() < drain_until {
        if let Some((active, all)) = work.counts(&mut rng).await {
            total = all;
            if active == 0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    work.stop_working.store(true, Ordering::SeqCst);
    while working.join_next().await.is_some() {}
    if let Some((_, all)) = work.counts(&mut rng).await {
        total = all;
    }

    let mut recording = rec.take_recording(&scenario.name());
    recording.expected_faults = expected;
    recording.async_replication = settings.ha_async && scenario == Scenario::PostgresHa;
    recording.problems = problems;
    recording.total_stored = total;
    recording.finals = read_finals(&work, &recording.ops).await;
    drop(target);
    std::fs::write(dir.join("recording.json"), serde_json::to_vec(&recording)?)?;
    Ok(check::check(&recording))
}

/// Every receipt an enqueue was attempted for, as the server holds it now.
async fn read_finals(
    work: &Workload,
    ops: &[super::record::Op],
) -> BTreeMap<String, Option<Final>> {
    let mut ids: Vec<&str> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Enqueue)
        .map(|o| o.receipt.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    futures_util::stream::iter(ids.into_iter().enumerate())
        .map(|(i, id)| async move {
            let mut rng = Rng::new(i as u64 + 7);
            let body = work.receipt(&mut rng, id).await;
            (id.to_owned(), body.and_then(|b| parse_final(&b)))
        })
        .buffer_unordered(16)
        .collect()
        .await
}

fn parse_final(body: &Value) -> Option<Final> {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let state = text(&body["state"])?;
    let history = body["history"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| Entry {
                    outcome: text(&e["outcome"]).unwrap_or_default(),
                    worker_id: text(&e["worker_id"]).unwrap_or_default(),
                    transcript_id: text(&e["transcript_id"]),
                    route: text(&e["route"]),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Final {
        state,
        transcript_id: text(&body["transcript_id"]),
        history,
    })
}
