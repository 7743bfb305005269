//! The real `settled` binary as a child process: started on an ephemeral
//! port of loopback, its log lines drained (so its pipes never fill) and kept.
//!
//! [`start`] is the common case; [`Launch`] adds what some tests need (more
//! arguments, another listen address or log level, a bound on the lines
//! kept, the lines echoed to the test's output instead) and [`Starting`]
//! lets several processes start at once, or lets an async test wait without
//! blocking its runtime.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use settled_test_support::process;

/// How long a process may take to say where it listens.
const START_BOUND: Duration = Duration::from_secs(30);

/// A running binary, its address and its log lines.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub address: String,
    pub logs: Arc<Mutex<Vec<String>>>,
}

/// Start the binary in `dir` on the database `url`.
pub fn start(dir: &Path, url: &str) -> Server {
    Launch::new(dir).database(url).spawn().ready()
}

/// What to start: the binary in a directory, configured by its flags alone
/// (the `SETTLED_*` variables of the test's environment removed), listening
/// on an ephemeral port of loopback and logging JSON lines (warnings and the
/// line saying where it listens).
pub struct Launch {
    command: Command,
    listen: String,
    args: Vec<String>,
    keep: usize,
    echo: bool,
}

impl Launch {
    pub fn new(dir: &Path) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_settled"));
        command
            .current_dir(dir)
            .env_remove("SETTLED_DATABASE_URL")
            .env_remove("SETTLED_LISTEN")
            .env_remove("SETTLED_TOKENS")
            .env("RUST_LOG", process::QUIET_LOG);
        Launch {
            command,
            listen: "127.0.0.1:0".to_owned(),
            args: Vec::new(),
            keep: usize::MAX,
            echo: false,
        }
    }

    /// `--database-url url`.
    pub fn database(self, url: &str) -> Self {
        self.args(&["--database-url", url])
    }

    /// More flags, after the ones above.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// `--listen address` instead of an ephemeral port of loopback.
    pub fn listen(mut self, address: &str) -> Self {
        self.listen = address.to_owned();
        self
    }

    /// Set a variable in the process's environment.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.command.env(key, value);
        self
    }

    /// Remove a variable from the process's environment (`RUST_LOG`: log
    /// at the binary's own default level).
    pub fn env_remove(mut self, key: &str) -> Self {
        self.command.env_remove(key);
        self
    }

    /// Keep at most `lines` lines of standard output (a process under long
    /// load would otherwise grow the test's memory); standard error is
    /// always kept.
    pub fn keep_at_most(mut self, lines: usize) -> Self {
        self.keep = lines;
        self
    }

    /// Print the log lines (all but the listening line) on the test's
    /// standard error as they come, instead of keeping them.
    pub fn echo(mut self) -> Self {
        self.echo = true;
        self
    }

    /// Spawn the process; [`Starting::ready`] waits until it listens.
    pub fn spawn(mut self) -> Starting {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let kept = logs.clone();
        let (keep, echo) = (self.keep, self.echo);
        self.command.args(&self.args).stderr(Stdio::piped());
        let mut spawned = process::spawn(self.command, &self.listen, move |line| {
            if echo && process::address_in(line).is_none() {
                eprintln!("settled: {line}");
            } else if !echo {
                // Kept before the address is told, so that the lines up to
                // the listening one are all there once it listens.
                let mut kept = kept.lock().unwrap();
                if kept.len() < keep {
                    kept.push(line.to_owned());
                }
            }
        })
        .expect("spawn settled");
        let stderr = spawned.child.stderr.take().expect("stderr");
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("settled (stderr): {line}");
                } else {
                    kept.lock().unwrap().push(line);
                }
            }
        });
        Starting {
            spawned: Some(spawned),
            logs,
        }
    }
}

/// A spawned process that has not yet said where it listens; killed if
/// dropped before it does.
pub struct Starting {
    spawned: Option<process::Spawned>,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Starting {
    /// Wait (blocking the thread) until the process listens.
    pub fn ready(self) -> Server {
        let address = self.spawned.as_ref().expect("spawned").address(START_BOUND);
        self.server(address.ok())
    }

    /// Wait until the process listens without blocking an async runtime
    /// (which may serve what the process needs to start, such as a proxy).
    pub async fn ready_async(self) -> Server {
        let spawned = self.spawned.as_ref().expect("spawned");
        let address = spawned.address_async(START_BOUND).await;
        self.server(address.ok())
    }

    fn server(mut self, address: Option<String>) -> Server {
        let mut child = self.spawned.take().expect("spawned").child;
        if let Some(address) = address {
            Server {
                child,
                base: format!("http://{address}"),
                address,
                logs: self.logs.clone(),
            }
        } else {
            let _ = child.kill();
            let status = child.wait();
            panic!(
                "settled did not start ({status:?}): {:?}",
                self.logs.lock().unwrap()
            );
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(spawned) = &mut self.spawned {
            let _ = spawned.child.kill();
            let _ = spawned.child.wait();
        }
    }
}

impl Server {
    /// Send SIGTERM.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Send `signal` (`STOP`, `CONT`, …), as `kill -SIGNAL pid` does.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) {
        self.sigterm();
        let status = self.child.wait().expect("wait");
        assert!(
            status.success(),
            "exit 0 on SIGTERM, got {status}: {:?}",
            self.logs.lock().unwrap()
        );
    }

    /// SIGKILL (what `kill -KILL pid` sends) and reap; the exit status.
    pub fn kill(mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("wait")
    }

    /// Everything the binary logged so far.
    pub fn log_text(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }
}

/// A test that fails part-way must not leave the binary running.
impl Drop for Server {
    fn drop(&mut self) {
        // A failing test shows what the server said (warnings and errors).
        if std::thread::panicking() {
            eprintln!("settled's log:\n{}", self.log_text());
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
