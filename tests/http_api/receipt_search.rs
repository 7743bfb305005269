//! `GET /v1/receipts`: filters, cursor paging, who may call it, and a clear
//! 422 for every bad query.

use serde_json::{Value, json};
use settled::http::middleware::auth::Tokens;

use crate::common::http::{T0, TestServer, spawn, spawn_with_tokens, urlencode};
use crate::common::{Fresh, fresh_sqlite};

/// Every receipt id of every page, following `next_cursor` from `query`.
async fn all_pages(s: &TestServer, query: &str) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut path = format!("/v1/receipts?{query}");
    for pages in 1..=100 {
        let page = s.get(&path).await.ok(200).clone();
        for r in page["receipts"].as_array().unwrap() {
            ids.push(r["receipt_id"].as_str().unwrap().to_owned());
        }
        match &page["next_cursor"] {
            Value::String(next) => path = format!("/v1/receipts?{query}&cursor={next}"),
            Value::Null => return (ids, pages),
            other => panic!("next_cursor must be a string or null, got {other}"),
        }
    }
    panic!("{query}: never reached the end");
}

async fn enqueue_at(s: &TestServer, id: &str, finalized_at: u64) {
    s.post(
        "/v1/receipts",
        json!({"receipt_id": id, "finalized_at": finalized_at}),
    )
    .await
    .ok(201);
}

async fn claim_one(s: &TestServer, id: &str, worker: &str) -> Value {
    s.post(
        &format!("/v1/receipts/{}/claim", urlencode(id)),
        json!({"worker_id": worker, "lease_ms": 30_000}),
    )
    .await
    .ok(200)
    .clone()
}

async fn filters_and_cursor_paging_over_http(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, at) in [("a-1", 1), ("a-2", 2), ("b-3", 3), ("a-4", 4), ("b-5", 5)] {
        enqueue_at(&s, id, at).await;
    }
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "later", "finalized_at": 6, "visible_at_ms": T0 + 60_000}),
    )
    .await
    .ok(201);
    let leased = claim_one(&s, "b-3", "worker-7").await;
    let failed = claim_one(&s, "a-4", "worker-8").await;
    s.outcome(
        &failed,
        json!({"kind": "permanent", "code": "invalid_action_hash", "detail": "x"}),
    )
    .await
    .ok(200);

    // Newest first by default, two per page.
    let (ids, pages) = all_pages(&s, "limit=2").await;
    assert_eq!(ids, ["later", "b-5", "a-4", "b-3", "a-2", "a-1"]);
    assert_eq!(pages, 3);
    let (ids, _) = all_pages(&s, "order=oldest&limit=4").await;
    assert_eq!(ids, ["a-1", "a-2", "b-3", "a-4", "b-5", "later"]);
    // `pending` includes the scheduled one; `scheduled` is only it.
    let (ids, _) = all_pages(&s, "state=pending&order=oldest").await;
    assert_eq!(ids, ["a-1", "a-2", "b-5", "later"]);
    let (ids, _) = all_pages(&s, "state=scheduled").await;
    assert_eq!(ids, ["later"]);
    let (ids, _) = all_pages(&s, "state=dead_lettered&code=invalid_action_hash").await;
    assert_eq!(ids, ["a-4"]);
    let (ids, _) = all_pages(&s, "prefix=a-&finalized_from=2&finalized_to=4").await;
    assert_eq!(ids, ["a-2"]);
    let (ids, _) = all_pages(&s, &format!("finished_from_ms={T0}")).await;
    assert_eq!(ids, ["a-4"]);
    // A prefix is not an id: `.` and `..` are prefixes like any other.
    for dots in [".", ".."] {
        let (ids, _) = all_pages(&s, &format!("prefix={dots}")).await;
        assert!(ids.is_empty(), "prefix {dots}: {ids:?}");
    }

    // A leased receipt shows its owner and deadline, never the token.
    let page = s.get("/v1/receipts?owner=worker-7").await.ok(200).clone();
    assert_eq!(page["next_cursor"], Value::Null);
    let found = &page["receipts"].as_array().unwrap()[..];
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["receipt_id"], "b-3");
    assert_eq!(found[0]["state"], "leased");
    assert_eq!(found[0]["lease"]["owner"], "worker-7");
    assert_eq!(found[0]["lease"]["until_ms"], leased["lease_until_ms"]);
    let token = leased["lease_token"].as_str().unwrap();
    let everything = s.get("/v1/receipts?limit=500").await.ok(200).to_string();
    assert!(!everything.contains(token));
    let dead = s
        .get("/v1/receipts?state=dead_lettered")
        .await
        .ok(200)
        .clone();
    assert_eq!(
        dead["receipts"][0]["last_failure"]["code"],
        "invalid_action_hash"
    );
    assert!(dead["receipts"][0]["finished_at_ms"].is_u64());
    s.stop().await;
}

async fn bad_queries_are_refused_with_a_clear_422(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c"] {
        s.enqueue(id).await;
    }
    let page = s
        .get("/v1/receipts?limit=1&state=pending")
        .await
        .ok(200)
        .clone();
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    for (query, code) in [
        ("colour=red", "invalid_query"),
        ("state=done", "invalid_query"),
        ("state=", "invalid_query"),
        ("code=oops", "invalid_query"),
        ("order=sideways", "invalid_query"),
        ("limit=0", "invalid_limit"),
        ("limit=501", "invalid_limit"),
        ("limit=ten", "invalid_query"),
        ("finalized_from=5&finalized_to=5", "invalid_query"),
        ("finalized_from=9&finalized_to=2", "invalid_query"),
        ("finished_from_ms=9&finished_to_ms=2", "invalid_query"),
        ("finalized_from=9223372036854775808", "invalid_query"),
        ("finalized_from=-1", "invalid_query"),
        ("prefix=", "invalid_receipt_id"),
        ("prefix=%01", "invalid_receipt_id"),
        // Not UTF-8 once decoded: refused, not read as U+FFFD.
        ("prefix=%FF", "invalid_query"),
        ("prefix=a%C3", "invalid_query"),
        ("owner=%C3%28", "invalid_query"),
        ("owner=", "worker_id_length"),
        ("owner=w%01", "invalid_worker_id"),
        ("cursor=garbage", "invalid_cursor"),
        ("state=pending&state=leased", "invalid_query"),
        // A cursor is bound to its filters and order.
        (&format!("cursor={cursor}") as &str, "invalid_cursor"),
        (
            &format!("state=pending&order=oldest&cursor={cursor}"),
            "invalid_cursor",
        ),
        (&format!("state=leased&cursor={cursor}"), "invalid_cursor"),
    ] {
        let answer = s.get(&format!("/v1/receipts?{query}")).await;
        answer.assert_problem(422, code, "validation");
        assert!(
            !answer.body["detail"].as_str().unwrap().is_empty(),
            "{query}"
        );
    }
    // The same cursor with the same filters goes on.
    let next = s
        .get(&format!(
            "/v1/receipts?limit=1&state=pending&cursor={cursor}"
        ))
        .await
        .ok(200)
        .clone();
    assert_eq!(next["receipts"][0]["receipt_id"], "b");
    s.stop().await;
}

crate::on_every_backend!(
    filters_and_cursor_paging_over_http,
    bad_queries_are_refused_with_a_clear_422,
);

/// Readers and operators may search; producers and workers may not.
#[tokio::test]
async fn readers_and_operators_may_search_producers_and_workers_may_not() {
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
            .get(format!("{}/v1/receipts?state=pending", s.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{role}");
    }
    let anonymous = s
        .client
        .get(format!("{}/v1/receipts", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    s.stop().await;
}
