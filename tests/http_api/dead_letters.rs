use serde_json::json;

use crate::common::Fresh;
use crate::common::http::{TestServer, spawn};

async fn dead_letter(s: &TestServer, id: &str, finalized_at: u64) {
    s.post(
        "/v1/receipts",
        json!({"receipt_id": id, "finalized_at": finalized_at}),
    )
    .await
    .ok(201);
    let claim = s
        .post(
            &format!("/v1/receipts/{id}/claim"),
            json!({"worker_id": "w", "lease_ms": 1000}),
        )
        .await
        .ok(200)
        .clone();
    let route = s
        .outcome(
            &claim,
            json!({"kind": "permanent", "code": "invalid_action_hash", "detail": "x"}),
        )
        .await;
    assert_eq!(route.ok(200)["kind"], "dead_lettered");
}

async fn dead_letters_page_in_finalized_then_id_order(fresh: Fresh) {
    let s = spawn(fresh).await;
    for (id, at) in [("d", 1), ("c", 2), ("b", 2), ("a", 3), ("e", 1)] {
        dead_letter(&s, id, at).await;
    }
    s.enqueue("alive").await;
    let mut seen = Vec::new();
    let mut path = "/v1/dead-letters?limit=2".to_owned();
    let mut pages = 0;
    loop {
        let page = s.get(&path).await.ok(200).clone();
        pages += 1;
        for letter in page["dead_letters"].as_array().unwrap() {
            seen.push(letter["receipt_id"].as_str().unwrap().to_owned());
            assert_eq!(letter["attempts"], 1);
            assert_eq!(letter["code"], "invalid_action_hash");
            assert_eq!(letter["detail_sha256"].as_str().unwrap().len(), 64);
            assert!(letter["dead_lettered_at_ms"].is_u64());
            // The shape of GET /v1/receipts, beside the older fields.
            assert_eq!(letter["last_failure"]["code"], letter["code"]);
            assert_eq!(
                letter["last_failure"]["detail_sha256"],
                letter["detail_sha256"]
            );
        }
        // `next_cursor` as GET /v1/receipts names it, `next` under its older name.
        assert_eq!(
            page["next_cursor"].as_str(),
            page.get("next").and_then(|n| n.as_str())
        );
        match page["next_cursor"].as_str() {
            // Both parameter names page on: `cursor` on odd pages, `after` on even.
            Some(next) if pages % 2 == 1 => {
                path = format!("/v1/dead-letters?limit=2&cursor={next}");
            }
            Some(next) => path = format!("/v1/dead-letters?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["d", "e", "b", "c", "a"]);
    assert_eq!(pages, 3);
    let all = s.get("/v1/dead-letters").await.ok(200).clone();
    assert_eq!(all["dead_letters"].as_array().unwrap().len(), 5);
    assert!(all.get("next").is_none());
    assert!(all["next_cursor"].is_null());
    let first = s.get("/v1/dead-letters?limit=1").await.ok(200).clone();
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    s.get(&format!("/v1/dead-letters?cursor={cursor}&after={cursor}"))
        .await
        .ok(200);
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "after=nonsense",
        "after=1.zz",
        "cursor=1.zz",
        "cursor=1.61&after=2.61",
    ] {
        let answer = s.get(&format!("/v1/dead-letters?{bad}")).await;
        assert_eq!(answer.status.as_u16(), 422, "{bad}");
        assert_eq!(answer.body["class"], "validation");
    }
    s.stop().await;
}

async fn a_dead_letter_is_inspected_and_redriven(fresh: Fresh) {
    let s = spawn(fresh).await;
    dead_letter(&s, "r", 5).await;
    let letter = s.get("/v1/dead-letters/r").await.ok(200).clone();
    assert_eq!(letter["receipt_id"], "r");
    assert_eq!(letter["finalized_at"], 5);
    assert_eq!(letter["attempts"], 1);
    let view = s.post("/v1/dead-letters/r/redrive", json!(null)).await;
    let view = view.ok(200).clone();
    assert_eq!(view["state"], "pending");
    assert_eq!(view["attempts"], 0);
    let history = view["history"].as_array().unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[1]["outcome"], "redrive");
    assert_eq!(history[1]["worker_id"], "operator");
    assert_eq!(history[1]["attempt"], 1);
    assert!(history[1].get("route").is_none());
    s.get("/v1/dead-letters/r")
        .await
        .assert_problem(404, "dead_letter_not_found", "not_found");
    s.post("/v1/dead-letters/r/redrive", json!(null))
        .await
        .assert_problem(404, "dead_letter_not_found", "not_found");
    s.post("/v1/dead-letters/nope/redrive", json!(null))
        .await
        .assert_problem(404, "dead_letter_not_found", "not_found");
    let claim = s.claim("w", 1).await.remove(0);
    assert_eq!(claim["attempts"], 0);
    s.outcome(&claim, json!({"kind": "accepted", "transcript_id": "t"}))
        .await
        .ok(200);
    assert_eq!(s.receipt("r").await["state"], "settled");
    s.stop().await;
}

crate::on_every_backend!(
    dead_letters_page_in_finalized_then_id_order,
    a_dead_letter_is_inspected_and_redriven
);
