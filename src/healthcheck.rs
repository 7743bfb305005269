//! `settled healthcheck`: one `GET /readyz` (or `/healthz`) over plain HTTP/1.1 to a running
//! server, for container health checks (the runtime image has no curl).
//!
//! Blocking std networking under one deadline: a check runs every few seconds for the life of a
//! container, so it starts no async runtime and needs no HTTP client.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::config::HealthcheckArgs;

/// Most of an answer that is read: the status line and a problem's `detail` fit easily.
const MAX_ANSWER: usize = 16 * 1024;

/// Most characters of the server's reason repeated in the one-line result.
const MAX_REASON: usize = 300;

/// What to ask: the host and port to connect to (also the `Host` header) and the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// A name or an IP address; an IPv6 address without brackets.
    pub host: String,
    pub port: u16,
    /// Starts with `/`.
    pub path: String,
}

impl Target {
    /// What the arguments ask: `--url` when given, else `--listen` (or `SETTLED_LISTEN`) with
    /// an unspecified address asked on loopback, path `/readyz` or (`--live`) `/healthz`.
    ///
    /// # Errors
    /// `--url` is not a plain `http://` URL.
    pub fn from_args(args: &HealthcheckArgs) -> Result<Self, String> {
        if let Some(url) = &args.url {
            return parse_url(url);
        }
        let ip = match args.listen.ip() {
            // Listening on every interface: loopback is one of them, and the one a check
            // inside the container or on the host can always reach.
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        Ok(Self {
            host: ip.to_string(),
            port: args.listen.port(),
            path: if args.live { "/healthz" } else { "/readyz" }.to_owned(),
        })
    }

    /// `host:port`, bracketing an IPv6 address.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The URL asked, for messages.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority(), self.path)
    }
}

/// Parse `http://HOST[:PORT][/PATH]` (port 80 and path `/readyz` when absent).
///
/// # Errors
/// Another scheme, a missing or malformed host or port.
pub fn parse_url(text: &str) -> Result<Target, String> {
    let Some(rest) = text.strip_prefix("http://") else {
        return Err(if text.starts_with("https://") {
            format!(
                "{text}: https is not supported; settled serves plain HTTP, so ask its own address"
            )
        } else {
            format!("{text}: give an http:// URL, e.g. http://127.0.0.1:8080/readyz")
        });
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/readyz"),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{text}: an IPv6 address needs its closing `]`"))?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(['@', ' ']) {
        return Err(format!("{text}: the host is missing or malformed"));
    }
    let port = match port {
        None => 80,
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| format!("{text}: the port must be 0..=65535"))?,
    };
    if path.contains(|c: char| c.is_ascii_control() || c == ' ') {
        return Err(format!(
            "{text}: the path may hold no spaces or control characters"
        ));
    }
    Ok(Target {
        host: host.to_owned(),
        port,
        path: path.to_owned(),
    })
}

/// Ask `target` once, within `timeout`: `Ok` with a line saying so when it answers 2xx, `Err`
/// with a line saying why not otherwise.
///
/// # Errors
/// The reason, on one line: no connection, no answer in time, or a status other than 2xx
/// (with the server's `detail` when it sent a problem).
pub fn check(target: &Target, timeout: Duration) -> Result<String, String> {
    let url = target.url();
    let deadline = Instant::now() + timeout;
    let late = || {
        format!(
            "no answer from {url} within {} (still starting, or stuck?)",
            humantime::format_duration(timeout)
        )
    };
    let addresses: Vec<SocketAddr> = match target.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, target.port)],
        Err(_) => (target.host.as_str(), target.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", target.host))?
            .collect(),
    };
    let left = |deadline: Instant| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    let mut stream = None;
    let mut failure = format!("{} resolves to no address", target.host);
    for address in addresses {
        match TcpStream::connect_timeout(&address, left(deadline).ok_or_else(late)?) {
            Ok(connected) => {
                stream = Some(connected);
                break;
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => return Err(late()),
            Err(e) => failure = format!("cannot connect to {url}: {e}"),
        }
    }
    let mut stream = stream.ok_or(failure)?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: settled-healthcheck/{}\r\n\
         Accept: application/json\r\nConnection: close\r\n\r\n",
        target.path,
        target.authority(),
        env!("CARGO_PKG_VERSION"),
    );
    let timed_out =
        |e: &std::io::Error| matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock);
    stream
        .set_write_timeout(Some(left(deadline).ok_or_else(late)?))
        .and_then(|()| stream.write_all(request.as_bytes()))
        .map_err(|e| {
            if timed_out(&e) {
                late()
            } else {
                format!("cannot ask {url}: {e}")
            }
        })?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while answer.len() < MAX_ANSWER {
        let Some(time) = left(deadline) else {
            if head_end(&answer).is_some() {
                break;
            }
            return Err(late());
        };
        let read = stream
            .set_read_timeout(Some(time))
            .and_then(|()| stream.read(&mut buffer));
        match read {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // An answer whose status is in already is judged on it.
            Err(e) if timed_out(&e) && head_end(&answer).is_none() => return Err(late()),
            Err(_) if head_end(&answer).is_some() => break,
            Err(e) => return Err(format!("no answer from {url}: {e}")),
        }
    }
    judge(&url, &answer)
}

/// Where the head of `answer` ends (after its blank line).
fn head_end(answer: &[u8]) -> Option<usize> {
    answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

/// The result of an answer read (possibly cut short).
fn judge(url: &str, answer: &[u8]) -> Result<String, String> {
    let Some(end) = head_end(answer) else {
        return Err(if answer.is_empty() {
            format!("{url} closed the connection without answering")
        } else {
            format!("{url} did not answer HTTP")
        });
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head
        .lines()
        .next()
        .filter(|line| line.starts_with("HTTP/1."))
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("{url} did not answer HTTP"))?;
    if (200..300).contains(&status) {
        return Ok(format!("healthy: {url} answered {status}"));
    }
    let reason = reason(&answer[end..]);
    Err(if reason.is_empty() {
        format!("{url} answered {status}")
    } else {
        format!("{url} answered {status}: {reason}")
    })
}

/// The `detail` (or `title`, or `code`) of a problem body, on one line and short; empty when
/// the body is none.
fn reason(body: &[u8]) -> String {
    // A chunked body has its sizes around the JSON: take the object itself.
    let text = String::from_utf8_lossy(body);
    let json = match (text.find('{'), text.rfind('}')) {
        (Some(start), Some(end)) if start < end => &text[start..=end],
        _ => "",
    };
    let value: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let said = ["detail", "title", "code"]
        .iter()
        .find_map(|key| value.get(key).and_then(serde_json::Value::as_str))
        .unwrap_or_default();
    let mut line: String = said
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON)
        .collect();
    if said.chars().count() > MAX_REASON {
        line.push('…');
    }
    line
}

/// `settled healthcheck`: 0 and a line on standard output when healthy, 1 and a line on
/// standard error otherwise.
#[must_use]
pub fn run(args: &HealthcheckArgs) -> ExitCode {
    let result = Target::from_args(args).and_then(|target| check(&target, args.timeout));
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(reason) => {
            eprintln!("unhealthy: {reason}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_read_with_their_defaults() {
        let t = parse_url("http://127.0.0.1:8080/readyz").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("127.0.0.1", 8080, "/readyz")
        );
        let t = parse_url("http://settled.internal").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("settled.internal", 80, "/readyz")
        );
        let t = parse_url("http://[::1]:9000/healthz").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 9000, "/healthz")
        );
        assert_eq!(t.url(), "http://[::1]:9000/healthz");
        assert!(
            parse_url("https://x/readyz")
                .unwrap_err()
                .contains("plain HTTP")
        );
        assert!(parse_url("127.0.0.1:8080").is_err());
        assert!(parse_url("http://:8080/").is_err());
        assert!(parse_url("http://h:99999/").is_err());
    }

    #[test]
    fn answers_are_judged_by_their_status_and_say_why() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 18\r\n\r\n{\"status\":\"ready\"}";
        assert_eq!(judge("u", ok).unwrap(), "healthy: u answered 200");
        let not = b"HTTP/1.1 503 Service Unavailable\r\n\r\n{\"code\":\"not_ready\",\"detail\":\"not ready:\\nno writer\"}";
        assert_eq!(
            judge("u", not).unwrap_err(),
            "u answered 503: not ready: no writer"
        );
        let chunked = b"HTTP/1.1 500 X\r\ntransfer-encoding: chunked\r\n\r\n10\r\n{\"title\":\"boom\"}\r\n0\r\n\r\n";
        assert_eq!(judge("u", chunked).unwrap_err(), "u answered 500: boom");
        assert_eq!(
            judge("u", b"HTTP/1.1 404 Not Found\r\n\r\n").unwrap_err(),
            "u answered 404"
        );
        assert!(judge("u", b"").unwrap_err().contains("without answering"));
        assert!(
            judge("u", b"SSH-2.0-x\r\n\r\n")
                .unwrap_err()
                .contains("did not answer HTTP")
        );
    }
}
