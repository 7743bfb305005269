//! Receipt ids and the paths that carry them: odd but valid ids round-trip
//! through every route, invalid and oversized ones are refused everywhere,
//! and a path segment (or a body) that is not UTF-8 is refused.

use reqwest::Method;
use serde_json::{Value, json};

use super::{refused, snapshot, with_ref};
use crate::common::Fresh;
use crate::common::http::urlencode;
use crate::on_every_backend;

fn hostile_but_valid_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "a/b",
        "a%2Fb",
        "%2F",
        "%2e%2e",
        "x/../y",
        "../x",
        "x/..",
        "..x",
        "x..",
        "a..b",
        "...",
        ". ",
        " ..",
        "a?b=c&d",
        "a#frag",
        "a+b",
        "a b",
        "%",
        "%zz",
        "\\",
        "\\..\\x",
        "\"q\"",
        "<script>alert(1)</script>",
        "' OR '1'='1' --",
        "ünïcødé",
        "日本語",
        "😀",
        "\u{202e}gpj.exe",
        "\u{200b}",
        "e\u{301}",
        "\u{e9}",
        "\u{feff}bom",
        "\u{fffd}",
        "R-1",
        "r-1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    ids.push("a".repeat(512));
    ids.push("\u{e9}".repeat(256));
    ids.push("\u{1F600}".repeat(128));
    ids.push(format!("{}/", "a".repeat(511)));
    ids
}

fn invalid_ids() -> Vec<String> {
    vec![
        String::new(),
        ".".into(),
        "..".into(),
        "a".repeat(513),
        "\u{e9}".repeat(257),
        format!("{}\u{e9}", "a".repeat(511)),
        format!("{}/", "a".repeat(512)),
    ]
}

async fn hostile_receipt_ids_round_trip_and_oversized_ones_are_refused(fresh: Fresh) {
    let (s, _) = with_ref(fresh).await;
    let ids = hostile_but_valid_ids();
    for (i, id) in ids.iter().enumerate() {
        let finalized_at = 1000 + i as u64;
        let created = s
            .post(
                "/v1/receipts",
                json!({"receipt_id": id, "finalized_at": finalized_at}),
            )
            .await;
        let view = created.ok(201);
        assert_eq!(view["receipt_id"], id.as_str());
        let path = format!("/v1/receipts/{}", urlencode(id));
        let view = s.get(&path).await;
        let view = view.ok(200);
        assert_eq!(view["receipt_id"], id.as_str(), "GET {path}");
        assert_eq!(view["finalized_at"], finalized_at, "GET {path}");
        let claim = s
            .post(
                &format!("{path}/claim"),
                json!({"worker_id": "w", "lease_ms": 30_000}),
            )
            .await;
        let claim = claim.ok(200).clone();
        assert_eq!(claim["receipt_id"], id.as_str());
        let route = s
            .post(
                &format!("{path}/outcome"),
                json!({"claim": claim, "outcome": {"kind": "accepted", "transcript_id": id}}),
            )
            .await;
        assert_eq!(route.ok(200)["kind"], "no_action");
        let view = s.receipt(id).await;
        assert_eq!(view["state"], "settled");
        assert_eq!(view["transcript_id"], id.as_str());
    }
    // Lower-case percent escapes name the same receipt.
    assert_eq!(
        s.get("/v1/receipts/a%2fb").await.ok(200)["receipt_id"],
        "a/b"
    );
    // Enqueueing them all again changes nothing.
    let again: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| json!({"receipt_id": id, "finalized_at": 1000 + i as u64}))
        .collect();
    let batch = s
        .post("/v1/receipts/batch", json!({"receipts": again}))
        .await;
    for result in batch.ok(200)["results"].as_array().expect("results") {
        assert_eq!(result["status"], "existing", "{result}");
    }
    let counts = s.get("/v1/status").await.ok(200)["counts"].clone();
    assert_eq!(counts["settled"], ids.len() as u64);

    let before = snapshot(&s).await;
    for id in invalid_ids() {
        let what = format!("{} bytes {:?}", id.len(), id.get(..8));
        refused(
            &s.post("/v1/receipts", json!({"receipt_id": id, "finalized_at": 1}))
                .await,
            422,
            "invalid_receipt_id",
            &what,
        );
        let batch = s
            .post(
                "/v1/receipts/batch",
                json!({"receipts": [{"receipt_id": id, "finalized_at": 1}]}),
            )
            .await;
        let result = &batch.ok(200)["results"][0];
        assert_eq!(result["status"], "invalid", "{what}");
        assert_eq!(result["error"]["code"], "invalid_receipt_id", "{what}");
        if id.len() > 2 {
            let path = format!("/v1/receipts/{}", urlencode(&id));
            refused(&s.get(&path).await, 422, "invalid_receipt_id", &what);
            refused(
                &s.post(
                    &format!("{path}/claim"),
                    json!({"worker_id": "w", "lease_ms": 1000}),
                )
                .await,
                422,
                "invalid_receipt_id",
                &what,
            );
            refused(
                &s.get(&format!("/v1/dead-letters/{}", urlencode(&id))).await,
                422,
                "invalid_receipt_id",
                &what,
            );
            refused(
                &s.post(
                    &format!("/v1/dead-letters/{}/redrive", urlencode(&id)),
                    json!({}),
                )
                .await,
                422,
                "invalid_receipt_id",
                &what,
            );
        }
    }
    // A path segment that is not UTF-8, and a body that is not UTF-8.
    let answer = s.get("/v1/receipts/%FF%FE").await;
    assert_eq!(answer.status.as_u16(), 422, "{:?}", answer.body);
    assert_eq!(answer.body["class"], "validation");
    let mut body = br#"{"receipt_id":"x"#.to_vec();
    body.extend_from_slice(&[0xff, 0xfe]);
    body.extend_from_slice(br#"","finalized_at":1}"#);
    let answer = s
        .raw(Method::POST, "/v1/receipts", Some("application/json"), body)
        .await;
    refused(&answer, 400, "malformed_json", "non-UTF-8 body");
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");
    s.stop().await;
}

on_every_backend!(hostile_receipt_ids_round_trip_and_oversized_ones_are_refused);
