//! The faults on the `postgres-ha` cluster: a planned switchover, the
//! leader killed, the leader demoted in place (read-only, its sockets open),
//! the leader's proxy stalled, a standby lost. Each holds the cluster alone
//! and ends with `cluster.sh wait-healthy`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use super::Res;
use super::faults::Fault;
use super::ha::{Cluster, NODE_PORTS, PG_TCP_TIMEOUT_MS, admin_url, parse_member};
use super::proxy::Mode;
use super::record::{FaultSpan, Recorder};
use super::workload::Workload;

impl Cluster {
    /// One fault on the cluster, then `wait-healthy`; its span, or `None`
    /// when it could not be injected.
    pub async fn inject(&self, fault: Fault, work: &Workload) -> Option<FaultSpan> {
        let injected = match fault {
            Fault::Switchover | Fault::Failover | Fault::DemoteInPlace => {
                self.writer_change(fault, work).await
            }
            Fault::IsolatePrimary => self.isolate_primary(work).await,
            Fault::LoseStandby => self.lose_standby(work).await,
            _ => return None,
        };
        let span = injected
            .map_err(|e| eprintln!("  {} not injected: {e}", fault.name()))
            .ok();
        self.wait_healthy().await;
        span
    }

    /// The leader's proxy passes nothing, connections open, for longer than
    /// a lease and than settled's TCP timeout; Patroni sees nothing of it.
    async fn isolate_primary(&self, work: &Workload) -> Res<FaultSpan> {
        let (name, i) = self.primary().await?;
        let hold = Duration::from_millis(work.lease_ms.max(PG_TCP_TIMEOUT_MS) + 1_500);
        let start_ms = work.rec.now_ms();
        self.proxies[i].set(Mode::Stall);
        tokio::time::sleep(hold).await;
        self.proxies[i].set(Mode::Pass);
        eprintln!("    {name}'s proxy stalled for {:.1} s", hold.as_secs_f64());
        Ok(span(
            Fault::IsolatePrimary,
            start_ms,
            work.rec.now_ms(),
            None,
        ))
    }

    /// A standby stopped (the synchronous one, if any): the span ends once it
    /// is down; it is started again after a lease and a half.
    async fn lose_standby(&self, work: &Workload) -> Res<FaultSpan> {
        let start_ms = work.rec.now_ms();
        let stopped = self.run(&["stop-standby"], Duration::from_secs(90)).await;
        let end_ms = work.rec.now_ms();
        if stopped.is_ok() {
            tokio::time::sleep(Duration::from_millis(work.lease_ms * 3 / 2)).await;
        }
        let started = self.run(&["start-standby"], Duration::from_secs(60)).await;
        let name = stopped?;
        started?;
        eprintln!("    {name} stopped and started again");
        Ok(span(Fault::LoseStandby, start_ms, end_ms, None))
    }

    /// Switchover, leader killed or demoted in place: the span runs from the
    /// command to the promotion (to `thaw` for a demotion), which is the
    /// first instant the new leader was seen taking writes (polled every
    /// 50 ms) or the command returned with it running, whichever is first.
    async fn writer_change(&self, fault: Fault, work: &Workload) -> Res<FaultSpan> {
        let rec = &work.rec;
        let (old, old_index) = self.primary().await?;
        let others: Vec<usize> = (0..NODE_PORTS.len()).filter(|i| *i != old_index).collect();
        let start_ms = rec.now_ms();
        let watch = tokio::spawn(watch_promotion(others, rec.clone()));
        let stop_watching = watch.abort_handle();
        let command = match fault {
            Fault::Switchover => "switchover",
            Fault::Failover => "kill-primary",
            _ => "demote-in-place",
        };
        let answer = self.run(&[command], Duration::from_secs(90)).await;
        let returned_ms = rec.now_ms();
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                stop_watching.abort();
                if fault == Fault::DemoteInPlace {
                    self.thaw().await;
                }
                return Err(e);
            }
        };
        // kill-primary returns at once; the others once the new leader runs.
        let wait = Duration::from_secs(if fault == Fault::Failover { 60 } else { 3 });
        let seen = tokio::time::timeout(wait, watch)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        stop_watching.abort();
        let promoted_ms = match (fault, seen) {
            (Fault::Failover, seen) => seen.map(|(_, at)| at),
            (_, Some((_, at))) => Some(at.min(returned_ms)),
            (_, None) => Some(returned_ms),
        };
        let leader = match (seen, fault) {
            (Some((i, _)), _) => Some(i),
            (None, Fault::Failover) => None,
            (None, _) => parse_member(&answer).ok().map(|(_, i)| i),
        };
        let from = promoted_ms.unwrap_or(returned_ms);
        match leader {
            Some(leader) => {
                eprintln!(
                    "    {old} -> pg{}: promoted {:.2} s after the start",
                    leader + 1,
                    from.saturating_sub(start_ms) as f64 / 1e3
                );
                // What the database and each replica did since: for the logs.
                let (db, followed) = tokio::join!(
                    first_db_commit(leader, rec, from),
                    self.followers(work, leader, from, Duration::from_secs(20))
                );
                eprintln!(
                    "    the new primary took a commit after {}; settled replicas writing to it after {}",
                    seconds(db),
                    followed
                        .iter()
                        .map(|f| seconds(*f))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            None => eprintln!("    {old} killed: no new primary seen within {wait:?}"),
        }
        let mut end_ms = from;
        if fault == Fault::DemoteInPlace {
            // The old primary stays read-only, its sockets open, for at least
            // a lease and a second after the promotion; then it rejoins.
            let held = rec.now_ms().saturating_sub(from);
            let rest = (work.lease_ms + 1_000).saturating_sub(held);
            tokio::time::sleep(Duration::from_millis(rest)).await;
            self.thaw().await;
            end_ms = rec.now_ms();
        }
        Ok(span(fault, start_ms, end_ms, promoted_ms))
    }

    async fn thaw(&self) {
        if let Err(e) = self.run(&["thaw"], Duration::from_secs(60)).await {
            eprintln!("  {e}");
        }
    }
}

fn span(fault: Fault, start_ms: u64, end_ms: u64, promoted_ms: Option<u64>) -> FaultSpan {
    FaultSpan {
        fault: fault.name(),
        start_ms,
        end_ms,
        promoted_ms,
    }
}

fn seconds(ms: Option<u64>) -> String {
    ms.map_or_else(|| "never".into(), |ms| format!("{:.2} s", ms as f64 / 1e3))
}

/// Poll nodes `others` every 50 ms until one is out of recovery: its index
/// and when the poll that saw it was sent.
async fn watch_promotion(others: Vec<usize>, rec: Arc<Recorder>) -> Option<(usize, u64)> {
    let limit = Duration::from_secs(1);
    let mut conns: Vec<Option<PgConnection>> = others.iter().map(|_| None).collect();
    loop {
        for (k, &node) in others.iter().enumerate() {
            if conns[k].is_none() {
                let connect = PgConnection::connect(&admin_url(NODE_PORTS[node]));
                conns[k] = tokio::time::timeout(limit, connect)
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let Some(conn) = conns[k].as_mut() else {
                continue;
            };
            let sent = rec.now_ms();
            let asked = sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(conn);
            match tokio::time::timeout(limit, asked).await {
                Ok(Ok(false)) => return Some((node, sent)),
                Ok(Ok(true)) => {}
                _ => conns[k] = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long after `from` node `i` committed a transaction of its own (with
/// synchronous replication, once a synchronous standby confirms it).
async fn first_db_commit(i: usize, rec: &Recorder, from: u64) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let attempt = async {
            let mut conn = PgConnection::connect(&admin_url(NODE_PORTS[i])).await?;
            sqlx::query("SELECT txid_current()")
                .execute(&mut conn)
                .await?;
            let _ = conn.close().await;
            Ok::<_, sqlx::Error>(())
        };
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), attempt).await {
            return Some(rec.now_ms().saturating_sub(from));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}
