//! `GET /v1/history`: JSON pages, the live `text/event-stream` and its
//! resumption with `Last-Event-ID`, roles, and refused input.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use settled::clock::ManualClock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use settled::http::middleware::auth::Tokens;
use settled::server::Limits;
use tokio::sync::watch;

use crate::common::http::{T0, TestServer, spawn, spawn_with_tokens, urlencode};
use crate::common::{Fresh, ms};

/// Enqueue `id`, claim it and report `accepted`: one history entry.
async fn settle(s: &TestServer, id: &str) {
    s.enqueue(id).await;
    let claim = s
        .post(
            &format!("/v1/receipts/{}/claim", urlencode(id)),
            json!({"worker_id": "w", "lease_ms": 30_000}),
        )
        .await
        .ok(200)
        .clone();
    s.outcome(&claim, json!({"kind": "accepted", "transcript_id": "t"}))
        .await
        .ok(200);
}

/// Read pages from `after` until `n` entries came (on PostgreSQL an entry
/// shows once every older transaction on the server has ended, other
/// tests' included).
async fn read(s: &TestServer, after: &str, n: usize, limit: usize) -> (Vec<Value>, String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut entries = Vec::new();
    let mut after = after.to_owned();
    loop {
        let page = s
            .get(&format!("/v1/history?after={after}&limit={limit}"))
            .await
            .ok(200)
            .clone();
        entries.extend(page["entries"].as_array().expect("entries").iter().cloned());
        after = page["next_cursor"]
            .as_str()
            .expect("next_cursor")
            .to_owned();
        if entries.len() >= n {
            return (entries, after);
        }
        assert!(tokio::time::Instant::now() < deadline, "{entries:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ids(entries: &[Value]) -> Vec<&str> {
    entries
        .iter()
        .map(|e| e["receipt_id"].as_str().unwrap())
        .collect()
}

async fn pages_follow_every_entry_in_order(fresh: Fresh) {
    let s = spawn(fresh).await;
    let empty = s.get("/v1/history").await.ok(200).clone();
    assert_eq!(empty, json!({"entries": [], "next_cursor": "0-0"}));
    for id in ["c", "a", "b"] {
        settle(&s, id).await;
    }
    let (entries, next) = read(&s, "0-0", 3, 2).await;
    assert_eq!(ids(&entries), ["c", "a", "b"]);
    let first = &entries[0];
    assert_eq!(
        (&first["outcome"], &first["route"], &first["worker_id"]),
        (&json!("accepted"), &json!("no_action"), &json!("w"))
    );
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["transcript_id"], "t");
    assert_eq!(first["observed_at_ms"], T0);
    assert_eq!(entries[2]["cursor"], next.as_str());
    // Nothing new: the same cursor back.
    let page = s
        .get(&format!("/v1/history?after={next}"))
        .await
        .ok(200)
        .clone();
    assert_eq!(page, json!({"entries": [], "next_cursor": next}));
    // `latest` starts at the tip; without `after`, from the beginning.
    let tip = s.get("/v1/history?after=latest").await.ok(200).clone();
    assert_eq!(tip, json!({"entries": [], "next_cursor": next}));
    let all = s.get("/v1/history?limit=1000").await.ok(200).clone();
    assert_eq!(all["entries"].as_array().unwrap().len(), 3);
    s.stop().await;
}

async fn bad_input_is_refused_and_expired_cursors_are_gone(fresh: Fresh) {
    let s = spawn(fresh).await;
    for path in [
        "/v1/history?after=nope",
        "/v1/history?after=1",
        "/v1/history?after=-1-2",
        "/v1/history?after=0-99999",
    ] {
        s.get(path)
            .await
            .assert_problem(422, "invalid_cursor", "validation");
    }
    for path in ["/v1/history?limit=0", "/v1/history?limit=1001"] {
        s.get(path)
            .await
            .assert_problem(422, "invalid_limit", "validation");
    }
    s.get("/v1/history?limit=x")
        .await
        .assert_problem(422, "invalid_query", "validation");
    let stream = s
        .client
        .get(format!("{}/v1/history", s.base))
        .header("accept", "text/event-stream")
        .header("last-event-id", "garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 422);
    assert_eq!(stream.headers()["content-type"], "application/problem+json");

    // Retention deletes `old` before a reader at 0-0 read it.
    settle(&s, "old").await;
    s.clock.set(T0 + 10_000);
    settle(&s, "new").await;
    read(&s, "0-0", 2, 10).await;
    let purged = s.fresh.store.purge_finished(ms(T0 + 1), 100).await.unwrap();
    assert_eq!(purged, 1);
    s.get("/v1/history?after=0-0")
        .await
        .assert_problem(410, "history_cursor_expired", "not_found");
    let from_start = s.get("/v1/history").await.ok(200).clone();
    assert_eq!(ids(from_start["entries"].as_array().unwrap()), ["new"]);
    s.stop().await;
}

/// Server-sent events as they arrive on an open response.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

/// One event: `event` (empty for plain ones), `id` and `data` as JSON.
#[derive(Debug)]
struct Event {
    kind: String,
    id: String,
    data: Value,
}

impl Events {
    async fn open(s: &TestServer, last_event_id: Option<&str>, query: &str) -> Self {
        let mut request = s
            .client
            .get(format!("{}/v1/history{query}", s.base))
            .header("accept", "text/event-stream")
            // A compressed stream would be held back by the encoder.
            .header("accept-encoding", "gzip");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let headers = response.headers();
        assert_eq!(headers["content-type"], "text/event-stream");
        assert!(headers.get("content-encoding").is_none(), "{headers:?}");
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (comments skipped), or `None` when the stream ended.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Event {
                    kind: String::new(),
                    id: String::new(),
                    data: Value::Null,
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        event.id = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event.kind = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        event.data = serde_json::from_str(v).unwrap();
                    }
                }
                if event.data.is_null() {
                    continue;
                }
                return Some(event);
            }
            // Long enough for other tests' transactions on the server to end.
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.response.chunk())
                .await
                .expect("an event within 60 s");
            match chunk {
                Ok(Some(bytes)) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    async fn entry(&mut self) -> Event {
        let event = self.next().await.expect("an event, not the end");
        assert_eq!(event.kind, "", "{event:?}");
        assert_eq!(event.data["cursor"], event.id.as_str());
        event
    }
}

async fn a_stream_sends_entries_live_and_resumes_without_repeats(fresh: Fresh) {
    let s = spawn(fresh).await;
    settle(&s, "before").await;
    read(&s, "0-0", 1, 10).await;
    let mut live = Events::open(&s, None, "?after=latest").await;
    let metrics = s.get_text("/metrics").await;
    assert!(
        metrics.contains("settled_history_streams 1"),
        "one stream open: {metrics}"
    );
    settle(&s, "e1").await;
    let e1 = live.entry().await;
    assert_eq!(e1.data["receipt_id"], "e1");
    settle(&s, "e2").await;
    let e2 = live.entry().await;
    assert_eq!(e2.data["receipt_id"], "e2");
    drop(live);

    settle(&s, "e3").await;
    // Resume after e1: e2 again (not received as far as the header says), e3, then live.
    let mut resumed = Events::open(&s, Some(&e1.id), "?after=0-0").await;
    let again = resumed.entry().await;
    assert_eq!((again.id.as_str(), &again.data), (e2.id.as_str(), &e2.data));
    assert_eq!(resumed.entry().await.data["receipt_id"], "e3");
    settle(&s, "e4").await;
    assert_eq!(resumed.entry().await.data["receipt_id"], "e4");
    // From the beginning, everything once, in order.
    let mut all = Events::open(&s, None, "").await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(
            all.entry().await.data["receipt_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(seen, ["before", "e1", "e2", "e3", "e4"]);
    drop((resumed, all));
    s.stop().await;
}

async fn shutdown_ends_open_streams(fresh: Fresh) {
    let s = spawn(fresh).await;
    let mut live = Events::open(&s, None, "").await;
    let stopping = tokio::spawn(s.stop());
    assert!(live.next().await.is_none(), "the stream ends");
    tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("the server stops without waiting out its grace period")
        .unwrap();
}

/// `before` reads the newest entries up to a position (what a console shows
/// when it opens); its `next_cursor` continues with no gap and no repeat.
async fn before_reads_the_newest_entries_and_continues_after_them(fresh: Fresh) {
    let s = spawn(fresh).await;
    let empty = s.get("/v1/history?before=latest").await.ok(200).clone();
    assert_eq!(empty, json!({"entries": [], "next_cursor": "0-0"}));
    for id in ["a", "b", "c", "d", "e"] {
        settle(&s, id).await;
    }
    let (all, tip) = read(&s, "0-0", 5, 100).await;
    assert_eq!(ids(&all), ["a", "b", "c", "d", "e"]);
    let newest = s
        .get("/v1/history?before=latest&limit=2")
        .await
        .ok(200)
        .clone();
    let entries = newest["entries"].as_array().unwrap().clone();
    assert_eq!(ids(&entries), ["d", "e"], "oldest of them first");
    assert_eq!(newest["next_cursor"], tip.as_str());
    // Up to an entry's own cursor, that entry included.
    let at_c = all[2]["cursor"].as_str().unwrap();
    let page = s
        .get(&format!("/v1/history?before={at_c}&limit=2"))
        .await
        .ok(200)
        .clone();
    assert_eq!(ids(page["entries"].as_array().unwrap()), ["b", "c"]);
    assert_eq!(page["next_cursor"], at_c);
    // Continuing after it: the rest, once each.
    let (rest, _) = read(&s, at_c, 2, 100).await;
    assert_eq!(ids(&rest), ["d", "e"]);
    let everything = s
        .get(&format!("/v1/history?before={tip}&limit=1000"))
        .await
        .ok(200)
        .clone();
    assert_eq!(everything["entries"].as_array().unwrap().len(), 5);
    for (query, status, code) in [
        ("before=latest&after=0-0", 422, "invalid_query"),
        ("before=nonsense", 422, "invalid_cursor"),
        ("before=999999-999999", 422, "invalid_cursor"),
    ] {
        s.get(&format!("/v1/history?{query}"))
            .await
            .assert_problem(status, code, "validation");
    }
    s.stop().await;
}

crate::on_every_backend!(
    before_reads_the_newest_entries_and_continues_after_them,
    pages_follow_every_entry_in_order,
    bad_input_is_refused_and_expired_cursors_are_gone,
    a_stream_sends_entries_live_and_resumes_without_repeats,
    shutdown_ends_open_streams,
);

#[tokio::test]
async fn readers_and_operators_may_follow_the_feed_producers_and_workers_not() {
    let roles = [
        ("producer", "producer-token-0123456789", 403),
        ("worker", "worker-token-0123456789", 403),
        ("reader", "reader-token-0123456789", 200),
        ("operator", "operator-token-0123456789", 200),
    ];
    let entries: Vec<String> = roles.iter().map(|(r, t, _)| format!("{r}:{t}")).collect();
    let fresh = crate::common::fresh_sqlite().await;
    let s = spawn_with_tokens(fresh, Tokens::parse(&entries).unwrap()).await;
    for (role, token, status) in roles {
        for accept in ["application/json", "text/event-stream"] {
            let response = s
                .client
                .get(format!("{}/v1/history", s.base))
                .bearer_auth(token)
                .header("accept", accept)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), status, "{role} {accept}");
        }
    }
    s.stop().await;
}

/// A stream keeps its connection busy: the idle timeout, which closes
/// connections on which no request runs, leaves it open.
#[tokio::test]
async fn the_idle_timeout_does_not_cut_a_stream() {
    let fresh = crate::common::fresh_sqlite().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        RetryPolicy::default(),
        Arc::new(ManualClock::new(T0)),
        rx.clone(),
    );
    let limits = Limits {
        idle_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let mut stopped = rx;
    let server = tokio::spawn(settled::server::serve_with(
        listener,
        state,
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
        limits,
    ));
    let response = reqwest::Client::new()
        .get(format!("{base}/v1/history"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    let mut events = Events {
        response,
        buffer: String::new(),
    };
    // Several idle timeouts pass with nothing to send.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let store = fresh.store.as_ref();
    store
        .enqueue(
            &[settled::store::NewReceipt {
                priority: settled::domain::Priority::default(),
                trace: None,
                receipt_id: settled::domain::ReceiptId::parse("r").unwrap(),
                finalized_at: 1,
                observation: None,
                visible_at_ms: None,
                group: settled::domain::GroupName::default_group(),
            }],
            ms(T0),
        )
        .await
        .unwrap();
    let worker = settled::domain::WorkerId::parse("w").unwrap();
    let lease = settled::domain::LeaseMs::try_from(1_000).unwrap();
    let claims = store
        .claim_due(
            &worker,
            ms(T0),
            lease,
            settled::domain::ClaimLimit::try_from(1).unwrap(),
        )
        .await
        .unwrap();
    let released = store.release_lease(&claims[0], ms(T0)).await;
    released.unwrap();
    let event = events.entry().await;
    assert_eq!(event.data["outcome"], "released");
    let _ = stop.send(true);
    server.await.unwrap().unwrap();
}
