//! What a web page in the operator's browser can do to an anonymous server:
//! no state-changing request without JSON, none from another site or origin
//! (cross-site request forgery), and nothing at all through a host name that
//! is not loopback (DNS rebinding).

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use settled::clock::ManualClock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use settled::http::middleware::auth::Tokens;
use settled::http::middleware::origin::AllowedHosts;

use crate::common::fresh_sqlite;
use crate::common::http::{TestServer, spawn, spawn_with_tokens};

/// A server holding one dead letter, `r`.
async fn with_dead_letter() -> TestServer {
    let s = spawn(fresh_sqlite().await).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    s.outcome(&claim, json!({"kind": "permanent", "code": "signature"}))
        .await
        .ok(200);
    s
}

async fn send(
    s: &TestServer,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Value) {
    let mut request = s
        .client
        .request(method, format!("{}{path}", s.base))
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        assert_eq!(content_type, "application/problem+json", "{body}");
    }
    (status, body)
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_page_cannot_redrive_or_enqueue() {
    let s = with_dead_letter().await;
    let own_origin = s.base.clone();
    let redrive = "/v1/dead-letters/r/redrive";
    // What an HTML form can send: no JSON content type.
    for content_type in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("text/plain"),
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|c| ("content-type", c))
            .into_iter()
            .collect();
        let (status, body) = send(&s, Method::POST, redrive, &headers, "").await;
        assert_eq!(status, 415, "{content_type:?}: {body}");
        assert_eq!(body["code"], "unsupported_media_type");
        let (status, _) = send(
            &s,
            Method::POST,
            "/v1/receipts",
            &headers,
            r#"{"receipt_id":"forged","finalized_at":1}"#,
        )
        .await;
        assert_eq!(status, 415, "{content_type:?}");
    }
    // JSON, but marked by the browser as coming from another site or origin.
    for marks in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "http://evil.example")],
        vec![("origin", "null")],
        vec![("origin", "http://127.0.0.1:1")],
    ] {
        let mut headers = marks.clone();
        headers.push(JSON);
        let (status, body) = send(&s, Method::POST, redrive, &headers, "").await;
        assert_eq!(status, 403, "{marks:?}: {body}");
        assert_eq!(body["code"], "cross_site_request");
        assert_eq!(body["class"], "auth");
        let (status, _) = send(
            &s,
            Method::POST,
            "/v1/receipts",
            &headers,
            r#"{"receipt_id":"forged","finalized_at":1}"#,
        )
        .await;
        assert_eq!(status, 403, "{marks:?}");
    }
    assert_eq!(s.receipt("r").await["state"], "dead_lettered");
    s.get("/v1/receipts/forged")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    // The dashboard's own request (same origin, JSON, no body) and a plain
    // client's (JSON, no browser headers) are served.
    let (status, body) = send(
        &s,
        Method::POST,
        redrive,
        &[
            JSON,
            ("origin", &own_origin),
            ("sec-fetch-site", "same-origin"),
        ],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "pending");
    let (status, _) = send(
        &s,
        Method::POST,
        "/v1/receipts",
        &[JSON, ("origin", &own_origin)],
        r#"{"receipt_id":"mine","finalized_at":1}"#,
    )
    .await;
    assert_eq!(status, 201);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_server_answers_only_loopback_host_names() {
    let s = with_dead_letter().await;
    let port = s.base.rsplit(':').next().unwrap().to_owned();
    for host in [
        "evil.example",
        "evil.example:80",
        "localhost.evil.example",
        "10.0.0.1",
    ] {
        for (method, path, headers) in [
            (Method::GET, "/v1/status", vec![]),
            (Method::GET, "/", vec![]),
            (Method::POST, "/v1/dead-letters/r/redrive", vec![JSON]),
        ] {
            let mut headers = headers.clone();
            headers.push(("host", host));
            let (status, body) = send(&s, method.clone(), path, &headers, "").await;
            assert_eq!(status, 421, "{host} {method} {path}: {body}");
            assert_eq!(body["code"], "host_not_allowed");
        }
    }
    assert_eq!(s.receipt("r").await["state"], "dead_lettered");
    for host in [
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "127.0.0.1".to_owned(),
    ] {
        let (status, body) = send(&s, Method::GET, "/v1/status", &[("host", &host)], "").await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    s.stop().await;

    // The same request through a name that resolves to 127.0.0.1 (what a
    // rebinding attack does): refused; with the name configured, served.
    let fresh = fresh_sqlite().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        RetryPolicy::default(),
        Arc::new(ManualClock::new(1)),
        rx,
    )
    .with_allowed_hosts(AllowedHosts::loopback_and(&["settled.internal"]).unwrap());
    tokio::spawn(settled::server::serve(
        listener,
        state,
        std::future::pending(),
    ));
    let client = reqwest::Client::builder()
        .resolve("rebound.example", addr)
        .resolve("settled.internal", addr)
        .build()
        .unwrap();
    let rebound = client
        .get(format!("http://rebound.example:{}/v1/status", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    let configured = client
        .get(format!("http://settled.internal:{}/v1/status", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(configured.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_any_host_name_is_answered() {
    let tokens = Tokens::parse(&["reader:reader-token-0123456789"]).unwrap();
    let s = spawn_with_tokens(fresh_sqlite().await, tokens).await;
    let response = s
        .client
        .get(format!("{}/v1/status", s.base))
        .header("host", "settled.example.com")
        .bearer_auth("reader-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_cannot_be_framed() {
    let s = spawn(fresh_sqlite().await).await;
    let page = s.client.get(format!("{}/", s.base)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    s.stop().await;
}

#[tokio::test]
async fn an_anonymous_server_refuses_a_request_without_a_host() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = with_dead_letter().await;
    let addr = s.base.trim_start_matches("http://").to_owned();
    // HTTP/1.0 allows leaving Host out; no name means no loopback name either.
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stream
        .write_all(b"GET /v1/status HTTP/1.0\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.0 421"), "{answer}");
    assert!(answer.contains("host_not_allowed"), "{answer}");
}
