//! Fresh databases and a spawned `settled` process.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

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
        let mut admin = sqlx::PgConnection::connect(admin_url)
            .await
            .map_err(|e| err(format!("cannot connect to {admin_url}: {e}")))?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        let _ = admin.close().await;
        let (prefix, _) = admin_url
            .split('?')
            .next()
            .and_then(|u| u.rsplit_once('/'))
            .ok_or_else(|| err("--postgres-url must name a database, e.g. …/postgres"))?;
        let url = format!("{prefix}/{name}");
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
                let dropped = async {
                    let mut admin = sqlx::PgConnection::connect(admin_url).await?;
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&mut admin)
                        .await?;
                    admin.close().await
                };
                if let Err(e) = dropped.await {
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

/// A running `settled` process, killed on drop if not stopped.
pub struct Server {
    child: Option<Child>,
    pub base: String,
    pub pid: u32,
}

impl Server {
    /// Start the `settled` binary next to this executable on `database_url`.
    pub fn spawn(database_url: &str) -> Res<Self> {
        let exe = std::env::current_exe()?.with_file_name("settled");
        if !exe.exists() {
            return Err(err(format!(
                "{} not found: build it first (cargo build --release --bins)",
                exe.display()
            )));
        }
        let mut child = Command::new(&exe)
            .env_remove("SETTLED_TOKENS")
            .env_remove("SETTLED_LISTEN")
            // Warnings only, but keep the start-up line that names the address.
            .env("RUST_LOG", "warn,settled::server=info")
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .args(["--database-url", database_url])
            .args(FAST_RETRY_ARGS)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| err(format!("cannot start {}: {e}", exe.display())))?;
        let pid = child.id();
        let stdout = child.stdout.take().ok_or_else(|| err("no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let mut server = Self {
            child: Some(child),
            base: String::new(),
            pid,
        };
        for line in lines.by_ref() {
            let line = line?;
            let entry: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if let Some(address) = entry["fields"]["address"].as_str() {
                server.base = format!("http://{address}");
                break;
            }
            eprintln!("[settled] {line}");
        }
        if server.base.is_empty() {
            return Err(err("settled exited without listening"));
        }
        // Keep draining its log so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if !line.contains("shutting down") {
                    eprintln!("[settled] {line}");
                }
            }
        });
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
