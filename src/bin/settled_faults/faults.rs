//! The faults, and the schedule that injects them: each kind alone in turn,
//! then several at once (on several replicas) until the run's time is up.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use sqlx::Connection;

use super::cluster::{Replica, fill, restart_postgres};
use super::proxy::{Mode, Proxy};
use super::rng::Rng;
use super::workload::Workload;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum Fault {
    /// SIGKILL a server, start it again on the same database.
    Kill,
    /// SIGSTOP a server for longer than a lease, then SIGCONT.
    PauseServer,
    /// Workers hold what they claim past its lease, then commit.
    PauseWorkers,
    /// `pg_terminate_backend` of every connection of settled's database.
    TerminateBackends,
    /// `pg_ctlcluster … restart` of the PostgreSQL cluster.
    RestartPostgres,
    /// Every chunk between settled and PostgreSQL held 150 ms.
    ProxyDelay,
    /// Nothing passes between settled and PostgreSQL for longer than a lease.
    ProxyStall,
    /// Every connection between settled and PostgreSQL cut, three times.
    ProxyCut,
    /// The SQLite database's filesystem filled up, then freed.
    DiskFull,
    /// One server's wall clock stepped 2 minutes forward, then back.
    ClockStep,
}

impl Fault {
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned())
    }

    /// What it acts on: faults on one thing are never injected at once.
    fn lock_key(self, replica: usize) -> String {
        match self {
            Self::Kill | Self::PauseServer | Self::ClockStep => format!("replica-{replica}"),
            Self::PauseWorkers => "workers".into(),
            Self::DiskFull => "disk".into(),
            _ => "database".into(),
        }
    }
}

/// What the faults act on.
pub struct Target {
    pub replicas: Vec<Arc<Mutex<Replica>>>,
    pub proxy: Option<Proxy>,
    /// The SQLite database's directory, on its own small filesystem.
    pub disk: Option<PathBuf>,
    /// The admin URL of settled's database, for `pg_terminate_backend`.
    pub postgres: Option<(String, String)>,
    pub work: Arc<Workload>,
}

impl Target {
    async fn with_replica<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce(&mut Replica) -> T + Send + 'static,
    ) -> T {
        let replica = self.replicas[i].clone();
        tokio::task::spawn_blocking(move || {
            f(&mut replica.lock().unwrap_or_else(|p| p.into_inner()))
        })
        .await
        .expect("a replica task panicked")
    }

    /// Start replica `i` again, as often as it takes (the database may be
    /// restarting, the disk full).
    pub async fn restart(&self, i: usize) {
        for attempt in 0.. {
            let started = self
                .with_replica(i, |r| {
                    r.start(Duration::from_secs(30)).map_err(|e| e.to_string())
                })
                .await;
            match started {
                Ok(()) => return,
                Err(e) if attempt % 5 == 0 => eprintln!("  restarting replica {i}: {e}"),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Inject one fault and wait until it is over (the server back, the
    /// proxy passing, the disk freed, the clock true again).
    pub async fn inject(&self, fault: Fault, replica: usize) {
        let lease = Duration::from_millis(self.work.lease_ms);
        let started = self.work.rec.now_ms();
        match fault {
            Fault::Kill => {
                self.with_replica(replica, Replica::kill).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                self.restart(replica).await;
            }
            Fault::PauseServer => {
                self.with_replica(replica, |r| r.pause(true)).await;
                tokio::time::sleep(lease + Duration::from_secs(1)).await;
                self.with_replica(replica, |r| r.pause(false)).await;
            }
            Fault::PauseWorkers => {
                self.work.hold_workers.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.work.hold_workers.store(false, Ordering::SeqCst);
                tokio::time::sleep(lease + Duration::from_millis(500)).await;
            }
            Fault::TerminateBackends => {
                for _ in 0..3 {
                    if let Err(e) = self.terminate_backends().await {
                        eprintln!("  pg_terminate_backend: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
            }
            Fault::RestartPostgres => {
                let done =
                    tokio::task::spawn_blocking(|| restart_postgres().map_err(|e| e.to_string()))
                        .await;
                if let Ok(Err(e)) | Err(e) = done.map_err(|e| e.to_string()) {
                    eprintln!("  restarting PostgreSQL: {e}");
                }
            }
            Fault::ProxyDelay | Fault::ProxyStall => {
                let (mode, hold) = if fault == Fault::ProxyDelay {
                    (
                        Mode::Delay(Duration::from_millis(150)),
                        Duration::from_secs(3),
                    )
                } else {
                    (Mode::Stall, lease + Duration::from_secs(1))
                };
                if let Some(proxy) = &self.proxy {
                    proxy.set(mode);
                    tokio::time::sleep(hold).await;
                    proxy.set(Mode::Pass);
                }
            }
            Fault::ProxyCut => {
                if let Some(proxy) = &self.proxy {
                    for _ in 0..3 {
                        proxy.cut();
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
            Fault::DiskFull => {
                if let Some(disk) = &self.disk {
                    let filler = tokio::task::block_in_place(|| fill(disk));
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    let _ = std::fs::remove_file(filler);
                }
            }
            Fault::ClockStep => {
                for step in [120, -120] {
                    self.with_replica(replica, move |r| r.step_clock(step))
                        .await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                self.with_replica(replica, |r| r.step_clock(0)).await;
                // libfaketime reads its file again within a second.
                tokio::time::sleep(Duration::from_millis(1_200)).await;
            }
        }
        self.work.rec.fault(&fault.name(), started);
    }

    async fn terminate_backends(&self) -> Result<u64, sqlx::Error> {
        let Some((admin, database)) = &self.postgres else {
            return Ok(0);
        };
        let mut conn = sqlx::PgConnection::connect(admin).await?;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(database)
        .fetch_one(&mut conn)
        .await?;
        let _ = conn.close().await;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Run the schedule until `until`: every kind alone, in turn, with a quiet
/// gap before each (so that recovery is measured against a steady rate),
/// for the first half at least once each; then faults at once on random
/// targets (several replicas, the database and the workers together), for
/// what is left of the run and at least four gaps.
pub async fn schedule(
    target: Arc<Target>,
    faults: Vec<Fault>,
    until: Instant,
    gap: Duration,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let replicas = target.replicas.len();
    let start = Instant::now();
    let half = start + (until - start) / 2;
    let mut round = 0;
    while round == 0 || Instant::now() < half {
        for &fault in &faults {
            tokio::time::sleep(gap).await;
            let replica = rng.below(replicas);
            eprintln!(
                "  {:>6.1} s  {} (replica {replica})",
                start.elapsed().as_secs_f64(),
                fault.name()
            );
            target.inject(fault, replica).await;
        }
        round += 1;
    }
    eprintln!("  {:>6.1} s  mixed faults", start.elapsed().as_secs_f64());
    let locks: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut running = tokio::task::JoinSet::new();
    // Mixed faults for what is left, and a few rounds of them however short the run.
    let until = until.max(Instant::now() + gap * 4);
    while Instant::now() + gap < until {
        tokio::time::sleep(gap / 2).await;
        // Up to three at once, never two on the same thing.
        if running.len() >= 3 {
            let _ = running.join_next().await;
            continue;
        }
        let fault = faults[rng.below(faults.len())];
        let replica = rng.below(replicas);
        let key = fault.lock_key(replica);
        if !locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone())
        {
            continue;
        }
        let (target, locks) = (target.clone(), locks.clone());
        running.spawn(async move {
            target.inject(fault, replica).await;
            locks.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        });
    }
    while running.join_next().await.is_some() {}
}
