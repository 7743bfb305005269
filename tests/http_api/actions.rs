//! Operators' actions over HTTP: hold, unhold, cancel, bulk, and the token
//! name recorded in history.

use serde_json::{Value, json};
use settled::http::middleware::auth::Tokens;

use crate::common::Fresh;
use crate::common::http::{TestServer, spawn, spawn_with_tokens};

const ALICE: &str = "alice-operator-token-0123";

async fn post_as(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let response = s
        .client
        .post(format!("{}{path}", s.base))
        .bearer_auth(ALICE)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn hold_unhold_and_cancel_one_receipt(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let held = s
        .post("/v1/receipts/r/hold", json!({"reason": "dispute #81"}))
        .await
        .ok(200)
        .clone();
    assert_eq!(held["state"], "pending");
    assert!(held["held_at_ms"].is_u64());
    assert_eq!(held["history"][0]["outcome"], "hold");
    assert_eq!(held["history"][0]["note"], "dispute #81");
    // No token name on an anonymous server.
    assert!(held["history"][0].get("actor").is_none());
    assert!(s.claim("w", 10).await.is_empty());
    // Counted as held, among its state's (pending) too, in /v1/status and /metrics.
    let counts = s.get("/v1/status").await.ok(200)["counts"].clone();
    assert_eq!(
        (counts["held"].clone(), counts["pending"].clone()),
        (json!(1), json!(1))
    );
    assert!(
        s.get_text("/metrics")
            .await
            .contains("settled_held_receipts 1"),
        "held in /metrics"
    );
    s.post(
        "/v1/receipts/r/claim",
        json!({"worker_id": "w", "lease_ms": 1000}),
    )
    .await
    .assert_problem(409, "receipt_held", "conflict");
    let unheld = s
        .post("/v1/receipts/r/unhold", json!({}))
        .await
        .ok(200)
        .clone();
    assert!(unheld.get("held_at_ms").is_none());
    assert_eq!(s.get("/v1/status").await.ok(200)["counts"]["held"], 0);

    s.post("/v1/receipts/r/cancel", json!({}))
        .await
        .assert_problem(422, "invalid_reason", "validation");
    s.post("/v1/receipts/r/cancel", json!({"reason": "a\u{7}b"}))
        .await
        .assert_problem(422, "invalid_reason", "validation");
    s.post("/v1/receipts/r/cancel", json!({"reason": "x".repeat(513)}))
        .await
        .assert_problem(422, "invalid_reason", "validation");
    assert_eq!(s.receipt("r").await["state"], "pending");
    let canceled = s
        .post("/v1/receipts/r/cancel", json!({"reason": "duplicate"}))
        .await
        .ok(200)
        .clone();
    assert_eq!(canceled["state"], "canceled");
    assert_eq!(canceled["cancel_reason"], "duplicate");
    s.post("/v1/receipts/r/cancel", json!({"reason": "again"}))
        .await
        .assert_problem(409, "receipt_finished", "conflict");
    s.post("/v1/receipts/r/hold", json!({}))
        .await
        .assert_problem(409, "receipt_not_active", "conflict");
    s.post("/v1/receipts/nope/hold", json!({}))
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    // Enqueueing it again answers the canceled receipt.
    let again = s
        .post(
            "/v1/receipts",
            json!({"receipt_id": "r", "finalized_at": 100}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(again["state"], "canceled");
    let status = s.get("/v1/status").await.ok(200).clone();
    assert_eq!(status["counts"]["canceled"], 1);
    s.stop().await;
}

async fn a_leased_receipt_cannot_be_canceled(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claims = s.claim("w", 1).await;
    assert_eq!(claims.len(), 1);
    s.post("/v1/receipts/r/cancel", json!({"reason": "stop"}))
        .await
        .assert_problem(409, "receipt_leased", "conflict");
    assert_eq!(s.receipt("r").await["state"], "leased");
    s.stop().await;
}

async fn bulk_actions_dry_run_then_act_item_by_item(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["a", "b", "c"] {
        s.enqueue(id).await;
    }
    let ids = json!(["a", "b", "missing"]);
    let dry = s
        .post(
            "/v1/bulk/hold",
            json!({"receipt_ids": ids, "dry_run": true}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (&dry["matched"], &dry["done"], &dry["refused"]),
        (&json!(3), &json!(2), &json!(1))
    );
    assert_eq!(dry["sample"], json!(["a", "b"]));
    assert_eq!(dry["results"][2]["error"]["code"], "receipt_not_found");
    assert!(
        s.receipt("a").await.get("held_at_ms").is_none(),
        "dry run changed nothing"
    );

    s.post(
        "/v1/bulk/hold",
        json!({"receipt_ids": ids, "expect_count": 2}),
    )
    .await
    .assert_problem(409, "count_mismatch", "conflict");
    assert!(s.receipt("a").await.get("held_at_ms").is_none());

    let done = s
        .post(
            "/v1/bulk/hold",
            json!({"receipt_ids": ids, "expect_count": 3}),
        )
        .await
        .ok(200)
        .clone();
    let statuses: Vec<_> = done["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["done", "done", "refused"]);
    assert!(done.get("sample").is_none());
    let claimed = s.claim("w", 10).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["receipt_id"], "c");

    // Again: already held, unchanged; a reason where none is taken is refused.
    let again = s
        .post("/v1/bulk/hold", json!({"receipt_ids": ["a"]}))
        .await
        .ok(200)
        .clone();
    assert_eq!(again["results"][0]["status"], "unchanged");
    s.post(
        "/v1/bulk/unhold",
        json!({"receipt_ids": ["a"], "reason": "x"}),
    )
    .await
    .assert_problem(422, "invalid_reason", "validation");
    s.post("/v1/bulk/cancel", json!({"receipt_ids": ["a"]}))
        .await
        .assert_problem(422, "invalid_reason", "validation");
    s.post("/v1/bulk/explode", json!({"receipt_ids": ["a"]}))
        .await
        .assert_problem(404, "not_found", "not_found");
    s.post("/v1/bulk/hold", json!({"receipt_ids": []}))
        .await
        .assert_problem(422, "batch_size", "validation");
    let too_many: Vec<String> = (0..1001).map(|i| format!("r{i}")).collect();
    s.post("/v1/bulk/hold", json!({"receipt_ids": too_many}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/bulk/hold", json!({"receipt_ids": ["a"], "extra": 1}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    let canceled = s
        .post(
            "/v1/bulk/cancel",
            json!({"receipt_ids": ["a", "b"], "reason": "merchant closed"}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(canceled["done"], 2);
    assert_eq!(s.receipt("b").await["state"], "canceled");
    let metrics = s.get_text("/metrics").await;
    assert!(
        metrics.contains(r#"settled_operator_actions_total{action="cancel",result="done"} 2"#),
        "{metrics}"
    );
    s.stop().await;
}

async fn bulk_actions_select_by_filter_with_the_count_reviewed(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, code) in [("d1", "rpc"), ("d2", "rpc"), ("d3", "signature")] {
        s.enqueue(id).await;
        let claim = s
            .post(
                &format!("/v1/receipts/{id}/claim"),
                json!({"worker_id": "w", "lease_ms": 1000}),
            )
            .await
            .ok(200)
            .clone();
        s.outcome(
            &claim,
            json!({"kind": "permanent", "code": code, "detail": "no"}),
        )
        .await
        .ok(200);
    }
    s.enqueue("alive").await;
    let filter = json!({"state": "dead_lettered", "code": "rpc"});
    let dry = s
        .post(
            "/v1/bulk/redrive",
            json!({"filter": filter, "dry_run": true}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (&dry["matched"], &dry["sample"]),
        (&json!(2), &json!(["d1", "d2"]))
    );
    // A filter without the count reviewed, or with another, changes nothing.
    s.post("/v1/bulk/redrive", json!({"filter": filter}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    s.post(
        "/v1/bulk/redrive",
        json!({"filter": filter, "expect_count": 1}),
    )
    .await
    .assert_problem(409, "count_mismatch", "conflict");
    s.post(
        "/v1/bulk/redrive",
        json!({"filter": filter, "receipt_ids": ["d1"], "expect_count": 1}),
    )
    .await
    .assert_problem(422, "invalid_body", "validation");
    s.post(
        "/v1/bulk/redrive",
        json!({"filter": {"state": "gone"}, "dry_run": true}),
    )
    .await
    .assert_problem(422, "invalid_body", "validation");
    assert_eq!(s.receipt("d1").await["state"], "dead_lettered");
    let done = s
        .post(
            "/v1/bulk/redrive",
            json!({"filter": filter, "expect_count": 2}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(done["done"], 2);
    assert_eq!(s.receipt("d1").await["state"], "pending");
    assert_eq!(s.receipt("d3").await["state"], "dead_lettered");
    // Held receipts can be found, and unheld in bulk by that filter.
    s.post("/v1/bulk/hold", json!({"receipt_ids": ["d1", "alive"]}))
        .await
        .ok(200);
    let held = s
        .get("/v1/receipts?held=true&order=oldest")
        .await
        .ok(200)
        .clone();
    let ids: Vec<_> = held["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["receipt_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{held}");
    assert!(held["receipts"][0]["held_at_ms"].is_u64());
    let unheld = s
        .post(
            "/v1/bulk/unhold",
            json!({"filter": {"held": true}, "expect_count": 2}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(unheld["done"], 2);
    s.stop().await;
}

/// Enqueue `n` receipts `{prefix}{i:05}` in batches of 1000.
async fn enqueue_many(s: &TestServer, prefix: &str, n: usize) {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}{i:05}")).collect();
    for part in ids.chunks(1000) {
        let items: Vec<Value> = part
            .iter()
            .map(|id| json!({"receipt_id": id, "finalized_at": 100}))
            .collect();
        let answer = s
            .post("/v1/receipts/batch", json!({"receipts": items}))
            .await;
        assert_eq!(answer.status.as_u16(), 200, "{:?}", answer.body);
    }
}

/// The documented maximum selection, 10 000 receipts held by one filter
/// action: answered 200 with every one held, complete.
async fn a_bulk_hold_by_filter_of_ten_thousand_finishes(fresh: Fresh) {
    let s = spawn(fresh).await;
    enqueue_many(&s, "big-", 10_000).await;
    let filter = json!({"prefix": "big-", "state": "pending"});
    let dry = s
        .post("/v1/bulk/hold", json!({"filter": filter, "dry_run": true}))
        .await
        .ok(200)
        .clone();
    assert_eq!(dry["matched"], 10_000);
    let started = std::time::Instant::now();
    let held = s
        .post(
            "/v1/bulk/hold",
            json!({"filter": filter, "expect_count": 10_000}),
        )
        .await
        .ok(200)
        .clone();
    println!(
        "bulk hold by filter of 10 000 receipts: {:?} (debug build)",
        started.elapsed()
    );
    assert_eq!(
        (&held["done"], &held["complete"]),
        (&json!(10_000), &json!(true))
    );
    assert!(
        held.get("remaining_receipt_ids").is_none(),
        "complete: {}",
        held["stopped"]
    );
    let still = s
        .get("/v1/receipts?prefix=big-&held=false&limit=1")
        .await
        .ok(200)
        .clone();
    assert_eq!(still["receipts"], json!([]), "every one held");
    s.stop().await;
}

crate::on_every_backend!(
    a_bulk_hold_by_filter_of_ten_thousand_finishes,
    bulk_actions_select_by_filter_with_the_count_reviewed,
    hold_unhold_and_cancel_one_receipt,
    a_leased_receipt_cannot_be_canceled,
    bulk_actions_dry_run_then_act_item_by_item,
);

#[tokio::test]
async fn a_named_token_is_recorded_in_history_never_the_token() {
    let tokens = Tokens::parse(&[format!("operator:alice:{ALICE}")]).unwrap();
    let s = spawn_with_tokens(crate::common::fresh_sqlite().await, tokens).await;
    let (status, _) = post_as(
        &s,
        "/v1/receipts",
        json!({"receipt_id": "r", "finalized_at": 1}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, held) = post_as(&s, "/v1/receipts/r/hold", json!({})).await;
    assert_eq!(status, 200);
    let entry = &held["history"][0];
    assert_eq!(
        (&entry["actor"], &entry["worker_id"]),
        (&json!("alice"), &json!("operator"))
    );
    assert!(!held.to_string().contains(ALICE));
    s.stop().await;
}

/// Each part of a bulk action is stamped with its own time, not the
/// request's: an entry committed for a receipt while the action was still
/// on earlier parts comes before the action's entry, in time as in commit
/// order. PostgreSQL only: a row lock held from outside pauses the action
/// between its parts (500 receipts each), which SQLite's one writer cannot
/// do without stopping every other write too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_actions_entries_keep_commit_order_with_each_receipts_history() {
    use std::time::Duration;
    let Some(fresh) = crate::common::fresh_postgres().await else {
        return;
    };
    let url = fresh.url.clone();
    let s = spawn(fresh).await;
    enqueue_many(&s, "o-", 1500).await;
    // o-01200 (third part) is leased: its worker will release it mid-action.
    let claim = s
        .post(
            "/v1/receipts/o-01200/claim",
            json!({"worker_id": "w", "lease_ms": 60_000}),
        )
        .await
        .ok(200)
        .clone();
    // Lock o-00700 (second part) from outside.
    let mut blocker = crate::common::pg_raw(&url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT 1 FROM receipts WHERE receipt_id = 'o-00700' FOR UPDATE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let bulk = {
        let (client, base) = (s.client.clone(), s.base.clone());
        tokio::spawn(async move {
            let response = client
                .post(format!("{base}/v1/bulk/hold"))
                .json(&json!({"filter": {"prefix": "o-"}, "expect_count": 1500}))
                .send()
                .await
                .unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        })
    };
    // Wait until the action's second part waits for the lock.
    let mut watcher = crate::common::pg_raw(&url).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the action never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_part = s.receipt("o-00000").await;
    let held_first = first_part["held_at_ms"]
        .as_u64()
        .expect("the first part is held");
    // Later, the worker releases o-01200; later still, the action goes on.
    s.clock.advance(1_000);
    s.call(
        reqwest::Method::DELETE,
        "/v1/receipts/o-01200/lease",
        Some(json!({"claim": claim})),
    )
    .await
    .ok(204);
    s.clock.advance(1_000);
    sqlx::query("COMMIT").execute(&mut blocker).await.unwrap();
    let (status, body) = bulk.await.unwrap();
    assert_eq!((status, &body["done"]), (200, &json!(1500)), "{body}");
    let late = s.receipt("o-01200").await;
    let history: Vec<(&str, u64)> = late["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["outcome"].as_str().unwrap(),
                h["observed_at_ms"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        history.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
        ["released", "hold"],
        "{late}"
    );
    assert!(
        history[0].1 < history[1].1,
        "the hold committed after the release is stamped after it: {history:?}"
    );
    assert_eq!(late["held_at_ms"].as_u64(), Some(history[1].1));
    assert!(
        history[1].1 > held_first,
        "the third part's own time, not the first part's"
    );
    s.stop().await;
}
