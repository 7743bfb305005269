//! The `postgres-ha` scenario's database: a Patroni + etcd cluster of three
//! PostgreSQL nodes run by `tests/ha/cluster.sh`, one harness proxy in front
//! of each node (settled's multi-host URL names the proxies, in node order),
//! and what the harness asks of it (the faults are in `ha_faults.rs`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use settled_test_support::postgres;

use super::Res;
use super::proxy::Proxy;
use super::workload::Workload;

/// The nodes' PostgreSQL ports, pg1 to pg3.
pub const NODE_PORTS: [u16; 3] = [55431, 55432, 55433];
/// `--pg-tcp-timeout-ms` of the settled replicas on the cluster.
pub const PG_TCP_TIMEOUT_MS: u64 = 5_000;
/// The script, as found in this repository (two levels above this crate).
pub const DEFAULT_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/ha/cluster.sh");

/// Clusters up now, as (script, `HA_DIR`): taken down on SIGINT or SIGTERM.
static UP: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

pub fn admin_url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// The last lines of a file, for an error message.
fn tail(file: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join(" / ")
}

/// Run `cluster.sh ARGS` on the cluster in `ha_dir`, its stderr appended to
/// `log`; returns its stdout, trimmed.
fn run_script(
    script: &Path,
    ha_dir: &Path,
    log: &Path,
    args: &[&str],
    within: Duration,
) -> Result<String, String> {
    let what = format!("cluster.sh {}", args.join(" "));
    let err = |e: std::io::Error| format!("{what}: {e}");
    let mut log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(err)?;
    let _ = writeln!(log_file, "--- {what}");
    let mut child = Command::new(script)
        .args(args)
        .env("HA_DIR", ha_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .map_err(err)?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + within;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: not done within {within:?}"));
            }
            Err(e) => return Err(err(e)),
        }
    };
    let out = reader.join().unwrap_or_default();
    if status.success() {
        Ok(out.trim().to_owned())
    } else {
        Err(format!("{what}: {status}: {}", tail(log, 4)))
    }
}

/// `cluster.sh down` for every cluster still up (on SIGINT or SIGTERM).
pub fn down_all() {
    let up = std::mem::take(&mut *UP.lock().unwrap_or_else(|p| p.into_inner()));
    for (script, ha_dir) in up {
        let log = ha_dir.with_file_name("cluster.log");
        let _ = run_script(&script, &ha_dir, &log, &["down"], Duration::from_secs(180));
    }
}

/// "NAME PORT" (the last two words of a line `cluster.sh` prints) as the
/// node's name and index.
pub fn parse_member(line: &str) -> Res<(String, usize)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let [.., name, port] = words[..] else {
        return Err(format!("cannot read a member in {line:?}").into());
    };
    let port: u16 = port.parse()?;
    let index = NODE_PORTS
        .iter()
        .position(|p| *p == port)
        .ok_or_else(|| format!("no node has port {port}"))?;
    Ok((name.to_owned(), index))
}

/// The cluster: up from `up` until `down` (or until dropped).
pub struct Cluster {
    script: PathBuf,
    ha_dir: PathBuf,
    /// `cluster.sh`'s progress and errors (its stderr).
    log: PathBuf,
    /// Where the nodes' logs are copied before `down` removes them.
    keep: PathBuf,
    /// One per node, in node order.
    pub proxies: Vec<Proxy>,
    pub database: String,
    is_down: AtomicBool,
}

impl Cluster {
    /// `cluster.sh up` in `dir/ha`, a proxy per node, and a fresh database
    /// made on the leader (it replicates to the standbys).
    pub async fn up(script: &Path, dir: &Path, run: &str, async_replication: bool) -> Res<Self> {
        if !script.exists() {
            return Err(format!("no {} (--ha-cluster)", script.display()).into());
        }
        let mut cluster = Self {
            script: script.to_owned(),
            ha_dir: dir.join("ha"),
            log: dir.join("cluster.log"),
            keep: dir.join("cluster-logs"),
            proxies: Vec::new(),
            database: format!("settled_faults_{run}"),
            is_down: AtomicBool::new(false),
        };
        UP.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((cluster.script.clone(), cluster.ha_dir.clone()));
        let started = Instant::now();
        let up: &[&str] = if async_replication {
            &["up", "--async"]
        } else {
            &["up"]
        };
        let url = cluster.run(up, Duration::from_secs(240)).await?;
        eprintln!(
            "  cluster up in {:.1} s ({}): {url}",
            started.elapsed().as_secs_f64(),
            if async_replication { "async" } else { "sync" }
        );
        for port in NODE_PORTS {
            cluster
                .proxies
                .push(Proxy::start(format!("127.0.0.1:{port}")).await?);
        }
        let (_, leader) = cluster.primary().await?;
        postgres::create_database(&admin_url(NODE_PORTS[leader]), &cluster.database).await?;
        Ok(cluster)
    }

    /// The URL the settled replicas get: the proxies, in node order.
    pub fn settled_url(&self) -> String {
        let hosts: Vec<String> = self
            .proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        format!(
            "postgres://postgres@{}/{}?target_session_attrs=read-write",
            hosts.join(","),
            self.database
        )
    }

    /// The admin URL of node `i` (direct, not through its proxy).
    pub fn admin_url(i: usize) -> String {
        admin_url(NODE_PORTS[i])
    }

    pub async fn run(&self, args: &[&str], within: Duration) -> Res<String> {
        let (script, ha_dir, log) = (self.script.clone(), self.ha_dir.clone(), self.log.clone());
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_script(&script, &ha_dir, &log, &args, within)
        })
        .await?
        .map_err(Into::into)
    }

    /// The leader's name and node index.
    pub async fn primary(&self) -> Res<(String, usize)> {
        parse_member(&self.run(&["primary"], Duration::from_secs(30)).await?)
    }

    pub async fn wait_healthy(&self) {
        if let Err(e) = self
            .run(&["wait-healthy", "120"], Duration::from_secs(150))
            .await
        {
            eprintln!("  the cluster is not healthy: {e}");
        }
    }

    /// Keep the nodes' logs, then `cluster.sh down` (once).
    pub fn down_now(&self) {
        if self.is_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = Command::new("cp")
            .arg("-r")
            .arg(self.ha_dir.join("logs"))
            .arg(&self.keep)
            .status();
        let down = run_script(
            &self.script,
            &self.ha_dir,
            &self.log,
            &["down"],
            Duration::from_secs(180),
        );
        if let Err(e) = down {
            eprintln!("  {e}");
        }
        UP.lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(_, dir)| *dir != self.ha_dir);
    }

    /// Per replica, how long after `from` its `/v1/info` said it writes to
    /// node `leader` (`None`: not within `within`).
    pub async fn followers(
        &self,
        work: &Workload,
        leader: usize,
        from: u64,
        within: Duration,
    ) -> Vec<Option<u64>> {
        let label = format!("127.0.0.1:{}", self.proxies[leader].port);
        let mut seen = vec![None; work.replicas()];
        let deadline = Instant::now() + within;
        while Instant::now() < deadline && seen.iter().any(Option::is_none) {
            for (i, slot) in seen.iter_mut().enumerate() {
                let base = work.base(i);
                if slot.is_some() || base.is_empty() {
                    continue;
                }
                if let Some(info) = work.get(&base, "/v1/info").await {
                    let db = &info["database"];
                    if db["writable"].as_bool() == Some(true)
                        && db["primary"].as_str() == Some(label.as_str())
                    {
                        *slot = Some(work.rec.now_ms().saturating_sub(from));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        seen
    }

    /// At the end: every replica writes to the leader (what is read back is
    /// the primary's), or a problem per replica that does not within 60 s.
    pub async fn check_followers(&self, work: &Workload) -> Vec<String> {
        let (name, leader) = match self.primary().await {
            Ok(found) => found,
            Err(e) => return vec![format!("no leader at the end: {e}")],
        };
        let from = work.rec.now_ms();
        let followed = self
            .followers(work, leader, from, Duration::from_secs(60))
            .await;
        followed
            .iter()
            .enumerate()
            .filter(|(_, f)| f.is_none())
            .map(|(i, _)| {
                format!("settled-{i} was not writing to the leader {name} 60 s after the faults")
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down_now();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_cluster_script_is_the_repositorys() {
        let script = std::path::Path::new(super::DEFAULT_SCRIPT);
        assert!(script.is_file(), "{} is not a file", script.display());
    }
}
