//! Bodies: deep nesting, oversized observations and bodies, duplicate keys,
//! empty bodies, arrays and wrong content types.

use reqwest::Method;
use serde_json::{Value, json};

use super::{REF, post_raw, refused, refused_as_not_an_integer, snapshot, with_ref};
use crate::common::Fresh;
use crate::on_every_backend;

fn nested_object(depth: usize) -> String {
    let mut text = String::with_capacity(depth * 6 + 2);
    for _ in 0..depth {
        text.push_str(r#"{"a":"#);
    }
    text.push('1');
    for _ in 0..depth {
        text.push('}');
    }
    text
}

async fn deep_and_huge_bodies_are_refused_cleanly(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    // 10 000 levels: serde_json's recursion limit (128) refuses it while parsing.
    let deep = nested_object(10_000);
    let arrays = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    for (what, observation) in [("objects", &deep), ("arrays", &arrays)] {
        let body =
            format!(r#"{{"receipt_id":"deep","finalized_at":1,"observation":{observation}}}"#);
        let answer = post_raw(&s, "/v1/receipts", body).await;
        refused(&answer, 400, "malformed_json", what);
        let body = format!(
            r#"{{"receipts":[{{"receipt_id":"deep","finalized_at":1,"observation":{observation}}}]}}"#
        );
        // In a batch only that item is refused; the batch parses around it.
        let answer = post_raw(&s, "/v1/receipts/batch", body).await;
        let item = &answer.ok(200)["results"][0];
        assert_eq!(item["status"], "invalid", "{what}: {item}");
        assert_eq!(item["error"]["code"], "malformed_json", "{what}: {item}");
        assert_eq!(item["error"]["status"], 400, "{what}: {item}");
        let body = format!(
            r#"{{"claim":{claim},"outcome":{{"kind":"accepted","transcript_id":{observation}}}}}"#
        );
        let answer = post_raw(&s, &format!("/v1/receipts/{REF}/outcome"), body).await;
        refused(&answer, 400, "malformed_json", what);
        // As a whole body, the unknown field `a` may be refused first.
        let answer = post_raw(&s, "/v1/claims", observation.clone()).await;
        refused_as_not_an_integer(&answer, what);
    }
    // Over 64 KiB of observation: 422. Over 1 MiB of body: 413.
    let pad = |n: usize| json!({"p": "x".repeat(n)});
    let limit = 64 * 1024;
    let overhead = pad(0).to_string().len();
    refused(
        &s.post(
            "/v1/receipts",
            json!({"receipt_id": "big", "finalized_at": 1, "observation": pad(limit - overhead + 1)}),
        )
        .await,
        422,
        "observation_too_large",
        "65537-byte observation",
    );
    let batch = s
        .post(
            "/v1/receipts/batch",
            json!({"receipts": [{"receipt_id": "big", "finalized_at": 1, "observation": pad(limit)}]}),
        )
        .await;
    assert_eq!(
        batch.ok(200)["results"][0]["error"]["code"],
        "observation_too_large"
    );
    refused(
        &s.post(
            "/v1/receipts",
            json!({"receipt_id": "big", "finalized_at": 1, "observation": pad(1024 * 1024)}),
        )
        .await,
        413,
        "body_too_large",
        "1 MiB body",
    );
    // Duplicate keys, an empty body, a JSON array, wrong content types.
    refused(
        &post_raw(
            &s,
            "/v1/receipts",
            r#"{"receipt_id":"dup-a","receipt_id":"dup-b","finalized_at":1}"#.into(),
        )
        .await,
        422,
        "invalid_body",
        "duplicate key",
    );
    let answer = post_raw(&s, "/v1/receipts", String::new()).await;
    assert!(
        matches!(answer.status.as_u16(), 400 | 422) && answer.body["class"] == "validation",
        "empty body: {:?}",
        answer
    );
    refused(
        &post_raw(&s, "/v1/receipts", "[]".into()).await,
        422,
        "invalid_body",
        "array",
    );
    refused(
        &s.raw(
            Method::POST,
            "/v1/receipts",
            Some("text/plain"),
            br#"{"receipt_id":"ct","finalized_at":1}"#.to_vec(),
        )
        .await,
        415,
        "unsupported_media_type",
        "text/plain",
    );
    refused(
        &s.raw(
            Method::POST,
            "/v1/receipts",
            None,
            br#"{"receipt_id":"ct","finalized_at":1}"#.to_vec(),
        )
        .await,
        415,
        "unsupported_media_type",
        "no content type",
    );
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");

    // Exactly 64 KiB, and nesting well under the limit, are taken and kept.
    let exact = pad(limit - overhead);
    assert_eq!(exact.to_string().len(), limit);
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "exact", "finalized_at": 1, "observation": exact}),
    )
    .await
    .ok(201);
    assert_eq!(s.receipt("exact").await["observation"], exact);
    let nested: Value = serde_json::from_str(&nested_object(100)).expect("100 levels");
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "nested", "finalized_at": 1, "observation": nested}),
    )
    .await
    .ok(201);
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "nested", "finalized_at": 1, "observation": nested}),
    )
    .await
    .ok(200);
    assert_eq!(s.receipt("nested").await["observation"], nested);
    s.stop().await;
}

on_every_backend!(deep_and_huge_bodies_are_refused_cleanly);
