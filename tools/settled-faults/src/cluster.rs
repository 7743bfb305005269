//! The system under test: `settled` processes on one database, and the
//! handles the faults act on (signals, the faked wall clock, a small disk).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use settled_test_support::process;

use super::Res;

/// libfaketime, from Debian's `faketime` package: it fakes the wall clock only
/// (`FAKETIME_DONT_FAKE_MONOTONIC`), as an NTP step or `date -s` would move it.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// One `settled` process, restartable on the same database.
pub struct Replica {
    pub name: String,
    exe: PathBuf,
    database_url: String,
    /// The offset file libfaketime reads (seconds, `+N` / `-N`), if faked.
    clock_file: Option<PathBuf>,
    /// This host's constant disagreement with true time, in seconds.
    skew: i64,
    log: PathBuf,
    /// More command-line arguments for `settled`.
    extra_args: Vec<String>,
    /// Where it listens: an ephemeral port, or one kept across restarts.
    listen: String,
    child: Option<Child>,
    /// Where workers reach it; empty while it is down.
    pub base: Arc<RwLock<String>>,
}

impl Replica {
    /// A replica whose wall clock is faked (`Some(skew)`, seconds off true
    /// time from the start) or the host's (`None`).
    pub fn new(
        name: &str,
        exe: &Path,
        database_url: &str,
        dir: &Path,
        fake_clock: Option<i64>,
    ) -> Self {
        let clock_file = fake_clock.map(|_| dir.join(format!("{name}.clock")));
        let skew = fake_clock.unwrap_or(0);
        if let Some(file) = &clock_file {
            let _ = std::fs::write(file, format!("{skew:+}\n"));
        }
        Self {
            name: name.to_owned(),
            exe: exe.to_owned(),
            database_url: database_url.to_owned(),
            clock_file,
            skew,
            log: dir.join(format!("{name}.log")),
            extra_args: Vec::new(),
            listen: "127.0.0.1:0".to_owned(),
            child: None,
            base: Arc::new(RwLock::new(String::new())),
        }
    }

    /// Give `settled` these arguments too, at every start.
    #[must_use]
    pub fn with_args(mut self, args: &[&str]) -> Self {
        self.extra_args = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Listen on `address` at every start and advertise it to the other
    /// replicas (`--advertise-url`).
    #[must_use]
    pub fn advertised(mut self, address: &str) -> Self {
        self.listen = address.to_owned();
        self.extra_args
            .extend(["--advertise-url".to_owned(), format!("http://{address}")]);
        self
    }

    /// Start it and wait until it listens (at most `within`).
    pub fn start(&mut self, within: Duration) -> Res<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(&self.exe);
        cmd.env_remove("SETTLED_TOKENS")
            .env_remove("SETTLED_LISTEN")
            .env("RUST_LOG", process::QUIET_LOG)
            .args(["--database-url", &self.database_url])
            .args(["--initial-backoff-ms", "1", "--backoff-cap-ms", "20"])
            .args(["--max-retries", "3"])
            .args(&self.extra_args)
            .stderr(log.try_clone()?);
        if let Some(file) = &self.clock_file {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME_TIMESTAMP_FILE", file)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_CACHE_DURATION", "1");
        }
        // Its log goes to the log file, the line naming its address too.
        let mut log = log;
        let spawned = process::spawn(cmd, &self.listen, move |line| {
            let _ = std::io::Write::write_all(&mut log, format!("{line}\n").as_bytes());
        })?;
        let address = spawned.address(within);
        self.child = Some(spawned.child);
        match address {
            Ok(address) => {
                *self.base.write().unwrap_or_else(|p| p.into_inner()) = format!("http://{address}");
                Ok(())
            }
            Err(why) => {
                self.kill();
                Err(format!("{} {why} (see {})", self.name, self.log.display()).into())
            }
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        self.base.write().unwrap_or_else(|p| p.into_inner()).clear();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub fn pause(&self, stop: bool) {
        if let Some(pid) = self.pid() {
            let signal = if stop { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    }

    /// Step its wall clock `seconds` from where its skew puts it (0: back;
    /// libfaketime reads the file again within a second).
    pub fn step_clock(&mut self, seconds: i64) {
        if let Some(file) = &self.clock_file {
            let _ = std::fs::write(file, format!("{:+}\n", self.skew + seconds));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.pause(false);
        self.kill();
    }
}

/// A small tmpfs for the SQLite database, so that the harness can fill it.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Res<Self> {
        std::fs::create_dir_all(dir)?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(Self {
            dir: dir.to_owned(),
        })
    }
}

/// Write a file in `dir` until its filesystem is full; returns its path.
pub fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    if let Ok(mut file) = std::fs::File::create(&path) {
        let chunk = vec![0_u8; 1 << 20];
        while std::io::Write::write_all(&mut file, &chunk).is_ok() {}
        // The last bytes, so that not even a page is left.
        while std::io::Write::write_all(&mut file, &chunk[..4096]).is_ok() {}
        while std::io::Write::write_all(&mut file, &chunk[..1]).is_ok() {}
    }
    path
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The PostgreSQL cluster's version directory (`/etc/postgresql/15` → `15`).
pub fn postgres_cluster() -> Option<String> {
    let entries = std::fs::read_dir("/etc/postgresql").ok()?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
}

/// Restart the local PostgreSQL cluster (`pg_ctlcluster … restart`).
pub fn restart_postgres() -> Res<()> {
    let version = postgres_cluster().ok_or("no cluster under /etc/postgresql")?;
    let status = Command::new("pg_ctlcluster")
        .args([
            "--skip-systemctl-redirect",
            &version,
            "main",
            "restart",
            "-m",
            "fast",
        ])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("pg_ctlcluster restart exited {status}").into())
    }
}
