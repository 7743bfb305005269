//! A failure's rail code (`rail_code`, the rail's own word such as
//! `card_declined`) goes from the outcome to the receipt, its history, the
//! dead letters, the search and the feed; a malformed one is refused and
//! changes nothing.

use serde_json::{Value, json};

use crate::common::Fresh;
use crate::common::http::spawn;

fn permanent(rail_code: &str) -> Value {
    json!({"kind": "permanent", "code": "invalid_receipt_signature", "detail": "declined",
           "rail_code": rail_code})
}

async fn a_rail_code_round_trips_to_the_receipt_search_dead_letters_and_feed(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in ["one", "two", "three", "plain"] {
        s.enqueue(id).await;
    }
    let mut claims = s.claim("w", 4).await;
    claims.sort_by_key(|c| c["receipt_id"].as_str().unwrap().to_owned());
    let [one, plain, three, two] = <[Value; 4]>::try_from(claims).unwrap();
    // One by one, then a batch of several (each backend's other write path).
    let route = s.outcome(&one, permanent("card_declined")).await;
    assert_eq!(route.ok(200)["kind"], "dead_lettered");
    let retry = json!({"kind": "retryable", "code": "rpc", "rail_code": "issuer:timeout"});
    let batch = s
        .post(
            "/v1/outcomes",
            json!({"outcomes": [
                {"claim": two, "outcome": permanent("insufficient_funds")},
                {"claim": three, "outcome": retry},
                {"claim": plain, "outcome": {"kind": "permanent", "code": "invalid_receipt_signature"}},
            ]}),
        )
        .await;
    let results = batch.ok(200)["results"].as_array().unwrap().clone();
    assert!(
        results.iter().all(|r| r.get("error").is_none()),
        "{results:?}"
    );

    let view = s.receipt("one").await;
    assert_eq!(view["last_failure"]["rail_code"], "card_declined", "{view}");
    assert_eq!(view["last_failure"]["code"], "invalid_receipt_signature");
    assert_eq!(view["history"][0]["rail_code"], "card_declined");
    assert_eq!(
        view["dead_letter"]["last_failure"]["rail_code"],
        "card_declined"
    );
    let view = s.receipt("three").await;
    assert_eq!(view["state"], "retry_scheduled");
    assert_eq!(view["last_failure"]["rail_code"], "issuer:timeout");
    assert_eq!(view["history"][0]["rail_code"], "issuer:timeout");
    // Without one, none is shown.
    let view = s.receipt("plain").await;
    assert!(view["last_failure"].get("rail_code").is_none(), "{view}");
    assert!(view["history"][0].get("rail_code").is_none(), "{view}");

    let letter = s.get("/v1/dead-letters/two").await;
    assert_eq!(
        letter.ok(200)["last_failure"]["rail_code"],
        "insufficient_funds"
    );
    let letters = s.get("/v1/dead-letters").await;
    let letters = letters.ok(200)["dead_letters"].as_array().unwrap().clone();
    let shown: Vec<_> = letters
        .iter()
        .map(|l| {
            (
                l["receipt_id"].as_str().unwrap(),
                l["last_failure"]["rail_code"].as_str(),
            )
        })
        .collect();
    assert!(shown.contains(&("one", Some("card_declined"))), "{shown:?}");
    assert!(shown.contains(&("plain", None)), "{shown:?}");

    let found = s.get("/v1/receipts?rail_code=card_declined").await;
    let ids: Vec<_> = found.ok(200)["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["receipt_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["one"]);
    let found = s
        .get("/v1/receipts?state=dead_lettered&code=invalid_receipt_signature&rail_code=insufficient_funds")
        .await;
    assert_eq!(found.ok(200)["receipts"].as_array().unwrap().len(), 1);
    assert_eq!(found.ok(200)["receipts"][0]["receipt_id"], "two");
    assert_eq!(
        found.ok(200)["receipts"][0]["last_failure"]["rail_code"],
        "insufficient_funds"
    );

    let feed = s.get("/v1/history").await;
    let entries = feed.ok(200)["entries"].as_array().unwrap().clone();
    let rail = |id: &str| {
        entries
            .iter()
            .find(|e| e["receipt_id"] == id)
            .map(|e| e.get("rail_code").cloned())
    };
    assert_eq!(rail("one"), Some(Some(json!("card_declined"))));
    assert_eq!(rail("three"), Some(Some(json!("issuer:timeout"))));
    assert_eq!(rail("plain"), Some(None));

    // A later failure without a rail code replaces it; a success keeps the
    // last failure as it was.
    s.clock.set(
        s.receipt("three").await["next_visible_at_ms"]
            .as_u64()
            .unwrap(),
    );
    let again = s.claim("w", 1).await.remove(0);
    s.outcome(&again, json!({"kind": "retryable", "code": "rpc"}))
        .await
        .ok(200);
    let view = s.receipt("three").await;
    assert!(view["last_failure"].get("rail_code").is_none(), "{view}");
    assert_eq!(view["history"][0]["rail_code"], "issuer:timeout");
    s.stop().await;
}

async fn a_malformed_rail_code_is_refused_and_changes_nothing(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    let too_long = "x".repeat(65);
    for bad in ["", "card declined", "déclinée", "a/b", too_long.as_str()] {
        s.outcome(&claim, permanent(bad)).await.assert_problem(
            422,
            "invalid_rail_code",
            "validation",
        );
        let batch = s
            .post(
                "/v1/outcomes",
                json!({"outcomes": [{"claim": claim, "outcome": permanent(bad)}]}),
            )
            .await;
        assert_eq!(
            batch.ok(200)["results"][0]["error"]["code"],
            "invalid_rail_code"
        );
    }
    s.outcome(
        &claim,
        json!({"kind": "retryable", "code": "rpc", "rail_code": 7}),
    )
    .await
    .assert_problem(422, "invalid_body", "validation");
    // Not on outcomes that are not failures.
    s.outcome(
        &claim,
        json!({"kind": "accepted", "transcript_id": "t", "rail_code": "ok"}),
    )
    .await
    .assert_problem(422, "invalid_body", "validation");
    let view = s.receipt("r").await;
    assert_eq!(view["state"], "leased");
    assert_eq!(view["history"].as_array().unwrap().len(), 0);
    s.get("/v1/receipts?rail_code=a%20b").await.assert_problem(
        422,
        "invalid_rail_code",
        "validation",
    );
    s.stop().await;
}

crate::on_every_backend!(
    a_rail_code_round_trips_to_the_receipt_search_dead_letters_and_feed,
    a_malformed_rail_code_is_refused_and_changes_nothing
);
