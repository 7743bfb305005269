//! Groups over HTTP (docs/groups.md): named at enqueue, shown and filtered,
//! claims shared out and narrowed, limits set by operators and honoured.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::Fresh;
use crate::common::http::{Answer, T0, TestServer, spawn};

async fn enqueue_in(s: &TestServer, id: &str, group: &str, visible: u64) {
    let body =
        json!({"receipt_id": id, "finalized_at": 7, "visible_at_ms": visible, "group": group});
    s.post("/v1/receipts", body).await.ok(201);
}

async fn claim_body(s: &TestServer, body: Value) -> Value {
    s.post("/v1/claims", body).await.ok(200).clone()
}

fn groups_of(answer: &Value) -> Vec<String> {
    answer["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["group"].as_str().unwrap().to_owned())
        .collect()
}

async fn groups_are_named_at_enqueue_shown_and_shared_out(fresh: Fresh) {
    let s = spawn(fresh).await;
    for i in 0..6 {
        enqueue_in(&s, &format!("big-{i}"), "merchant:big", T0 - 100 + i).await;
    }
    enqueue_in(&s, "small-0", "merchant:small", T0 - 1).await;
    s.enqueue("plain").await;
    // The same id in another group is another receipt: refused, nothing changes.
    let moved = json!({"receipt_id": "small-0", "finalized_at": 7, "visible_at_ms": T0 - 1, "group": "merchant:big"});
    s.post("/v1/receipts", moved)
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    for bad in [
        json!(""),
        json!("g".repeat(129)),
        json!("a\nb"),
        json!(".."),
        json!(7),
    ] {
        let body = json!({"receipt_id": "bad", "finalized_at": 7, "group": bad});
        let answer = s.post("/v1/receipts", body).await;
        let code = if bad.is_string() {
            "invalid_group"
        } else {
            "invalid_body"
        };
        answer.assert_problem(422, code, "validation");
    }
    let batch = json!({"receipts": [
        {"receipt_id": "ok-1", "finalized_at": 7, "group": "rail:ach"},
        {"receipt_id": "bad-1", "finalized_at": 7, "group": ""},
    ]});
    let results = s.post("/v1/receipts/batch", batch).await.ok(200).clone();
    assert_eq!(results["results"][1]["error"]["code"], "invalid_group");
    s.get("/v1/receipts/bad")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.get("/v1/receipts/bad-1")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    assert_eq!(s.receipt("small-0").await["group"], "merchant:small");
    assert_eq!(s.receipt("plain").await["group"], "default");

    // Round robin: three of the four groups, in turn from the first by name
    // (the fourth's turn comes next), each group's oldest first, the claims
    // oldest due first.
    let first = claim_body(
        &s,
        json!({"worker_id": "w", "lease_ms": 30_000, "limit": 3}),
    )
    .await;
    assert_eq!(
        groups_of(&first),
        ["merchant:big", "merchant:small", "default"]
    );
    let next = claim_body(
        &s,
        json!({"worker_id": "w", "lease_ms": 30_000, "limit": 1}),
    )
    .await;
    assert_eq!(groups_of(&next), ["rail:ach"], "the fourth group's turn");
    let only =
        json!({"worker_id": "w", "lease_ms": 30_000, "limit": 10, "groups": ["merchant:small"]});
    assert_eq!(
        groups_of(&claim_body(&s, only).await),
        Vec::<String>::new(),
        "its one receipt is leased"
    );
    let found = s
        .get("/v1/receipts?group=merchant%3Abig&state=pending")
        .await;
    assert_eq!(found.ok(200)["receipts"].as_array().unwrap().len(), 5);
    assert_eq!(found.body["receipts"][0]["group"], "merchant:big");
    for bad in [json!([]), json!([""]), json!(vec!["g"; 101])] {
        let body = json!({"worker_id": "w", "lease_ms": 1, "limit": 1, "groups": bad});
        s.post("/v1/claims", body)
            .await
            .assert_problem(422, "invalid_group", "validation");
    }
    s.get("/v1/receipts?group=")
        .await
        .assert_problem(422, "invalid_group", "validation");
    s.stop().await;
}

async fn put_limits(s: &TestServer, group: &str, body: Value) -> Answer {
    s.call(Method::PUT, &format!("/v1/groups/{group}"), Some(body))
        .await
}

async fn operators_set_limits_that_claims_honour(fresh: Fresh) {
    let s = spawn(fresh).await;
    let put = |g: &'static str, body: Value| put_limits(&s, g, body);
    for i in 0..5 {
        enqueue_in(&s, &format!("a-{i}"), "rail:ach", T0 - 10 + i).await;
    }
    for (bad, code) in [
        (
            json!({"max_leased": 1_000_000_001_u64}),
            "invalid_group_limits",
        ),
        (
            json!({"rate": {"per_second": 0, "burst": 1}}),
            "invalid_group_limits",
        ),
        (
            json!({"rate": {"per_second": 1, "burst": 0}}),
            "invalid_group_limits",
        ),
        // Slower than one a day: a worker would be told to wait for longer.
        (
            json!({"rate": {"per_second": 0.00001, "burst": 1}}),
            "invalid_group_limits",
        ),
        (json!({"rate": {"per_second": 1}}), "invalid_body"),
        (json!({"paused": "yes"}), "invalid_body"),
        (json!({"max": 1}), "invalid_body"),
    ] {
        put("rail:ach", bad)
            .await
            .assert_problem(422, code, "validation");
    }
    let listed = s.get("/v1/groups").await.ok(200).clone();
    assert_eq!(
        listed["groups"][1]["max_leased"],
        Value::Null,
        "nothing was set"
    );
    put("a%0Ab", json!({}))
        .await
        .assert_problem(422, "invalid_group", "validation");
    s.get("/v1/groups/nobody")
        .await
        .assert_problem(404, "group_not_found", "not_found");

    // Paused: nothing is claimed, by batch or by id; resuming needs no redrive.
    let paused = put("rail:ach", json!({"paused": true}))
        .await
        .ok(200)
        .clone();
    assert_eq!(
        (paused["paused"].clone(), paused["depth"].clone()),
        (json!(true), json!(5))
    );
    assert!(s.claim("w", 10).await.is_empty());
    let by_id = json!({"worker_id": "w", "lease_ms": 1000});
    s.post("/v1/receipts/a-0/claim", by_id.clone())
        .await
        .assert_problem(409, "group_paused", "conflict");
    assert_eq!(s.receipt("a-0").await["next_visible_at_ms"], T0 - 10);

    // A cap: live leases never pass it; by id the group is at its limit.
    put("rail:ach", json!({"max_leased": 2})).await.ok(200);
    assert_eq!(s.claim("w", 10).await.len(), 2);
    s.post("/v1/receipts/a-4/claim", by_id)
        .await
        .assert_problem(409, "group_at_limit", "conflict");
    let group = s.get("/v1/groups/rail%3Aach").await.ok(200).clone();
    assert_eq!(
        (group["leased"].clone(), group["depth"].clone()),
        (json!(2), json!(5))
    );
    assert_eq!(group["oldest_due_age_ms"], 8, "a-2 has waited since T0 - 8");
    // At a glance: /v1/status and /metrics show each group's leases and wait.
    let status = s.get("/v1/status").await.ok(200).clone();
    let ach = status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == "rail:ach")
        .expect("rail:ach in /v1/status")
        .clone();
    assert_eq!(
        (ach["leased"].clone(), ach["oldest_due_age_ms"].clone()),
        (json!(2), json!(8))
    );
    assert!(
        ach.get("depth").is_none(),
        "depth only at /v1/groups: {ach}"
    );
    let metrics = s.get_text("/metrics").await;
    assert!(
        metrics.contains("settled_group_leased{group=\"rail:ach\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("settled_group_oldest_due_age_seconds{group=\"rail:ach\"} 0.008"));
    assert!(metrics.contains("settled_group_paused{group=\"rail:ach\"} 0"));

    // A rate: the burst at once, then one per token, and when to look again.
    put("rail:ach", json!({"rate": {"per_second": 10, "burst": 1}}))
        .await
        .ok(200);
    let first = claim_body(
        &s,
        json!({"worker_id": "w", "lease_ms": 30_000, "limit": 3}),
    )
    .await;
    assert_eq!(groups_of(&first).len(), 1);
    assert_eq!(first["look_again_ms"], 100);
    let held = claim_body(
        &s,
        json!({"worker_id": "w", "lease_ms": 30_000, "limit": 3}),
    )
    .await;
    assert_eq!(
        (groups_of(&held).len(), held["look_again_ms"].clone()),
        (0, json!(100))
    );
    // A long poll waits for the token (the test's clock moves it there).
    let poll = tokio::spawn({
        let (base, client) = (s.base.clone(), s.client.clone());
        async move {
            let started = Instant::now();
            let body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": 3, "wait_ms": 10_000});
            let answer: Value = client
                .post(format!("{base}/v1/claims"))
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (answer, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.clock.advance(100);
    let (answer, waited) = poll.await.unwrap();
    assert_eq!(groups_of(&answer).len(), 1, "{answer}");
    assert!(
        waited < Duration::from_secs(5),
        "woke for the token: {waited:?}"
    );
    s.stop().await;
}

async fn priorities_are_given_at_enqueue_shown_filtered_and_claimed_first(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, priority, visible) in [
        ("low", -5, T0 - 300),
        ("plain", 0, T0 - 200),
        ("top", 1000, T0 - 100),
    ] {
        let body = json!({"receipt_id": id, "finalized_at": 7, "visible_at_ms": visible, "priority": priority});
        s.post("/v1/receipts", body).await.ok(201);
    }
    s.enqueue("unranked").await;
    assert_eq!(s.receipt("top").await["priority"], 1000);
    assert_eq!(s.receipt("unranked").await["priority"], 0);
    // Another priority is another receipt.
    let again =
        json!({"receipt_id": "top", "finalized_at": 7, "visible_at_ms": T0 - 100, "priority": 999});
    s.post("/v1/receipts", again)
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    for bad in [json!(1001), json!(-1001), json!(i64::MAX)] {
        let body = json!({"receipt_id": "bad", "finalized_at": 7, "priority": bad});
        s.post("/v1/receipts", body)
            .await
            .assert_problem(422, "invalid_priority", "validation");
    }
    for bad in [json!(1.5), json!("1"), json!(u64::MAX)] {
        let body = json!({"receipt_id": "bad", "finalized_at": 7, "priority": bad});
        s.post("/v1/receipts", body)
            .await
            .assert_problem(422, "invalid_body", "validation");
    }
    s.get("/v1/receipts/bad")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    let found = s.get("/v1/receipts?priority=-5").await.ok(200).clone();
    let ids: Vec<&str> = found["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["receipt_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["low"]);
    assert_eq!(found["receipts"][0]["priority"], -5);
    for bad in ["priority=1001", "priority=x"] {
        let code = if bad.ends_with('x') {
            "invalid_query"
        } else {
            "invalid_priority"
        };
        s.get(&format!("/v1/receipts?{bad}"))
            .await
            .assert_problem(422, code, "validation");
    }
    // Highest first, then oldest due; the claim shows the priority and is
    // taken back with it.
    let claims = s.claim("w", 3).await;
    let order: Vec<(&str, i64)> = claims
        .iter()
        .map(|c| {
            (
                c["receipt_id"].as_str().unwrap(),
                c["priority"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(order, [("top", 1000), ("plain", 0), ("unranked", 0)]);
    s.outcome(
        &claims[0],
        json!({"kind": "accepted", "transcript_id": "t-1"}),
    )
    .await
    .ok(200);
    s.stop().await;
}

/// The slowest rate is one claim a day, and no answer tells a worker to
/// wait longer than that.
async fn the_slowest_rate_says_to_look_again_within_a_day(fresh: Fresh) {
    let s = spawn(fresh).await;
    for i in 0..2 {
        enqueue_in(&s, &format!("d-{i}"), "rail:daily", T0 - 10 + i).await;
    }
    put_limits(
        &s,
        "rail:daily",
        json!({"rate": {"per_second": 1.0 / 86_400.0, "burst": 1}}),
    )
    .await
    .ok(200);
    let body = json!({"worker_id": "w", "lease_ms": 30_000, "limit": 2, "groups": ["rail:daily"]});
    let first = claim_body(&s, body.clone()).await;
    assert_eq!(groups_of(&first).len(), 1, "{first}");
    assert_eq!(first["look_again_ms"], 86_400_000, "{first}");
    let second = claim_body(&s, body).await;
    assert_eq!(groups_of(&second).len(), 0, "{second}");
    assert_eq!(second["look_again_ms"], 86_400_000, "{second}");
    s.stop().await;
}

crate::on_every_backend!(
    the_slowest_rate_says_to_look_again_within_a_day,
    groups_are_named_at_enqueue_shown_and_shared_out,
    priorities_are_given_at_enqueue_shown_filtered_and_claimed_first,
    operators_set_limits_that_claims_honour,
);
