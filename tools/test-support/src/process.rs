//! Start `settled` and learn where it listens: it is told to listen on an
//! ephemeral port and to log JSON lines, and the line with `fields.address`
//! says where. Its standard output is drained for the life of the process
//! (a full pipe would block it), each line handed to the caller.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// The log filter that keeps the line naming the address and warnings
/// (per-request lines cost CPU).
pub const QUIET_LOG: &str = "warn,settled::server=info";

/// A loopback address whose port was free a moment ago, for a process that
/// must know its address before it starts (`--advertise-url`), and keeps it
/// across restarts; it fails to start if another took the port meanwhile.
/// The port lies below the kernel's ephemeral range, which it hands out as
/// the local port of every outgoing connection: there, any client on the
/// machine (a test run makes thousands of connections) could hold the port
/// when the process starts or restarts on it.
pub fn free_loopback_address() -> std::io::Result<String> {
    let (from, to) = fixed_ports();
    for _ in 0..100 {
        let mut bytes = [0u8; 2];
        getrandom::fill(&mut bytes).expect("the system's random source");
        let port = from + u16::from_le_bytes(bytes) % (to - from);
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(listener.local_addr()?.to_string());
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// Up to 12 000 ports just below the ephemeral range (Linux's
/// `ip_local_port_range`; 32768 by default), above the registered ports
/// services are usually given.
fn fixed_ports() -> (u16, u16) {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|low| *low > 11_000)
        .unwrap_or(32_768);
    (low.saturating_sub(12_000).max(10_000), low)
}

/// A started process that has not yet said where it listens.
pub struct Spawned {
    pub child: Child,
    address: Receiver<String>,
}

/// Start `command` (a `settled` binary with its own arguments) listening on
/// `listen` (e.g. `127.0.0.1:0`); `each_line` gets every line of its standard
/// output, the one naming the address included, before the address is told.
/// Standard input is closed; standard error is as `command` sets it.
pub fn spawn(
    mut command: Command,
    listen: &str,
    mut each_line: impl FnMut(&str) + Send + 'static,
) -> std::io::Result<Spawned> {
    let mut child = command
        .args(["--listen", listen, "--log-format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("stdout was piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            each_line(&line);
            if let Some(address) = address_in(&line) {
                let _ = tx.send(address);
            }
        }
    });
    Ok(Spawned { child, address: rx })
}

/// The address a log line says the server listens on, if it says one.
pub fn address_in(line: &str) -> Option<String> {
    let entry: serde_json::Value = serde_json::from_str(line).ok()?;
    entry["fields"]["address"].as_str().map(str::to_owned)
}

/// Why a process did not come to listen.
#[derive(Debug)]
pub enum NotListening {
    TimedOut(Duration),
    Exited,
}

impl std::fmt::Display for NotListening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut(within) => write!(f, "did not listen within {within:?}"),
            Self::Exited => f.write_str("exited before it listened"),
        }
    }
}

impl Spawned {
    /// Wait, blocking the thread, until it listens (at most `within`); its
    /// address (`host:port`). The process is left running either way.
    pub fn address(&self, within: Duration) -> Result<String, NotListening> {
        self.address.recv_timeout(within).map_err(|e| match e {
            RecvTimeoutError::Timeout => NotListening::TimedOut(within),
            RecvTimeoutError::Disconnected => NotListening::Exited,
        })
    }

    /// The same without blocking an async runtime (which may serve what the
    /// process needs to start, such as a proxy in front of its database).
    pub async fn address_async(&self, within: Duration) -> Result<String, NotListening> {
        let deadline = Instant::now() + within;
        loop {
            match self.address.try_recv() {
                Ok(address) => return Ok(address),
                Err(TryRecvError::Disconnected) => return Err(NotListening::Exited),
                Err(TryRecvError::Empty) if Instant::now() >= deadline => {
                    return Err(NotListening::TimedOut(within));
                }
                Err(TryRecvError::Empty) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}
