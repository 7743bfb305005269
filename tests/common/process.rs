//! The real `settled` binary as a child process: started on an ephemeral
//! port of loopback, its log lines drained (so its pipes never fill) and kept.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// A running binary, its address and its log lines.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub address: String,
    pub logs: Arc<Mutex<Vec<String>>>,
}

/// Start the binary in `dir` on the database `url`.
pub fn start(dir: &Path, url: &str) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_settled"))
        .current_dir(dir)
        .env_remove("SETTLED_DATABASE_URL")
        .env_remove("SETTLED_LISTEN")
        .env_remove("SETTLED_TOKENS")
        .env("RUST_LOG", "warn,settled::server=info")
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--database-url", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn settled");
    let logs = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("stdout");
    let kept = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Ok(entry) = serde_json::from_str::<Value>(&line)
                && let Some(address) = entry["fields"]["address"].as_str()
            {
                let _ = tx.send(address.to_owned());
            }
            kept.lock().unwrap().push(line);
        }
    });
    let stderr = child.stderr.take().expect("stderr");
    let kept = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            kept.lock().unwrap().push(line);
        }
    });
    if let Ok(address) = rx.recv_timeout(Duration::from_secs(30)) {
        Server {
            child,
            base: format!("http://{address}"),
            address,
            logs,
        }
    } else {
        let _ = child.kill();
        let status = child.wait();
        panic!(
            "settled did not start ({status:?}): {:?}",
            logs.lock().unwrap()
        );
    }
}

impl Server {
    /// Send SIGTERM.
    pub fn sigterm(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
    }

    /// Everything the binary logged so far.
    pub fn log_text(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }
}

/// A test that fails part-way must not leave the binary running.
impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
