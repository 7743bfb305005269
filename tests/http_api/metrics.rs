//! `/metrics` after a scripted scenario: counters and gauges move as they should.

use std::collections::HashMap;

use serde_json::json;

use crate::common::Fresh;
use crate::common::http::{T0, spawn};

/// `name{labels}` → value, from the text exposition.
pub fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn metrics_follow_a_scripted_scenario(fresh: Fresh) {
    let s = spawn(fresh).await;
    let text = s
        .client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap();
    assert!(
        text.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let before = parse(&text.text().await.unwrap());
    assert_eq!(before["settled_claims_total"], 0.0);
    for id in ["a", "b", "c", "d"] {
        s.enqueue(id).await;
    }
    let claims = s.claim("w", 3).await;
    s.outcome(
        &claims[0],
        json!({"kind": "accepted", "transcript_id": "t"}),
    )
    .await
    .ok(200);
    s.outcome(
        &claims[1],
        json!({"kind": "retryable", "code": "rpc", "detail": ""}),
    )
    .await
    .ok(200);
    s.outcome(
        &claims[2],
        json!({"kind": "permanent", "code": "signature", "detail": ""}),
    )
    .await
    .ok(200);
    s.outcome(
        &claims[0],
        json!({"kind": "accepted", "transcript_id": "t"}),
    )
    .await
    .assert_problem(409, "receipt_finished", "conflict");
    // `d` is leased, its lease expires, and it is claimed again.
    let d = s.claim("w", 1).await;
    assert_eq!(d[0]["receipt_id"], "d");
    s.clock.set(T0 + 30_000);
    assert_eq!(
        s.claim("w2", 5).await.len(),
        2,
        "d again, and b whose backoff has passed"
    );
    let m = parse(&s.get_text("/metrics").await);
    assert_eq!(m["settled_claims_total"], 6.0);
    assert_eq!(
        m[r#"settled_outcomes_total{route="no_action",kind="accepted",code=""}"#],
        1.0
    );
    assert_eq!(
        m[r#"settled_outcomes_total{route="retry_scheduled",kind="retryable",code="rpc"}"#],
        1.0
    );
    assert_eq!(
        m[r#"settled_outcomes_total{route="dead_lettered",kind="permanent",code="signature"}"#],
        1.0
    );
    assert_eq!(m[r#"settled_claim_requests_total{result="leased"}"#], 3.0);
    assert_eq!(
        m[r#"settled_time_in_queue_seconds_count{group="default"}"#],
        6.0
    );
    assert_eq!(m["settled_conflicts_total"], 1.0);
    assert_eq!(m["settled_lease_expiries_total"], 1.0);
    assert_eq!(m[r#"settled_receipts{state="leased"}"#], 2.0);
    assert_eq!(m[r#"settled_receipts{state="settled"}"#], 1.0);
    assert_eq!(m[r#"settled_receipts{state="dead_lettered"}"#], 1.0);
    assert_eq!(m[r#"settled_receipts{state="pending"}"#], 0.0);
    assert_eq!(m["settled_scheduled_receipts"], 0.0);
    assert_eq!(m["settled_dead_letters"], 1.0);
    assert_eq!(m["settled_oldest_due_age_seconds"], 0.0);
    assert_eq!(
        m[r#"settled_http_requests_total{method="POST",route="/v1/claims",status="200"}"#],
        3.0
    );
    assert_eq!(
        m[r#"settled_http_requests_total{method="POST",route="/v1/receipts/{id}/outcome",status="409"}"#],
        1.0
    );
    assert_eq!(
        m[r#"settled_http_request_duration_seconds_count{method="POST",route="/v1/receipts"}"#],
        4.0
    );
    // The oldest due receipt ages with the clock.
    s.enqueue("e").await;
    s.clock.advance(2_500);
    let m = parse(&s.get_text("/metrics").await);
    assert_eq!(m["settled_oldest_due_age_seconds"], 2.5);
    // A receipt due in about an hour is pending and scheduled, and not yet due.
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "f", "finalized_at": 1, "visible_at_ms": T0 + 3_700_000}),
    )
    .await
    .ok(201);
    let m = parse(&s.get_text("/metrics").await);
    assert_eq!(m["settled_scheduled_receipts"], 1.0);
    assert_eq!(m[r#"settled_receipts{state="pending"}"#], 2.0);
    assert_eq!(m["settled_oldest_due_age_seconds"], 2.5);
    s.stop().await;
}

async fn requests_carry_a_request_id(fresh: Fresh) {
    let s = spawn(fresh).await;
    let own = s
        .client
        .get(format!("{}/healthz", s.base))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(own.headers()["x-request-id"], "abc-123");
    let made = s
        .client
        .get(format!("{}/healthz", s.base))
        .send()
        .await
        .unwrap();
    let id = made.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 24);
    let hostile = s
        .client
        .get(format!("{}/healthz", s.base))
        .header("x-request-id", "a b\tc")
        .send()
        .await
        .unwrap();
    assert_ne!(hostile.headers()["x-request-id"], "a b\tc");
    s.stop().await;
}

/// Made-up methods and paths fold into one label value each, so a client
/// cannot grow `/metrics` by inventing them.
async fn made_up_methods_and_paths_do_not_grow_the_metrics(fresh: Fresh) {
    let s = spawn(fresh).await;
    let send = |method: String, path: String| {
        let request = s.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", s.base),
        );
        async move { request.send().await.unwrap().status().as_u16() }
    };
    // One of each first, so that every label value that can appear exists.
    send("BREW".into(), "/v1/receipts".into()).await;
    send("BREW".into(), "/no/such/path".into()).await;
    send("GET".into(), "/no/such/path".into()).await;
    let before = s.get_text("/metrics").await;
    for i in 0..200 {
        send(format!("M{i}X"), "/v1/receipts".into()).await;
        send(format!("Q{i}"), format!("/made-up/{i}")).await;
        send("GET".into(), format!("/made-up/{i}")).await;
    }
    let after = s.get_text("/metrics").await;
    let series = |text: &str| {
        parse(text)
            .into_keys()
            .collect::<std::collections::BTreeSet<_>>()
    };
    let new: Vec<String> = series(&after)
        .difference(&series(&before))
        .cloned()
        .collect();
    // `/metrics` itself is the only new series (it was not yet called before).
    assert!(
        new.iter().all(|k| k.contains(r#"route="/metrics""#)),
        "new series: {new:?}"
    );
    assert!(
        !after.contains("M1X") && !after.contains("made-up"),
        "{after}"
    );
    let others: f64 = parse(&after)
        .iter()
        .filter(|(k, _)| k.starts_with(r#"settled_http_requests_total{method="other""#))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(others, 402.0, "every made-up method is counted as `other`");
    s.stop().await;
}

/// The wait histograms measure this run's waits on the server clock, and
/// the outcome counter agrees with the receipts' history.
async fn queue_times_and_outcome_counts_follow_the_run(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, group) in [("q1", "rail-a"), ("q2", "rail-b"), ("q3", "rail-a")] {
        s.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": 1, "group": group}),
        )
        .await
        .ok(201);
    }
    s.clock.advance(2_500);
    let claims = s.claim("w", 3).await;
    assert_eq!(claims.len(), 3);
    s.clock.advance(1_000);
    let by_id = |id: &str| claims.iter().find(|c| c["receipt_id"] == id).unwrap();
    s.outcome(
        by_id("q1"),
        json!({"kind": "accepted", "transcript_id": "t"}),
    )
    .await
    .ok(200);
    s.clock.advance(500);
    let batch = json!({"outcomes": [
        {"claim": by_id("q2"), "outcome": {"kind": "retryable", "code": "rpc", "detail": "x"}},
        {"claim": by_id("q1"), "outcome": {"kind": "skipped", "reason": "denied"}},
    ]});
    let results = s.post("/v1/outcomes", batch).await.ok(200).clone();
    assert!(results["results"][1]["error"].is_object(), "q1 is finished");
    // q3's lease is extended one by one and in a batch; claimed by id it is refused.
    let q3 = by_id("q3").clone();
    let extended = s
        .post(
            "/v1/receipts/q3/lease",
            json!({"claim": q3, "extend_ms": 60_000}),
        )
        .await
        .ok(200)
        .clone();
    s.post(
        "/v1/leases/extend",
        json!({"leases": [{"claim": extended, "extend_ms": 60_000}]}),
    )
    .await
    .ok(200);
    s.post(
        "/v1/receipts/q3/claim",
        json!({"worker_id": "w2", "lease_ms": 1_000}),
    )
    .await
    .assert_problem(409, "receipt_leased", "conflict");
    assert!(s.claim("w", 5).await.is_empty());

    let m = parse(&s.get_text("/metrics").await);
    for group in ["rail-a", "rail-b"] {
        let per =
            |what: &str| m[&format!(r#"settled_time_in_queue_seconds_{what}{{group="{group}"}}"#)];
        let claimed = if group == "rail-a" { 2.0 } else { 1.0 };
        assert_eq!(per("count"), claimed, "{group}");
        assert_eq!(
            per("sum"),
            2.5 * claimed,
            "{group}: due at T0, claimed at +2.5 s"
        );
    }
    assert_eq!(
        m[r#"settled_claim_to_outcome_seconds_sum{route="no_action"}"#],
        1.0
    );
    assert_eq!(
        m[r#"settled_claim_to_outcome_seconds_sum{route="retry_scheduled"}"#],
        1.5
    );
    assert_eq!(
        m[r#"settled_claim_to_outcome_seconds_bucket{le="1.0",route="no_action"}"#],
        1.0
    );
    assert_eq!(m["settled_lease_extensions_total"], 2.0);
    assert_eq!(m[r#"settled_claim_requests_total{result="leased"}"#], 1.0);
    assert_eq!(m[r#"settled_claim_requests_total{result="empty"}"#], 1.0);
    assert_eq!(m[r#"settled_claim_requests_total{result="refused"}"#], 1.0);
    // Outcomes by route, kind and code: exactly the receipts' history.
    let mut history: HashMap<String, f64> = HashMap::new();
    for id in ["q1", "q2", "q3"] {
        for entry in s.receipt(id).await["history"].as_array().unwrap() {
            let code = entry["code"]
                .as_str()
                .or(entry["reason"].as_str())
                .unwrap_or("");
            let key = format!(
                r#"settled_outcomes_total{{route="{}",kind="{}",code="{code}"}}"#,
                entry["route"].as_str().unwrap(),
                entry["outcome"].as_str().unwrap(),
            );
            *history.entry(key).or_default() += 1.0;
        }
    }
    let counted: HashMap<String, f64> = m
        .iter()
        .filter(|(k, _)| k.starts_with("settled_outcomes_total{"))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(counted, history);
    assert_eq!(history.len(), 2, "{history:?}");
    s.stop().await;
}

crate::on_every_backend!(
    metrics_follow_a_scripted_scenario,
    queue_times_and_outcome_counts_follow_the_run,
    requests_carry_a_request_id,
    made_up_methods_and_paths_do_not_grow_the_metrics
);
