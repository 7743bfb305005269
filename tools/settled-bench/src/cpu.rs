//! CPU time of a process (user + system), from `/proc/<pid>/stat`.

use std::sync::OnceLock;

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we know of).
fn ticks_per_s() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU seconds used so far by process `pid` (all its threads); `None`: this process.
pub fn cpu_s(pid: Option<u32>) -> Option<f64> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_owned(),
        |p| format!("/proc/{p}/stat"),
    );
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which ends with the last `)`: utime is
    // field 14 of the line, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / ticks_per_s())
}

/// CPU microseconds per item of `cpu_s` seconds spent on `items`.
pub fn us_per(cpu_s: Option<f64>, items: u64) -> Option<f64> {
    cpu_s.filter(|_| items > 0).map(|s| s * 1e6 / items as f64)
}
