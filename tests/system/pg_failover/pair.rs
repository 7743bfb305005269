//! A private PostgreSQL 15 primary and a streaming standby of it, in a
//! temporary directory, on free ports of 127.0.0.1: the cluster a failover
//! test may demote, silence and promote without touching the shared server.
//! Replication is synchronous, so that a commit settled acknowledged is on
//! the standby too and a failover may lose nothing. Both are stopped
//! (immediately) when the pair is dropped, a failing test's too.

use super::*;

use sqlx::Connection;
use std::process::{Command, Output};

/// One server of the pair.
pub(super) struct Node {
    pub(super) port: u16,
    data: PathBuf,
    log: PathBuf,
}

impl Node {
    /// `127.0.0.1:PORT`, as a URL names it.
    pub(super) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub(super) fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }

    /// A connection of the test's own, as an operator's `psql`.
    pub(super) async fn connect(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()))
    }

    /// How many of these receipts are in settled's tables on this server.
    pub(super) async fn receipts_among(&self, ids: &[&str]) -> i64 {
        let ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
        sqlx::query_scalar("SELECT count(*) FROM settled.receipts WHERE receipt_id = ANY($1)")
            .bind(ids)
            .fetch_one(&mut self.connect().await)
            .await
            .expect("count receipts")
    }
}

/// The primary and its standby.
pub(super) struct Pair {
    pub(super) primary: Node,
    pub(super) standby: Node,
    /// The `postgres` user's uid and gid when the test runs as root: the
    /// servers run as it (PostgreSQL refuses to run as root).
    owner: Option<(u32, u32)>,
    dir: tempfile::TempDir,
}

/// Settings for a fast throwaway server; the port comes on its own line.
fn settings(socket_dir: &Path) -> String {
    format!(
        "listen_addresses = '127.0.0.1'\n\
         unix_socket_directories = '{}'\n\
         max_connections = 100\n\
         shared_buffers = 16MB\n\
         fsync = off\n\
         wal_level = replica\n\
         max_wal_senders = 5\n\
         hot_standby = on\n\
         synchronous_commit = on\n\
         synchronous_standby_names = '*'\n\
         log_min_messages = warning\n",
        socket_dir.display()
    )
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
    f.write_all(text.as_bytes()).expect("append to the config");
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Pair {
    /// initdb a primary, start it, base-backup a standby of it, start that,
    /// and wait until the standby replicates synchronously.
    pub(super) async fn start() -> Self {
        let pair = tokio::task::block_in_place(Self::start_blocking);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let synchronous: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_replication \
                 WHERE state = 'streaming' AND sync_state = 'sync'",
            )
            .fetch_one(&mut pair.primary.connect().await)
            .await
            .expect("pg_stat_replication");
            if synchronous == 1 {
                return pair;
            }
            assert!(
                Instant::now() < deadline,
                "the standby did not replicate synchronously within 30 s:\n{}",
                tail(&pair.standby.log, 20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn start_blocking() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("settled-failover-")
            .tempdir()
            .expect("temp dir");
        let owner = is_root().then(|| {
            let id = |flag: &str| {
                let out = Command::new("id")
                    .args([flag, "postgres"])
                    .output()
                    .expect("id");
                assert!(out.status.success(), "as root, a `postgres` user is needed");
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .expect("id")
            };
            (id("-u"), id("-g"))
        });
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let node = |name: &str| Node {
            port: 0,
            data: dir.path().join(name),
            log: dir.path().join(format!("{name}.log")),
        };
        let mut pair = Self {
            primary: node("primary"),
            standby: node("standby"),
            owner,
            dir,
        };
        let primary = pair.primary.data.display().to_string();
        let cluster = ["-D", &primary, "-U", "postgres", "-A", "trust"];
        let fast = ["-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"];
        pair.run("initdb", &[&cluster[..], &fast[..]].concat());
        append(
            &pair.primary.data.join("postgresql.conf"),
            &settings(pair.dir.path()),
        );
        pair.primary.port = pair.start_node(&pair.primary);

        let standby = pair.standby.data.display().to_string();
        let port = pair.primary.port.to_string();
        let from = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
        let to = ["-D", &standby, "-R", "-X", "stream"];
        let fast = ["-c", "fast", "--no-sync"];
        pair.run("pg_basebackup", &[&from[..], &to[..], &fast[..]].concat());
        // Promoted, the standby is alone: it must not wait for a standby of its own.
        append(
            &pair.standby.data.join("postgresql.conf"),
            "synchronous_standby_names = ''\n",
        );
        pair.standby.port = pair.start_node(&pair.standby);
        pair
    }

    /// Run one of PostgreSQL's programs (as `postgres` when root); it must succeed.
    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let out = self.try_run(tool, args);
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn try_run(&self, tool: &str, args: &[&str]) -> Output {
        let path = Path::new(PG_BIN).join(tool);
        let mut command = if self.owner.is_some() {
            let mut c = Command::new(program("runuser").expect("runuser"));
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        };
        for var in [
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGDATA",
            "PGSERVICE",
        ] {
            command.env_remove(var);
        }
        command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"))
    }

    /// Start `node` on a free port, another one if that was taken in
    /// between; the port.
    fn start_node(&self, node: &Node) -> u16 {
        let data = node.data.display().to_string();
        let log = node.log.display().to_string();
        for _ in 0..5 {
            let port = free_port();
            append(
                &node.data.join("postgresql.conf"),
                &format!("port = {port}\n"),
            );
            let out = self.try_run(
                "pg_ctl",
                &["-D", &data, "-l", &log, "-w", "-t", "60", "start"],
            );
            if out.status.success() {
                return port;
            }
            let said = std::fs::read_to_string(&node.log).unwrap_or_default();
            assert!(
                said.contains("could not bind") || said.contains("already in use"),
                "pg_ctl start {data} failed: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                tail(&node.log, 20)
            );
        }
        panic!("no free port for {data} in 5 tries");
    }

    /// Make the primary refuse writes, its sessions left open, as a
    /// failover tool fencing it does: every transaction is read-only from
    /// the next statement on.
    pub(super) async fn demote_primary(&self) {
        let mut admin = self.primary.connect().await;
        for sql in [
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        ] {
            sqlx::raw_sql(sql)
                .execute(&mut admin)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        // The reload reaches the sessions a moment later.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now: String = sqlx::query_scalar("SHOW default_transaction_read_only")
                .fetch_one(&mut self.primary.connect().await)
                .await
                .expect("SHOW");
            if now == "on" {
                return;
            }
            assert!(Instant::now() < deadline, "the primary stayed writable");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Promote the standby and wait until it takes writes.
    pub(super) async fn promote_standby(&self) {
        let data = self.standby.data.display().to_string();
        tokio::task::block_in_place(|| {
            self.run("pg_ctl", &["-D", &data, "-w", "-t", "60", "promote"]);
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut self.standby.connect().await)
                .await
                .expect("pg_is_in_recovery");
            if !recovering {
                return;
            }
            assert!(Instant::now() < deadline, "the standby is still recovering");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (name, node) in [("primary", &self.primary), ("standby", &self.standby)] {
                eprintln!(
                    "--- the last lines the PostgreSQL {name} logged ---\n{}",
                    tail(&node.log, 20)
                );
            }
        }
        for node in [&self.standby, &self.primary] {
            let data = node.data.display().to_string();
            if node.data.join("postmaster.pid").exists() {
                let _ = self.try_run(
                    "pg_ctl",
                    &["-D", &data, "-w", "-t", "30", "stop", "-m", "immediate"],
                );
            }
        }
    }
}
