//! Control characters (C0, DEL and C1) in every string field: refused in
//! ids, worker ids, transcript ids, lease tokens and query strings; kept
//! exactly in free text (observations, failure details).

use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{REF, post_raw, refused, snapshot, with_ref};
use crate::common::Fresh;
use crate::common::http::urlencode;
use crate::on_every_backend;

/// Control characters: C0, DEL and C1.
const CONTROLS: [char; 9] = [
    '\0', '\u{1}', '\t', '\n', '\r', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}',
];

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

async fn control_characters_are_refused_in_ids_and_kept_in_free_text(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let mut lease_token_answers: std::collections::BTreeMap<String, usize> =
        std::collections::BTreeMap::new();
    for c in CONTROLS {
        let what = format!("{c:?}");
        let id = format!("ctl{c}id");
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
        assert_eq!(
            batch.ok(200)["results"][0]["error"]["code"],
            "invalid_receipt_id"
        );
        let path = format!("/v1/receipts/{}", urlencode(&id));
        refused(&s.get(&path).await, 422, "invalid_receipt_id", &what);
        refused(
            &s.get(&format!("/v1/dead-letters/{}", urlencode(&id))).await,
            422,
            "invalid_receipt_id",
            &what,
        );
        // worker_id, in a batch claim, a claim by id, and a claim sent back.
        refused(
            &s.post(
                "/v1/claims",
                json!({"worker_id": format!("w{c}"), "lease_ms": 1000, "limit": 1}),
            )
            .await,
            422,
            "invalid_worker_id",
            &what,
        );
        refused(
            &s.post(
                &format!("/v1/receipts/{REF}/claim"),
                json!({"worker_id": format!("w{c}"), "lease_ms": 1000}),
            )
            .await,
            422,
            "invalid_worker_id",
            &what,
        );
        let mut forged = claim.clone();
        forged["lease_owner"] = json!(format!("w-ref{c}"));
        refused(
            &s.outcome(&forged, json!({"kind": "accepted", "transcript_id": "tx"}))
                .await,
            422,
            "invalid_worker_id",
            &what,
        );
        // The claim's receipt_id, in the body and the path.
        let mut forged = claim.clone();
        forged["receipt_id"] = json!(id);
        refused(
            &s.outcome(&forged, json!({"kind": "accepted", "transcript_id": "tx"}))
                .await,
            422,
            "invalid_receipt_id",
            &what,
        );
        // transcript_id.
        refused(
            &s.outcome(
                &claim,
                json!({"kind": "accepted", "transcript_id": format!("tx{c}")}),
            )
            .await,
            422,
            "invalid_transcript_id",
            &what,
        );
        // lease_token: never equal to a stored token, so a conflict (or a
        // refusal), and never a server error.
        let mut forged = claim.clone();
        forged["lease_token"] = json!(format!(
            "{}{c}",
            claim["lease_token"].as_str().expect("token")
        ));
        for (label, answer) in [
            (
                "outcome",
                s.outcome(&forged, json!({"kind": "accepted", "transcript_id": "tx"}))
                    .await,
            ),
            (
                "extend",
                s.post(
                    &format!("/v1/receipts/{REF}/lease"),
                    json!({"claim": forged, "extend_ms": 1000}),
                )
                .await,
            ),
            (
                "release",
                s.call(
                    Method::DELETE,
                    &format!("/v1/receipts/{REF}/lease"),
                    Some(json!({"claim": forged})),
                )
                .await,
            ),
        ] {
            let status = answer.status.as_u16();
            *lease_token_answers
                .entry(format!("{status} {}", answer.body["code"]))
                .or_default() += 1;
            assert!(
                (status == 409 && answer.body["code"] == "lease_conflict")
                    || (status == 422 && answer.body["class"] == "validation"),
                "lease_token with {what} ({label}): {status} {:?}",
                answer.body
            );
        }
        // Query strings.
        refused(
            &s.get(&format!(
                "/v1/dead-letters?after={}",
                urlencode(&format!("1.{c}"))
            ))
            .await,
            422,
            "invalid_cursor",
            &what,
        );
        let answer = s
            .get(&format!("/v1/status?limit={}", urlencode(&format!("1{c}"))))
            .await;
        refused(&answer, 422, "invalid_query", &what);
        // A raw (unescaped) control character inside a JSON string is not JSON.
        if c < ' ' {
            let body = format!(r#"{{"receipt_id":"raw{c}","finalized_at":1}}"#);
            refused(
                &post_raw(&s, "/v1/receipts", body).await,
                400,
                "malformed_json",
                &what,
            );
        }
    }
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");

    // Free text takes anything: a failure detail is stored as the SHA-256 of
    // exactly what was sent, and an observation comes back exactly as sent.
    for (i, c) in CONTROLS.iter().enumerate() {
        let id = format!("free-{i}");
        let observation = json!({
            format!("k{c}"): format!("v{c}"),
            "nested": {format!("{c}"): [format!("{c}{c}"), c.to_string()]},
        });
        s.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": 7, "observation": observation}),
        )
        .await
        .ok(201);
        s.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": 7, "observation": observation}),
        )
        .await
        .ok(200);
        s.post(
            "/v1/receipts",
            json!({"receipt_id": id, "finalized_at": 7, "observation": {"k": format!("v{c}")}}),
        )
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
        let detail = format!("rail said {c}\u{0}{c}: secret=abc");
        let claim = s
            .post(
                &format!("/v1/receipts/{id}/claim"),
                json!({"worker_id": "w", "lease_ms": 1000}),
            )
            .await
            .ok(200)
            .clone();
        assert_eq!(claim["observation"], observation);
        let route = s
            .outcome(
                &claim,
                json!({"kind": "permanent", "code": "invalid_observation", "detail": detail}),
            )
            .await;
        assert_eq!(route.ok(200)["kind"], "dead_lettered");
        let view = s.receipt(&id).await;
        assert_eq!(view["observation"], observation, "{c:?}");
        assert_eq!(view["last_failure"]["detail_sha256"], sha256_hex(&detail));
        assert!(
            !view.to_string().contains("secret=abc"),
            "the detail text is never stored"
        );
    }
    println!(
        "hostile_input ({}): forged lease tokens with control characters (outcome, extend, release) answered {lease_token_answers:?}",
        s.fresh.store.backend().as_str()
    );
    s.stop().await;
}

on_every_backend!(control_characters_are_refused_in_ids_and_kept_in_free_text);
