//! A server gone silent: every packet to and from its port dropped by an
//! nftables table of the test's own, with no reset or refusal, as when its
//! machine hangs or the network between partitions. Removed when dropped,
//! a failing test's too.

use super::*;

use std::io::Write;
use std::process::{Command, Stdio};

pub(super) struct Blackhole {
    table: String,
}

fn nft(args: &[&str], script: Option<&str>) -> std::process::Output {
    let mut child = Command::new(program("nft").expect("nft"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nft");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(script) = script {
        stdin
            .write_all(script.as_bytes())
            .expect("write the nft script");
    }
    drop(stdin);
    child.wait_with_output().expect("nft")
}

impl Blackhole {
    /// Drop every TCP packet to or from `port` on this machine.
    pub(super) fn port(port: u16) -> Self {
        // The port is the private server's: unique while it runs.
        let table = format!("settled_test_{port}");
        // One a killed run left behind, if any.
        let _ = nft(&["delete", "table", "inet", &table], None);
        let script = format!(
            "table inet {table} {{\n\
             \tchain input {{ type filter hook input priority 0; policy accept; \
             tcp dport {port} drop; tcp sport {port} drop; }}\n\
             \tchain output {{ type filter hook output priority 0; policy accept; \
             tcp dport {port} drop; tcp sport {port} drop; }}\n\
             }}\n"
        );
        let out = nft(&["-f", "-"], Some(&script));
        assert!(
            out.status.success(),
            "nft -f failed: {}\n{script}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { table }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        let out = nft(&["delete", "table", "inet", &self.table], None);
        if !out.status.success() {
            eprintln!(
                "could not remove the nftables table {}: {}; remove it with \
                 `nft delete table inet {}`",
                self.table,
                String::from_utf8_lossy(&out.stderr),
                self.table
            );
        }
    }
}
