//! W3C trace context on enqueue: kept with the receipt and handed to every
//! claim of it (docs/operators.md, "Traces").

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};

use crate::common::Fresh;
use crate::common::http::{T0, TestServer, spawn, spawn_traced};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const OTHER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn the_producers_trace_context_reaches_every_claim(fresh: Fresh) {
    let s = spawn(fresh).await;
    let enqueue = |body: Value, headers: Vec<(&'static str, &'static str)>| {
        let mut request = s.client.post(format!("{}/v1/receipts", s.base)).json(&body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    // From the headers, from the body (which wins over the headers), none.
    let headers = vec![
        ("traceparent", PARENT),
        ("tracestate", "rojo=00f067aa0ba902b7"),
    ];
    assert_eq!(
        enqueue(
            json!({"receipt_id": "h", "finalized_at": 1}),
            headers.clone()
        )
        .await,
        201
    );
    let body = json!({"receipt_id": "b", "finalized_at": 1, "traceparent": OTHER});
    assert_eq!(enqueue(body, headers.clone()).await, 201);
    assert_eq!(
        enqueue(json!({"receipt_id": "n", "finalized_at": 1}), vec![]).await,
        201
    );
    // A mangled header is ignored (W3C): the receipt is stored without it.
    let mangled = vec![("traceparent", "00-xyz-01")];
    assert_eq!(
        enqueue(json!({"receipt_id": "m", "finalized_at": 1}), mangled).await,
        201
    );
    // The same receipt with another context is the same receipt; the first is kept.
    let again = json!({"receipt_id": "h", "finalized_at": 1, "traceparent": OTHER});
    assert_eq!(enqueue(again, vec![]).await, 200);

    let claims = s.claim("w", 10).await;
    let of = |id: &str| {
        claims
            .iter()
            .find(|c| c["receipt_id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(of("h")["traceparent"], PARENT);
    assert_eq!(of("h")["tracestate"], "rojo=00f067aa0ba902b7");
    assert_eq!(of("b")["traceparent"], OTHER);
    assert!(
        of("b").get("tracestate").is_none(),
        "the body named no tracestate"
    );
    for id in ["n", "m"] {
        assert!(of(id).get("traceparent").is_none(), "{id}: {}", of(id));
    }
    // Sent back with the claim, the context is not compared.
    let mut echoed = of("b");
    echoed["traceparent"] = json!(PARENT);
    s.outcome(&echoed, json!({"kind": "accepted", "transcript_id": "t"}))
        .await
        .ok(200);
    // A retry's next claim, and a claim by id, carry it again.
    s.outcome(
        &of("h"),
        json!({"kind": "retryable", "code": "rpc", "detail": ""}),
    )
    .await
    .ok(200);
    s.clock.set(T0 + 3_600_000);
    let by_id = s
        .post(
            "/v1/receipts/h/claim",
            json!({"worker_id": "w2", "lease_ms": 1_000}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(by_id["traceparent"], PARENT);
    // Batches: an item's own context, else the request's header.
    let batch = json!({"receipts": [
        {"receipt_id": "x1", "finalized_at": 1},
        {"receipt_id": "x2", "finalized_at": 1, "traceparent": OTHER, "tracestate": "k=v"},
    ]});
    let answer = s
        .client
        .post(format!("{}/v1/receipts/batch", s.base))
        .header("traceparent", PARENT)
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let claims = s.claim("w3", 10).await;
    let of = |id: &str| {
        claims
            .iter()
            .find(|c| c["receipt_id"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(of("x1")["traceparent"], PARENT);
    assert!(of("x1").get("tracestate").is_none());
    assert_eq!(of("x2")["traceparent"], OTHER);
    assert_eq!(of("x2")["tracestate"], "k=v");
    s.stop().await;
}

async fn a_malformed_trace_context_in_a_body_is_refused(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (parent, state) in [
        (
            json!("00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"),
            Value::Null,
        ),
        (
            json!("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Value::Null,
        ),
        (json!(format!("{PARENT}-extra")), Value::Null),
        (json!(PARENT), json!("a".repeat(513))),
        (Value::Null, json!("k=v")),
    ] {
        let mut body = json!({"receipt_id": "r", "finalized_at": 1});
        if !parent.is_null() {
            body["traceparent"] = parent.clone();
        }
        if !state.is_null() {
            body["tracestate"] = state;
        }
        s.post("/v1/receipts", body).await.assert_problem(
            422,
            "invalid_trace_context",
            "validation",
        );
    }
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "r", "finalized_at": 1, "traceparent": 7}),
    )
    .await
    .assert_problem(422, "invalid_body", "validation");
    assert!(s.claim("w", 10).await.is_empty(), "nothing was stored");
    s.stop().await;
}

/// An OTLP/HTTP receiver: every span posted to `/v1/traces`, decoded with
/// the official protobuf definitions, and the service names sent.
struct Receiver {
    traces_url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    services: Arc<Mutex<Vec<String>>>,
}

async fn receiver() -> Receiver {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let services: Arc<Mutex<Vec<String>>> = Arc::default();
    let (kept, named) = (spans.clone(), services.clone());
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| async move {
            let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
            for resource in request.resource_spans {
                for kv in resource.resource.map(|r| r.attributes).unwrap_or_default() {
                    if kv.key == "service.name"
                        && let Some(Any::StringValue(name)) = kv.value.and_then(|v| v.value)
                    {
                        named.lock().unwrap().push(name);
                    }
                }
                for scope in resource.scope_spans {
                    kept.lock().unwrap().extend(scope.spans);
                }
            }
            (
                [("content-type", "application/x-protobuf")],
                Vec::<u8>::new(),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let traces_url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Receiver {
        traces_url,
        spans,
        services,
    }
}

impl Receiver {
    /// The first span that `pick` accepts, waiting up to 20 s for it.
    async fn span(&self, what: &str, pick: impl Fn(&Span) -> bool) -> Span {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(span) = self.spans.lock().unwrap().iter().find(|s| pick(s)) {
                return span.clone();
            }
            assert!(Instant::now() < deadline, "no span {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn attribute(span: &Span, key: &str) -> Option<Any> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone()?.value)
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key)? {
        Any::StringValue(s) => Some(s),
        other => panic!("{key} is {other:?}"),
    }
}

fn status_code(span: &Span) -> i64 {
    match attribute(span, "http.response.status_code") {
        Some(Any::IntValue(code)) => code,
        other => panic!("status code {other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(name: &'a str, status: i64) -> impl Fn(&Span) -> bool + 'a {
    move |s| s.name == name && status_code(s) == status
}

async fn metric(s: &TestServer, name: &str) -> f64 {
    super::metrics::parse(&s.get_text("/metrics").await)[name]
}

/// The producer's trace runs through the server: enqueue, claim and outcome
/// spans are in its trace, with the attributes operators filter on.
async fn server_spans_continue_the_producers_trace(fresh: Fresh) {
    let r = receiver().await;
    let s = spawn_traced(fresh, &r.traces_url, 4096).await;
    let trace_id = &PARENT[3..35];
    let producer_span = &PARENT[36..52];
    let answer = s
        .client
        .post(format!("{}/v1/receipts", s.base))
        .header("traceparent", PARENT)
        .json(&json!({"receipt_id": "t1", "finalized_at": 1, "group": "rail-a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    let claims = s.claim("w-1", 1).await;
    assert_eq!(
        claims[0]["traceparent"], PARENT,
        "the claim's answer carries it"
    );
    // The worker's span around its work, a child of the producer's (what the SDKs send).
    let worker_span = "b7ad6b7169203331";
    let worker_parent = format!("00-{trace_id}-{worker_span}-01");
    let done = s
        .client
        .post(format!("{}/v1/receipts/t1/outcome", s.base))
        .header("traceparent", &worker_parent)
        .json(&json!({"claim": claims[0], "outcome": {"kind": "accepted", "transcript_id": "x"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    // Sent again without a header: refused, and still in the producer's trace.
    s.outcome(
        &claims[0],
        json!({"kind": "accepted", "transcript_id": "x"}),
    )
    .await
    .assert_problem(409, "receipt_finished", "conflict");

    let enqueue = r.span("enqueue", named("POST /v1/receipts", 201)).await;
    assert_eq!(hex(&enqueue.trace_id), trace_id);
    assert_eq!(hex(&enqueue.parent_span_id), producer_span);
    assert_eq!(text(&enqueue, "settled.receipt_id").as_deref(), Some("t1"));
    assert_eq!(text(&enqueue, "settled.group").as_deref(), Some("rail-a"));

    let claim = r.span("claim", named("POST /v1/claims", 200)).await;
    assert_eq!(
        hex(&claim.trace_id),
        trace_id,
        "the claim is in the producer's trace"
    );
    assert_eq!(hex(&claim.parent_span_id), producer_span);
    assert_eq!(text(&claim, "http.route").as_deref(), Some("/v1/claims"));
    assert_eq!(text(&claim, "settled.receipt_id").as_deref(), Some("t1"));
    assert_eq!(text(&claim, "settled.worker_id").as_deref(), Some("w-1"));
    assert_eq!(text(&claim, "settled.group").as_deref(), Some("rail-a"));
    assert_eq!(claim.kind, 2, "SPAN_KIND_SERVER");

    let outcome = r
        .span("outcome", named("POST /v1/receipts/{id}/outcome", 200))
        .await;
    assert_eq!(hex(&outcome.trace_id), trace_id);
    assert_eq!(
        hex(&outcome.parent_span_id),
        worker_span,
        "the worker's span is its parent"
    );
    assert_eq!(
        text(&outcome, "settled.outcome.route").as_deref(),
        Some("no_action")
    );
    assert_eq!(text(&outcome, "settled.receipt_id").as_deref(), Some("t1"));
    assert_eq!(text(&outcome, "settled.worker_id").as_deref(), Some("w-1"));

    let refused = r
        .span(
            "refused outcome",
            named("POST /v1/receipts/{id}/outcome", 409),
        )
        .await;
    assert_eq!(
        hex(&refused.trace_id),
        trace_id,
        "the claim sent back carries the trace"
    );
    assert_eq!(
        text(&refused, "settled.conflict_code").as_deref(),
        Some("receipt_finished")
    );
    assert!(text(&refused, "settled.outcome.route").is_none());

    // A claim of receipts from two traces starts its own trace and links both.
    for (id, parent) in [("l1", PARENT), ("l2", OTHER)] {
        s.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": 1, "traceparent": parent}),
        )
        .await
        .ok(201);
    }
    assert_eq!(s.claim("w-2", 5).await.len(), 2);
    let linked = r
        .span("claim of two", |s| {
            s.name == "POST /v1/claims" && text(s, "settled.worker_id").as_deref() == Some("w-2")
        })
        .await;
    let mut links: Vec<String> = linked.links.iter().map(|l| hex(&l.trace_id)).collect();
    links.sort();
    assert_eq!(links, [&OTHER[3..35], trace_id]);
    assert!(linked.parent_span_id.is_empty(), "a root span");
    assert!(
        text(&linked, "settled.receipt_id").is_none(),
        "two receipts"
    );
    assert_eq!(r.services.lock().unwrap()[0], "settled");
    assert_eq!(metric(&s, "settled_trace_spans_dropped_total").await, 0.0);
    assert!(metric(&s, "settled_trace_spans_exported_total").await >= 6.0);
    s.stop().await;
}

/// A collector that never answers, or is gone: requests are answered as
/// before (none waits for the export), and the spans that cannot be sent
/// are dropped and counted.
async fn an_unreachable_collector_never_holds_a_request(fresh: Fresh) {
    // Accepts connections and never answers: exports hang until their timeout (10 s).
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let s = spawn_traced(fresh, &url, 8).await;
    // A first batch goes out (within a second) and hangs at the collector.
    s.enqueue("first").await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut slowest = Duration::ZERO;
    for i in 0..60 {
        let started = Instant::now();
        s.enqueue(&format!("r{i}")).await;
        slowest = slowest.max(started.elapsed());
    }
    // Far below the export timeout: no request waited for the collector.
    assert!(
        slowest < Duration::from_secs(5),
        "slowest request {slowest:?}"
    );
    // The queue holds 8 spans; the rest of the 60 were dropped at once.
    assert!(
        metric(&s, "settled_trace_spans_dropped_total").await >= 52.0,
        "dropped: {}",
        metric(&s, "settled_trace_spans_dropped_total").await
    );
    assert_eq!(metric(&s, "settled_trace_spans_exported_total").await, 0.0);
    s.stop().await;

    // Nothing listens any more: each batch fails at once and is counted.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1/traces", l.local_addr().unwrap())
    };
    let fresh = crate::common::fresh_sqlite().await;
    let s = spawn_traced(fresh, &gone, 4096).await;
    for i in 0..5 {
        s.enqueue(&format!("g{i}")).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&s, "settled_trace_spans_dropped_total").await < 5.0 {
        assert!(
            Instant::now() < deadline,
            "refused exports were not counted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.stop().await;
}

/// The binary turns export on by the standard variables, names itself by
/// `OTEL_SERVICE_NAME`, and sends the spans still queued when it is stopped
/// before it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_by_the_standard_variables_and_flushes_on_stop() {
    let r = receiver().await;
    let endpoint = r.traces_url.trim_end_matches("/v1/traces").to_owned();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let server = crate::common::process::Launch::new(dir.path())
        .database(&url)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_SERVICE_NAME", "settled-eu")
        .spawn()
        .ready_async()
        .await;
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/receipts", server.base))
        .header("traceparent", PARENT)
        .json(&json!({"receipt_id": "last", "finalized_at": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    // Stopped at once: the span is still in the export queue.
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    let spans = r.spans.lock().unwrap().clone();
    let enqueue = spans
        .iter()
        .find(|s| s.name == "POST /v1/receipts")
        .expect("the queued span was sent before the process exited");
    assert_eq!(hex(&enqueue.trace_id), &PARENT[3..35]);
    assert_eq!(r.services.lock().unwrap()[0], "settled-eu");
}

crate::on_every_backend!(
    the_producers_trace_context_reaches_every_claim,
    a_malformed_trace_context_in_a_body_is_refused,
    server_spans_continue_the_producers_trace,
    an_unreachable_collector_never_holds_a_request
);
