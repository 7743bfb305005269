//! Fresh databases and a spawned `settled` process.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use settled_test_support::{postgres, process};

use super::common::{Res, err, run_id};

/// The retry policy a spawned server runs with, so that retries come back quickly.
pub const FAST_RETRY_ARGS: [&str; 6] = [
    "--initial-backoff-ms",
    "1",
    "--backoff-cap-ms",
    "5",
    "--max-retries",
    "3",
];

/// The same policy, for an in-process store.
pub const FAST_RETRY: settled::domain::RetryPolicy =
    match settled::domain::RetryPolicy::new(3, 1, 2, 5) {
        Ok(policy) => policy,
        Err(_) => panic!("FAST_RETRY is out of bounds"),
    };

/// A database made for this run, removed by [`FreshDb::drop_db`] (SQLite: also on drop).
pub enum FreshDb {
    Sqlite {
        dir: PathBuf,
        url: String,
    },
    Postgres {
        admin_url: String,
        name: String,
        url: String,
    },
}

impl FreshDb {
    /// An empty SQLite database file in a new temporary directory.
    pub fn sqlite() -> Res<Self> {
        let dir = std::env::temp_dir().join(format!("settled-bench-{}", run_id()));
        std::fs::create_dir(&dir)?;
        let url = format!("sqlite:{}", dir.join("settled.db").display());
        Ok(Self::Sqlite { dir, url })
    }

    /// A new database on the server of `admin_url` (which names an existing database).
    pub async fn postgres(admin_url: &str) -> Res<Self> {
        let name = format!("settled_bench_{}", run_id());
        let url = postgres::create_database(admin_url, &name)
            .await
            .map_err(err)?;
        Ok(Self::Postgres {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    pub fn url(&self) -> &str {
        match self {
            Self::Sqlite { url, .. } | Self::Postgres { url, .. } => url,
        }
    }

    /// Remove the database (and its directory).
    pub async fn drop_db(&self) {
        match self {
            Self::Sqlite { dir, .. } => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Self::Postgres {
                admin_url, name, ..
            } => {
                if let Err(e) = postgres::drop_database(admin_url, name, true).await {
                    eprintln!("warning: could not drop database {name}: {e}");
                }
            }
        }
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        if let Self::Sqlite { dir, .. } = self {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// How long a spawned server may take to say where it listens.
const START_BOUND: Duration = Duration::from_secs(60);

/// A running `settled` process, killed on drop if not stopped.
pub struct Server {
    child: Option<Child>,
    pub base: String,
    pub pid: u32,
}

impl Server {
    /// Start the `settled` binary next to this executable on `database_url`;
    /// with `advertise`, on a port picked first and advertised to the other
    /// replicas (`--advertise-url`).
    pub fn spawn(database_url: &str, advertise: bool) -> Res<Self> {
        let exe = std::env::current_exe()?.with_file_name("settled");
        if !exe.exists() {
            return Err(err(format!(
                "{} not found: build it first (cargo build --release --bins)",
                exe.display()
            )));
        }
        let mut command = Command::new(&exe);
        command
            .env_remove("SETTLED_TOKENS")
            .env_remove("SETTLED_LISTEN")
            .env("RUST_LOG", process::QUIET_LOG)
            .args(["--database-url", database_url])
            .args(FAST_RETRY_ARGS)
            .stderr(Stdio::inherit());
        // Its log is passed on, but for the line naming its address and the
        // one saying it shuts down (expected at the end of every run).
        let mut listen = "127.0.0.1:0".to_owned();
        if advertise {
            listen = process::free_loopback_address()?;
            command.args(["--advertise-url", &format!("http://{listen}")]);
        }
        let spawned = process::spawn(command, &listen, |line| {
            if process::address_in(line).is_none() && !line.contains("shutting down") {
                eprintln!("[settled] {line}");
            }
        })
        .map_err(|e| err(format!("cannot start {}: {e}", exe.display())))?;
        let pid = spawned.child.id();
        let address = spawned.address(START_BOUND);
        let mut server = Self {
            child: Some(spawned.child),
            base: String::new(),
            pid,
        };
        server.base = format!(
            "http://{}",
            address.map_err(|why| err(format!("settled {why}")))?
        );
        Ok(server)
    }

    /// Peak resident set size so far (`VmHWM`), in MB.
    pub fn peak_rss_mb(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    }

    /// CPU time used so far (user + system), in seconds.
    pub fn cpu_s(&self) -> Option<f64> {
        super::cpu::cpu_s(Some(self.pid))
    }

    /// Bytes it has sent to the storage layer so far (`write_bytes` of
    /// `/proc/<pid>/io`): on SQLite, the database's WAL and checkpoint writes.
    pub fn written_bytes(&self) -> Option<u64> {
        let io = std::fs::read_to_string(format!("/proc/{}/io", self.pid)).ok()?;
        let line = io.lines().find(|l| l.starts_with("write_bytes:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// SIGTERM, then wait (at most 10 s, then kill). Returns whether it exited 0.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A figure of the spawned replicas, summed (`None` without any, or when
/// one of them cannot be read).
pub fn summed<T: std::iter::Sum>(
    servers: &[Server],
    read: impl Fn(&Server) -> Option<T>,
) -> Option<T> {
    if servers.is_empty() {
        return None;
    }
    servers.iter().map(read).sum()
}

/// Resident set size now, in MB.
pub fn vm_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}
