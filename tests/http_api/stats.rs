//! `GET /v1/stats`: the per-minute rates of a scripted scenario, the minutes
//! moving with the server clock, replicas of one database summing up, the
//! counts of a stopping server kept, bad parameters and roles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use settled::clock::Clock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use settled::http::middleware::auth::Tokens;
use settled::store::postgres::PostgresOptions;
use settled::store::{STATS_MINUTE_MS, open_store};

use crate::common::http::{T0, TestServer, spawn, spawn_with_tokens};
use crate::common::{Fresh, fresh_sqlite, ms, raw_scalars};

const COUNTERS: [&str; 6] = [
    "enqueued",
    "settled",
    "skipped",
    "retried",
    "dead_lettered",
    "conflicts",
];

/// The counters of one entry, in [`COUNTERS`] order.
fn counters(entry: &Value) -> Vec<u64> {
    COUNTERS
        .iter()
        .map(|c| {
            entry[c]
                .as_u64()
                .unwrap_or_else(|| panic!("{c} in {entry}"))
        })
        .collect()
}

async fn series(s: &TestServer, query: &str) -> Vec<Value> {
    let body = s.get(&format!("/v1/stats{query}")).await.ok(200).clone();
    assert_eq!(body["minute_ms"], STATS_MINUTE_MS);
    assert_eq!(body["now_ms"], s.clock.now_ms());
    body["minutes"].as_array().unwrap().clone()
}

async fn the_series_counts_a_scripted_scenario_minute_by_minute(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c", "d"] {
        s.enqueue(id).await;
    }
    // The same receipt again changes nothing and counts nothing.
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "a", "finalized_at": 100}),
    )
    .await
    .ok(200);
    let batch = json!({"receipts": [
        {"receipt_id": "e", "finalized_at": 100},
        {"receipt_id": "a", "finalized_at": 100},
        {"receipt_id": "f", "finalized_at": 100},
    ]});
    s.post("/v1/receipts/batch", batch).await.ok(200);
    let claims = s.claim("w", 4).await;
    assert_eq!(claims.len(), 4);
    s.outcome(
        &claims[0],
        json!({"kind": "accepted", "transcript_id": "t"}),
    )
    .await
    .ok(200);
    s.outcome(&claims[1], json!({"kind": "skipped", "reason": "denied"}))
        .await
        .ok(200);
    let outcome = |claim: &Value, kind: &str| json!({"claim": claim, "outcome": {"kind": kind, "code": "rpc", "detail": ""}});
    let batch =
        json!({"outcomes": [outcome(&claims[2], "retryable"), outcome(&claims[3], "permanent")]});
    s.post("/v1/outcomes", batch).await.ok(200);
    // A stale claim: refused as a conflict.
    s.outcome(
        &claims[0],
        json!({"kind": "accepted", "transcript_id": "t"}),
    )
    .await
    .assert_problem(409, "receipt_finished", "conflict");

    let minutes = series(&s, "").await;
    assert_eq!(minutes.len(), 60, "the last hour");
    let now_minute = T0 - T0 % STATS_MINUTE_MS;
    for (i, entry) in minutes.iter().enumerate() {
        assert_eq!(
            entry["start_ms"],
            now_minute - (59 - i as u64) * STATS_MINUTE_MS,
            "oldest first, the current minute last"
        );
    }
    for entry in &minutes[..59] {
        assert_eq!(counters(entry), [0; 6], "{entry}");
        assert_eq!(entry["depth"], Value::Null, "no sample: {entry}");
    }
    let current = &minutes[59];
    assert_eq!(counters(current), [6, 1, 1, 1, 1, 1], "{current}");
    // Active: c (retry scheduled), e and f (pending).
    assert_eq!(current["depth"], 3);

    // A minute later: a new entry, the previous one kept.
    s.clock.advance(STATS_MINUTE_MS);
    s.enqueue("g").await;
    let minutes = series(&s, "?minutes=2").await;
    assert_eq!(minutes.len(), 2);
    assert_eq!(minutes[0]["start_ms"], now_minute);
    assert_eq!(counters(&minutes[0]), [6, 1, 1, 1, 1, 1]);
    assert_eq!(counters(&minutes[1]), [1, 0, 0, 0, 0, 0]);
    assert_eq!(minutes[1]["depth"], 4);

    // Three hours later: the hour holds nothing, and the old rows are gone.
    s.clock.advance(3 * 3_600_000);
    let minutes = series(&s, "?minutes=60").await;
    assert!(minutes[..59].iter().all(|m| counters(m) == [0; 6]));
    assert_eq!(minutes[59]["depth"], 4, "sampled again in this minute");
    let kept: Vec<i64> = raw_scalars(&s.fresh, "SELECT COUNT(*) FROM stats_minutes").await;
    assert_eq!(kept, [1], "only the current minute is stored");
    s.stop().await;
}

/// A second server ("replica") on the same database and clock.
struct Replica {
    base: String,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Replica {
    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap().unwrap();
    }
}

/// Start a [`Replica`] that adds its counts to the database every `every`.
async fn replica(s: &TestServer, every: Duration) -> Replica {
    let store = open_store(&s.fresh.url, &PostgresOptions::default())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        store,
        RetryPolicy::default(),
        Arc::new(s.clock.clone()),
        rx.clone(),
    )
    .with_stats_every(every);
    let mut stopped = rx;
    let task = tokio::spawn(settled::server::serve(listener, state, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    Replica { base, stop, task }
}

async fn replicas_of_one_database_sum_up(fresh: Fresh) {
    let s = spawn(fresh).await;
    let other = replica(&s, Duration::from_millis(100)).await;
    s.enqueue("a").await;
    s.enqueue("b").await;
    let created = s
        .client
        .post(format!("{}/v1/receipts", other.base))
        .json(&json!({"receipt_id": "c", "finalized_at": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    // The replica adds its counts on its own every 100 ms: poll, with a deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let minutes = series(&s, "?minutes=1").await;
        let enqueued = minutes[0]["enqueued"].as_u64().unwrap();
        assert!(enqueued <= 3, "{minutes:?}");
        if enqueued == 3 {
            assert_eq!(minutes[0]["depth"], 3);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never added its count"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    other.stop().await;
    s.stop().await;
}

async fn a_stopping_server_writes_what_it_counted(fresh: Fresh) {
    let s = spawn(fresh).await;
    // A server that would not add its counts for an hour.
    let other = replica(&s, Duration::from_secs(3600)).await;
    for id in ["a", "b", "c"] {
        let created = s
            .client
            .post(format!("{}/v1/receipts", other.base))
            .json(&json!({"receipt_id": id, "finalized_at": 100}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status().as_u16(), 201);
    }
    other.stop().await;
    // Read while `s` still owns the database: stopping it removes a SQLite database's
    // directory, and a pooled connection reopened after that fails.
    let minute = T0 - T0 % STATS_MINUTE_MS;
    let stored = s
        .fresh
        .store
        .stats(ms(minute), ms(minute + STATS_MINUTE_MS))
        .await
        .unwrap();
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].counts.enqueued, 3);
    assert_eq!(stored[0].depth, Some(3));
    s.stop().await;
}

async fn a_bad_minutes_parameter_is_refused(fresh: Fresh) {
    let s = spawn(fresh).await;
    for bad in [
        "minutes=0",
        "minutes=61",
        "minutes=-1",
        "minutes=abc",
        "minutes=",
    ] {
        let answer = s.get(&format!("/v1/stats?{bad}")).await;
        answer.assert_problem(422, "invalid_query", "validation");
    }
    assert_eq!(series(&s, "?minutes=1").await.len(), 1);
    assert_eq!(series(&s, "?minutes=60").await.len(), 60);
    s.stop().await;
}

crate::on_every_backend!(
    the_series_counts_a_scripted_scenario_minute_by_minute,
    replicas_of_one_database_sum_up,
    a_stopping_server_writes_what_it_counted,
    a_bad_minutes_parameter_is_refused,
);

#[tokio::test]
async fn readers_and_operators_may_read_the_series() {
    let roles = [
        ("producer", "producer-token-0123456789", 403),
        ("worker", "worker-token-0123456789", 403),
        ("reader", "reader-token-0123456789", 200),
        ("operator", "operator-token-0123456789", 200),
    ];
    let entries: Vec<String> = roles.iter().map(|(r, t, _)| format!("{r}:{t}")).collect();
    let s = spawn_with_tokens(fresh_sqlite().await, Tokens::parse(&entries).unwrap()).await;
    for (role, token, status) in roles {
        let response = s
            .client
            .request(Method::GET, format!("{}/v1/stats", s.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{role}");
    }
    let anonymous = s.get("/v1/stats").await;
    anonymous.assert_problem(401, "unauthorized", "auth");
    s.stop().await;
}
