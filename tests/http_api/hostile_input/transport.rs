//! The connection: slow, stalled and idle clients, half-sent request heads,
//! HTTP/2 prefaces and the connection cap, on a real listener (SQLite only).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use settled::clock::SystemClock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use settled::server::Limits;
use tokio::sync::watch;

use crate::common;
use crate::common::Fresh;

mod http2;

/// A server on the system clock with a short shutdown grace period.
struct Live {
    addr: SocketAddr,
    base: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _fresh: Fresh,
}

async fn live(grace: Duration) -> Live {
    live_with(Limits {
        grace,
        ..Limits::default()
    })
    .await
}

async fn live_with(limits: Limits) -> Live {
    let fresh = common::fresh_sqlite().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        RetryPolicy::default(),
        Arc::new(SystemClock),
        rx.clone(),
    );
    let mut stopped = rx;
    let task = tokio::spawn(settled::server::serve_with(
        listener,
        state,
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
        limits,
    ));
    Live {
        addr,
        base: format!("http://{addr}"),
        stop,
        task,
        _fresh: fresh,
    }
}

impl Live {
    async fn status_counts(&self) -> Value {
        let status: Value = reqwest::get(format!("{}/v1/status", self.base))
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        status["counts"].clone()
    }

    /// Stop and return how long the server took to return.
    async fn stop(self) -> Duration {
        let started = Instant::now();
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the server returned")
            .expect("server task")
            .expect("server");
        started.elapsed()
    }
}

/// Read one response (status and body) or `None` if the connection closed
/// or nothing complete came within `limit`.
fn read_response(stream: &mut TcpStream, limit: Duration) -> Option<(u16, String)> {
    let deadline = Instant::now() + limit;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match stream.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
        let text = String::from_utf8_lossy(&buffer).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                return Some((status, body.to_owned()));
            }
        }
    }
}

/// Whether the server closed `stream` within `limit` (EOF or reset).
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut chunk = [0u8; 256];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let _ = stream.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

const HEAD: &str =
    "POST /v1/receipts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_client_is_served() {
    let server = live(Duration::from_secs(2)).await;
    let addr = server.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let body = r#"{"receipt_id":"slow","finalized_at":1}"#;
        let request = format!("{HEAD}Content-Length: {}\r\n\r\n{body}", body.len());
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        for byte in request.as_bytes() {
            stream.write_all(&[*byte]).expect("write");
            std::thread::sleep(Duration::from_millis(5));
        }
        read_response(&mut stream, Duration::from_secs(10))
    })
    .await
    .expect("client");
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, 201, "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_sending_its_body_gets_408_and_changes_nothing() {
    let server = live(Duration::from_secs(2)).await;
    let before = server.status_counts().await;
    let addr = server.addr;
    let started = Instant::now();
    // A Content-Length body cut short, and a chunked body that stops; both at once.
    let stalls = [
        format!("{HEAD}Content-Length: 100\r\n\r\n{{\"receipt_id\":\"stalled\""),
        format!("{HEAD}Transfer-Encoding: chunked\r\n\r\n9\r\n{{\"receipt\r\n"),
    ];
    let clients: Vec<_> = stalls
        .into_iter()
        .map(|request| {
            tokio::task::spawn_blocking(move || {
                let mut stream = TcpStream::connect(addr).expect("connect");
                stream.write_all(request.as_bytes()).expect("write");
                read_response(&mut stream, Duration::from_secs(25))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for client in clients {
        answers.push(client.await.expect("client"));
    }
    let elapsed = started.elapsed();
    for answer in answers {
        let (status, body) = answer.expect("the stalled request is answered");
        assert_eq!(status, 408, "{body}");
        let problem: Value = serde_json::from_str(&body).expect("problem");
        assert_eq!(problem["code"], "request_timeout");
        assert_eq!(problem["class"], "validation");
    }
    assert!(
        elapsed < Duration::from_secs(15),
        "answered within the body read timeout: {elapsed:?}"
    );
    assert_eq!(server.status_counts().await, before);
    println!("stalled bodies answered 408 after {elapsed:.1?}");
    server.stop().await;
}

/// Connections that never send anything, and connections that stop part-way
/// through a request head, do not stop others from being served, and do not
/// keep a stopping server alive past its grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_open_connections_do_not_starve_others_or_block_shutdown() {
    let idle_count = 500;
    let partial_count = 50;
    let grace = Duration::from_secs(2);
    let server = live(grace).await;
    let addr = server.addr;
    let held = tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        for _ in 0..idle_count {
            held.push(TcpStream::connect(addr).expect("connect idle"));
        }
        for i in 0..partial_count {
            let mut stream = TcpStream::connect(addr).expect("connect partial");
            let head = format!("{HEAD}Content-Len");
            stream
                .write_all(&head.as_bytes()[..head.len() - i % 20])
                .expect("write");
            held.push(stream);
        }
        held
    })
    .await
    .expect("connect");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let mut slowest = Duration::ZERO;
    for i in 0..50 {
        let started = Instant::now();
        let answer = http
            .post(format!("{}/v1/receipts", server.base))
            .json(&json!({"receipt_id": format!("busy-{i}"), "finalized_at": 1}))
            .send()
            .await
            .expect("served despite idle connections");
        assert_eq!(answer.status(), 201);
        let answer = http
            .get(format!("{}/v1/receipts/busy-{i}", server.base))
            .send()
            .await
            .expect("served");
        assert_eq!(answer.status(), 200);
        slowest = slowest.max(started.elapsed());
    }
    // Starved requests would wait for a held connection's 10 s head timeout
    // (or the 60 s idle one); a loaded machine alone takes a few seconds.
    assert!(
        slowest < Duration::from_secs(8),
        "slowest pair took {slowest:?}"
    );
    assert_eq!(server.status_counts().await["pending"], 50);
    let took = server.stop().await;
    assert!(
        took < grace + Duration::from_secs(3),
        "half-sent requests kept the server from stopping: {took:?}"
    );
    drop(held);
    println!(
        "{idle_count} idle + {partial_count} half-open connections: 100 requests served, slowest pair {slowest:.1?}, stopped in {took:.1?}"
    );
}

/// A client that sends part of a request head and then nothing is cut off
/// after the header read timeout (10 s), so such clients cannot pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_sending_its_request_head_is_cut_off() {
    let server = live(Duration::from_secs(2)).await;
    let addr = server.addr;
    let closed = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .write_all(b"POST /v1/receipts HTTP/1.1\r\nHost: localhost\r\nContent-")
            .expect("write");
        let started = std::time::Instant::now();
        (
            closed_within(&mut stream, Duration::from_secs(20)),
            started.elapsed(),
        )
    })
    .await
    .expect("client");
    let (closed, took) = closed;
    assert!(
        closed,
        "the half-sent request head was still open after 20 s"
    );
    assert!(
        took >= Duration::from_secs(9),
        "cut off too early: {took:?}"
    );
    server.stop().await;
}

/// Limits with a short idle timeout, so that tests of it are quick.
fn short_idle(idle_timeout: Duration, max_connections: usize) -> Limits {
    Limits {
        idle_timeout,
        max_connections,
        grace: Duration::from_secs(2),
    }
}

/// The HTTP/2 connection preface and an empty SETTINGS frame: what a client
/// sends before its first request.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A connection that sends nothing, an HTTP/2 connection idle after its
/// preface, and an HTTP/1.1 keep-alive connection idle after a request are
/// all closed once idle for the idle timeout (here 1 s), and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_idle_and_preface_only_connections_are_closed_on_a_timer() {
    let idle = Duration::from_secs(1);
    let server = live_with(short_idle(idle, 100)).await;
    let addr = server.addr;
    let results = tokio::task::spawn_blocking(move || {
        let mut silent = TcpStream::connect(addr).expect("connect");
        let mut h2 = TcpStream::connect(addr).expect("connect");
        h2.write_all(H2_PREFACE).expect("preface");
        let mut kept = TcpStream::connect(addr).expect("connect");
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("request");
        let answered = read_response(&mut kept, Duration::from_secs(10));
        let started = Instant::now();
        let mut results = Vec::new();
        for (name, stream) in [
            ("silent", &mut silent),
            ("h2", &mut h2),
            ("keep-alive", &mut kept),
        ] {
            results.push((name, closed_within(stream, Duration::from_secs(20))));
        }
        (answered, started.elapsed(), results)
    })
    .await
    .expect("client");
    let (answered, took, results) = results;
    assert_eq!(answered.map(|(status, _)| status), Some(200));
    for (name, closed) in results {
        assert!(closed, "the {name} connection was still open after 20 s");
    }
    // Not before the idle timeout (allowing for the time the request took).
    assert!(took >= idle / 2, "closed too early: {took:?}");
    server.stop().await;
}

/// At the connection cap, sockets that send nothing do not stop the service:
/// each new connection closes the one idle longest, so /healthz and real
/// requests are served while an attacker holds many more sockets than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_silent_sockets_make_room_for_real_clients() {
    let cap = 20;
    let server = live_with(short_idle(Duration::from_secs(600), cap)).await;
    let addr = server.addr;
    let held = tokio::task::spawn_blocking(move || {
        (0..cap * 5)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("connect");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    for i in 0..cap * 2 {
        let health = http
            .get(format!("{}/healthz", server.base))
            .send()
            .await
            .expect("served at the cap");
        assert_eq!(health.status(), 200);
        let created = http
            .post(format!("{}/v1/receipts", server.base))
            .json(&json!({"receipt_id": format!("cap-{i}"), "finalized_at": 1}))
            .send()
            .await
            .expect("served at the cap");
        assert_eq!(created.status(), 201);
    }
    let open = tokio::task::spawn_blocking(move || {
        let mut open = 0;
        for mut stream in held {
            if !closed_within(&mut stream, Duration::from_millis(20)) {
                open += 1;
            }
        }
        open
    })
    .await
    .expect("count");
    assert!(
        open <= cap,
        "{open} silent sockets still open with a cap of {cap}"
    );
    assert_eq!(server.status_counts().await["pending"], cap * 2);
    server.stop().await;
}

/// At the cap with every connection busy (long polls), a new connection is
/// closed at once rather than left waiting; once the polls end, new
/// connections are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_every_connection_busy_a_new_one_is_closed_at_once() {
    let cap = 2;
    let server = live_with(short_idle(Duration::from_secs(600), cap)).await;
    let addr = server.addr;
    let outcome = tokio::task::spawn_blocking(move || {
        let body = r#"{"worker_id":"w","lease_ms":1000,"limit":1,"wait_ms":10000}"#;
        let request = format!(
            "POST /v1/claims HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut polls: Vec<TcpStream> = (0..cap)
            .map(|_| {
                let mut stream = TcpStream::connect(addr).expect("connect");
                stream.write_all(request.as_bytes()).expect("write");
                stream
            })
            .collect();
        // Let both polls start waiting: a poll whose request is not read yet
        // does not count as busy, and a loaded machine can take a while to
        // read it. The polls wait 10 s, so 2 s leaves the check inside them.
        std::thread::sleep(Duration::from_secs(2));
        let mut extra = TcpStream::connect(addr).expect("connect");
        let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let refused = read_response(&mut extra, Duration::from_secs(2)).is_none();
        let answered: Vec<_> = polls
            .iter_mut()
            .map(|s| read_response(s, Duration::from_secs(25)).map(|(status, _)| status))
            .collect();
        (refused, answered)
    })
    .await
    .expect("client");
    let (refused, answered) = outcome;
    assert!(
        refused,
        "a connection beyond the cap was served while all were busy"
    );
    assert_eq!(
        answered,
        vec![Some(200); cap],
        "the long polls were answered"
    );
    let health = reqwest::get(format!("{}/healthz", server.base))
        .await
        .expect("served after the polls");
    assert_eq!(health.status(), 200);
    server.stop().await;
}
