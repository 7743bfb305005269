//! Hostile input: odd and oversized ids, control characters in every string
//! field, integers at and past their limits, deep and huge bodies, slow and
//! idle clients. Each is answered with a clear 4xx (problem+json with a code
//! and a class) or the documented success, and a refusal changes nothing.
//!
//! Strings, ids and numbers run on every backend; the connection-level tests
//! (slow and idle clients) run once, on SQLite.

use crate::common;
use crate::on_every_backend;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use settled::clock::SystemClock;
use settled::domain::RetryPolicy;
use settled::http::AppState;
use settled::server::Limits;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::common::Fresh;
use crate::common::http::{Answer, TestServer, spawn, urlencode};

const REF: &str = "ref-1";
const I64_MAX: &str = "9223372036854775807";
const I64_MAX_PLUS_1: &str = "9223372036854775808";
const U64_MAX: &str = "18446744073709551615";
const U64_MAX_PLUS_1: &str = "18446744073709551616";
/// Values no integer field takes, whatever its bounds.
const NOT_AN_INTEGER: [&str; 7] = [
    U64_MAX_PLUS_1,
    "340282366920938463463374607431768211456",
    "-1",
    "-9223372036854775808",
    "1.5",
    "1e3",
    "1e400",
];
/// Control characters: C0, DEL and C1.
const CONTROLS: [char; 9] = [
    '\0', '\u{1}', '\t', '\n', '\r', '\u{1b}', '\u{7f}', '\u{85}', '\u{9f}',
];

/// Everything a refusal must leave alone: counts, every receipt of every
/// state, and the reference receipt (leased, with an observation) in full.
async fn snapshot(s: &TestServer) -> Value {
    let status = s.get("/v1/status?limit=4096").await.ok(200).clone();
    json!({"counts": status["counts"], "samples": status["samples"], "ref": s.receipt(REF).await})
}

/// A server holding one leased reference receipt; returns its claim.
async fn with_ref(fresh: Fresh) -> (TestServer, Value) {
    let s = spawn(fresh).await;
    s.post(
        "/v1/receipts",
        json!({"receipt_id": REF, "finalized_at": 1_764_460_800u64, "observation": {"amount": 5}}),
    )
    .await
    .ok(201);
    let claim = s
        .post(
            &format!("/v1/receipts/{REF}/claim"),
            json!({"worker_id": "w-ref", "lease_ms": 60_000}),
        )
        .await
        .ok(200)
        .clone();
    (s, claim)
}

/// A 4xx problem+json of class `validation`; with `code`, exactly that code.
#[track_caller]
fn refused(answer: &Answer, status: u16, code: &str, what: &str) {
    assert_eq!(
        answer.status.as_u16(),
        status,
        "{what}: status of {:?}",
        answer.body
    );
    assert_eq!(
        answer.content_type, "application/problem+json",
        "{what}: {:?}",
        answer.body
    );
    assert_eq!(answer.body["code"], code, "{what}: {:?}", answer.body);
    assert_eq!(answer.body["status"], status, "{what}");
    assert!(answer.body["class"].is_string(), "{what}");
}

/// 400 `malformed_json` (serde refuses it while parsing) or 422
/// `invalid_body` (it parses but not as the target type); either way a
/// validation problem. Used for numbers no integer field can hold.
#[track_caller]
fn refused_as_not_an_integer(answer: &Answer, what: &str) {
    let status = answer.status.as_u16();
    let code = answer.body["code"].as_str().unwrap_or_default();
    assert!(
        (status == 422 && code == "invalid_body") || (status == 400 && code == "malformed_json"),
        "{what}: {status} {:?}",
        answer.body
    );
    assert_eq!(answer.body["class"], "validation", "{what}");
    assert_eq!(answer.content_type, "application/problem+json", "{what}");
}

async fn post_raw(s: &TestServer, path: &str, body: String) -> Answer {
    s.raw(
        Method::POST,
        path,
        Some("application/json"),
        body.into_bytes(),
    )
    .await
}

/// `value` with the field at `path` replaced by the raw JSON text `number`.
fn with_number(value: &Value, path: &[&str], number: &str) -> String {
    let mut value = value.clone();
    let mut at = &mut value;
    for key in path {
        at = &mut at[*key];
    }
    *at = json!("@NUMBER@");
    value.to_string().replace("\"@NUMBER@\"", number)
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

// ---------------------------------------------------------------- ids

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

// ---------------------------------------------------------- control characters

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

// ---------------------------------------------------------------- integers

/// (path, body, field, value, expected status, expected code).
type Case<'a> = (String, Value, Vec<&'a str>, &'a str, u16, &'a str);

async fn integers_at_and_past_their_limits(fresh: Fresh) {
    let (s, claim) = with_ref(fresh).await;
    let before = snapshot(&s).await;
    let receipt = json!({"receipt_id": "num", "finalized_at": 1, "visible_at_ms": 1});
    let claims = json!({"worker_id": "w", "lease_ms": 1000, "limit": 1, "wait_ms": 0});
    let claim_one = json!({"worker_id": "w", "lease_ms": 1000});
    let outcome = json!({"claim": claim, "outcome": {"kind": "accepted", "transcript_id": "tx"}});
    let extend = json!({"claim": claim, "extend_ms": 1000});
    let ref_claim = format!("/v1/receipts/{REF}/claim");
    let ref_outcome = format!("/v1/receipts/{REF}/outcome");
    let ref_lease = format!("/v1/receipts/{REF}/lease");

    // Refusals only.
    let mut cases: Vec<Case> = Vec::new();
    for v in [I64_MAX_PLUS_1, U64_MAX] {
        cases.push((
            "/v1/receipts".into(),
            receipt.clone(),
            vec!["finalized_at"],
            v,
            422,
            "invalid_finalized_at",
        ));
        cases.push((
            "/v1/receipts".into(),
            receipt.clone(),
            vec!["visible_at_ms"],
            v,
            422,
            "invalid_visible_at_ms",
        ));
    }
    for v in ["0", "86400001", I64_MAX, I64_MAX_PLUS_1, U64_MAX] {
        cases.push((
            "/v1/claims".into(),
            claims.clone(),
            vec!["lease_ms"],
            v,
            422,
            "lease_duration",
        ));
        cases.push((
            ref_claim.clone(),
            claim_one.clone(),
            vec!["lease_ms"],
            v,
            422,
            "lease_duration",
        ));
        cases.push((
            ref_lease.clone(),
            extend.clone(),
            vec!["extend_ms"],
            v,
            422,
            "lease_duration",
        ));
    }
    for v in ["0", "1025", I64_MAX, U64_MAX] {
        cases.push((
            "/v1/claims".into(),
            claims.clone(),
            vec!["limit"],
            v,
            422,
            "claim_batch",
        ));
    }
    for v in ["20001", I64_MAX, U64_MAX] {
        cases.push((
            "/v1/claims".into(),
            claims.clone(),
            vec!["wait_ms"],
            v,
            422,
            "invalid_wait_ms",
        ));
    }
    for field in ["finalized_at", "row_version", "lease_until_ms"] {
        for v in [I64_MAX_PLUS_1, U64_MAX] {
            cases.push((
                ref_outcome.clone(),
                outcome.clone(),
                vec!["claim", field],
                v,
                422,
                "invalid_claim",
            ));
            cases.push((
                ref_lease.clone(),
                extend.clone(),
                vec!["claim", field],
                v,
                422,
                "invalid_claim",
            ));
        }
        // Representable but not what is stored: a conflict.
        for v in ["0", I64_MAX] {
            cases.push((
                ref_outcome.clone(),
                outcome.clone(),
                vec!["claim", field],
                v,
                409,
                "lease_conflict",
            ));
        }
    }
    // attempts is a u32.
    for v in ["4294967296", I64_MAX, U64_MAX] {
        cases.push((
            ref_outcome.clone(),
            outcome.clone(),
            vec!["claim", "attempts"],
            v,
            422,
            "invalid_body",
        ));
    }
    for v in ["7", "4294966"] {
        cases.push((
            ref_outcome.clone(),
            outcome.clone(),
            vec!["claim", "attempts"],
            v,
            409,
            "lease_conflict",
        ));
    }
    for (path, body, field, value, status, code) in &cases {
        let answer = post_raw(&s, path, with_number(body, field, value)).await;
        refused(
            &answer,
            *status,
            code,
            &format!("{path} {field:?} = {value}"),
        );
    }
    // Values that are no integer at all, in every integer field.
    let mut fields: Vec<(String, Value, Vec<&str>)> = vec![
        ("/v1/receipts".into(), receipt.clone(), vec!["finalized_at"]),
        (
            "/v1/receipts".into(),
            receipt.clone(),
            vec!["visible_at_ms"],
        ),
        ("/v1/claims".into(), claims.clone(), vec!["lease_ms"]),
        ("/v1/claims".into(), claims.clone(), vec!["limit"]),
        ("/v1/claims".into(), claims.clone(), vec!["wait_ms"]),
        (ref_claim.clone(), claim_one.clone(), vec!["lease_ms"]),
        (ref_lease.clone(), extend.clone(), vec!["extend_ms"]),
    ];
    for field in ["finalized_at", "attempts", "row_version", "lease_until_ms"] {
        fields.push((ref_outcome.clone(), outcome.clone(), vec!["claim", field]));
        fields.push((ref_lease.clone(), extend.clone(), vec!["claim", field]));
    }
    let mut not_integers = 0;
    for (path, body, field) in &fields {
        for value in NOT_AN_INTEGER {
            let answer = post_raw(&s, path, with_number(body, field, value)).await;
            refused_as_not_an_integer(&answer, &format!("{path} {field:?} = {value}"));
            not_integers += 1;
        }
    }
    // Batches judge each item on its own.
    let item = with_number(
        &json!({"receipt_id": "b-1", "finalized_at": 1}),
        &["finalized_at"],
        U64_MAX_PLUS_1,
    );
    let answer = post_raw(
        &s,
        "/v1/receipts/batch",
        format!(r#"{{"receipts":[{item}]}}"#),
    )
    .await;
    let result = &answer.ok(200)["results"][0];
    assert_eq!(result["status"], "invalid", "{result}");
    assert_eq!(result["error"]["code"], "invalid_body", "{result}");
    let item = with_number(&outcome, &["claim", "row_version"], I64_MAX_PLUS_1);
    let answer = post_raw(&s, "/v1/outcomes", format!(r#"{{"outcomes":[{item}]}}"#)).await;
    let result = &answer.ok(200)["results"][0];
    assert_eq!(result["error"]["code"], "invalid_claim", "{result}");
    // Query integers.
    for (path, code) in [
        ("/v1/status?limit=0", "invalid_limit"),
        ("/v1/status?limit=4097", "invalid_limit"),
        ("/v1/status?limit=18446744073709551615", "invalid_limit"),
        ("/v1/status?limit=18446744073709551616", "invalid_query"),
        ("/v1/status?limit=-1", "invalid_query"),
        ("/v1/status?limit=1.5", "invalid_query"),
        ("/v1/dead-letters?limit=0", "invalid_limit"),
        ("/v1/dead-letters?limit=1001", "invalid_limit"),
        (
            "/v1/dead-letters?limit=18446744073709551616",
            "invalid_query",
        ),
        (
            "/v1/dead-letters?after=9223372036854775808.61",
            "invalid_cursor",
        ),
        (
            "/v1/dead-letters?after=18446744073709551616.61",
            "invalid_cursor",
        ),
        ("/v1/dead-letters?after=-1.61", "invalid_cursor"),
    ] {
        refused(&s.get(path).await, 422, code, path);
    }
    assert_eq!(snapshot(&s).await, before, "refusals changed nothing");

    // The largest values that are allowed work, and nothing overflows later.
    let answer = post_raw(
        &s,
        "/v1/receipts",
        format!(r#"{{"receipt_id":"max-final","finalized_at":{I64_MAX}}}"#),
    )
    .await;
    assert_eq!(
        answer.ok(201)["finalized_at"],
        u64::try_from(i64::MAX).unwrap()
    );
    let answer = post_raw(
        &s,
        "/v1/receipts",
        format!(r#"{{"receipt_id":"max-visible","finalized_at":1,"visible_at_ms":{I64_MAX}}}"#),
    )
    .await;
    let view = answer.ok(201);
    assert_eq!(view["state"], "pending");
    assert_eq!(view["next_visible_at_ms"], u64::try_from(i64::MAX).unwrap());
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "zero-visible", "finalized_at": 0, "visible_at_ms": 0}),
    )
    .await
    .ok(201);
    refused(
        &s.post(
            "/v1/receipts/max-visible/claim",
            json!({"worker_id": "w", "lease_ms": 1000}),
        )
        .await,
        409,
        "receipt_not_visible",
        "never due",
    );
    let claimed = s
        .post(
            "/v1/receipts/max-final/claim",
            json!({"worker_id": "w", "lease_ms": 86_400_000}),
        )
        .await
        .ok(200)
        .clone();
    assert_eq!(claimed["finalized_at"], u64::try_from(i64::MAX).unwrap());
    let extended = s
        .post(
            "/v1/receipts/max-final/lease",
            json!({"claim": claimed, "extend_ms": 86_400_000}),
        )
        .await
        .ok(200)
        .clone();
    let route = s
        .outcome(
            &extended,
            json!({"kind": "permanent", "code": "unsupported", "detail": ""}),
        )
        .await;
    assert_eq!(route.ok(200)["kind"], "dead_lettered");
    let page = s.get("/v1/dead-letters?limit=1000").await.ok(200).clone();
    assert_eq!(
        page["dead_letters"][0]["finalized_at"],
        u64::try_from(i64::MAX).unwrap()
    );
    let status = s.get("/v1/status?limit=4096").await.ok(200).clone();
    assert_eq!(status["counts"]["dead_lettered"], 1);
    assert!(status["oldest_due_age_ms"].as_u64().is_some());
    println!(
        "hostile_input ({}): {} bounded-integer refusals, {not_integers} non-integer refusals",
        s.fresh.store.backend().as_str(),
        cases.len()
    );
    s.stop().await;
}

// ------------------------------------------------------- deep and huge bodies

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

/// A forged claim whose `attempts` is `u32::MAX` would overflow `attempts + 1`;
/// since it does not match the stored row it is a 409 conflict, not a 500
/// `invalid_record` (which would mislead operators about corrupt data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_claim_with_attempts_at_u32_max_is_a_conflict() {
    let (s, claim) = with_ref(common::fresh_sqlite().await).await;
    let before = snapshot(&s).await;
    for outcome in [
        json!({"kind": "accepted", "transcript_id": "tx"}),
        json!({"kind": "retryable", "code": "rpc", "detail": ""}),
    ] {
        let body = json!({"claim": claim, "outcome": outcome});
        let answer = post_raw(
            &s,
            &format!("/v1/receipts/{REF}/outcome"),
            with_number(&body, &["claim", "attempts"], "4294967295"),
        )
        .await;
        answer.assert_problem(409, "lease_conflict", "conflict");
    }
    assert_eq!(snapshot(&s).await, before);
    s.stop().await;
}

on_every_backend!(
    hostile_receipt_ids_round_trip_and_oversized_ones_are_refused,
    control_characters_are_refused_in_ids_and_kept_in_free_text,
    integers_at_and_past_their_limits,
    deep_and_huge_bodies_are_refused_cleanly,
);

// ------------------------------------------------- slow, stalled and idle clients

/// A server on the system clock with a short shutdown grace period.
struct Live {
    addr: SocketAddr,
    base: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _fresh: Fresh,
}

async fn live(grace: Duration) -> Live {
    live_with(Limits {
        grace,
        ..Limits::default()
    })
    .await
}

async fn live_with(limits: Limits) -> Live {
    let fresh = common::fresh_sqlite().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = watch::channel(false);
    let state = AppState::new(
        fresh.store.clone(),
        RetryPolicy::default(),
        Arc::new(SystemClock),
        rx.clone(),
    );
    let mut stopped = rx;
    let task = tokio::spawn(settled::server::serve_with(
        listener,
        state,
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
        limits,
    ));
    Live {
        addr,
        base: format!("http://{addr}"),
        stop,
        task,
        _fresh: fresh,
    }
}

impl Live {
    async fn status_counts(&self) -> Value {
        let status: Value = reqwest::get(format!("{}/v1/status", self.base))
            .await
            .expect("status")
            .json()
            .await
            .expect("json");
        status["counts"].clone()
    }

    /// Stop and return how long the server took to return.
    async fn stop(self) -> Duration {
        let started = Instant::now();
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the server returned")
            .expect("server task")
            .expect("server");
        started.elapsed()
    }
}

/// Read one response (status and body) or `None` if the connection closed
/// or nothing complete came within `limit`.
fn read_response(stream: &mut TcpStream, limit: Duration) -> Option<(u16, String)> {
    let deadline = Instant::now() + limit;
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok()?;
        match stream.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(_) => return None,
        }
        let text = String::from_utf8_lossy(&buffer).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= length {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                return Some((status, body.to_owned()));
            }
        }
    }
}

/// Whether the server closed `stream` within `limit` (EOF or reset).
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut chunk = [0u8; 256];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let _ = stream.set_read_timeout(Some(left.max(Duration::from_millis(1))));
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return true,
        }
    }
    false
}

const HEAD: &str =
    "POST /v1/receipts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_client_is_served() {
    let server = live(Duration::from_secs(2)).await;
    let addr = server.addr;
    let answer = tokio::task::spawn_blocking(move || {
        let body = r#"{"receipt_id":"slow","finalized_at":1}"#;
        let request = format!("{HEAD}Content-Length: {}\r\n\r\n{body}", body.len());
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        for byte in request.as_bytes() {
            stream.write_all(&[*byte]).expect("write");
            std::thread::sleep(Duration::from_millis(5));
        }
        read_response(&mut stream, Duration::from_secs(10))
    })
    .await
    .expect("client");
    let (status, body) = answer.expect("an answer");
    assert_eq!(status, 201, "{body}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_sending_its_body_gets_408_and_changes_nothing() {
    let server = live(Duration::from_secs(2)).await;
    let before = server.status_counts().await;
    let addr = server.addr;
    let started = Instant::now();
    // A Content-Length body cut short, and a chunked body that stops; both at once.
    let stalls = [
        format!("{HEAD}Content-Length: 100\r\n\r\n{{\"receipt_id\":\"stalled\""),
        format!("{HEAD}Transfer-Encoding: chunked\r\n\r\n9\r\n{{\"receipt\r\n"),
    ];
    let clients: Vec<_> = stalls
        .into_iter()
        .map(|request| {
            tokio::task::spawn_blocking(move || {
                let mut stream = TcpStream::connect(addr).expect("connect");
                stream.write_all(request.as_bytes()).expect("write");
                read_response(&mut stream, Duration::from_secs(25))
            })
        })
        .collect();
    let mut answers = Vec::new();
    for client in clients {
        answers.push(client.await.expect("client"));
    }
    let elapsed = started.elapsed();
    for answer in answers {
        let (status, body) = answer.expect("the stalled request is answered");
        assert_eq!(status, 408, "{body}");
        let problem: Value = serde_json::from_str(&body).expect("problem");
        assert_eq!(problem["code"], "request_timeout");
        assert_eq!(problem["class"], "validation");
    }
    assert!(
        elapsed < Duration::from_secs(15),
        "answered within the body read timeout: {elapsed:?}"
    );
    assert_eq!(server.status_counts().await, before);
    println!("stalled bodies answered 408 after {elapsed:.1?}");
    server.stop().await;
}

/// Connections that never send anything, and connections that stop part-way
/// through a request head, do not stop others from being served, and do not
/// keep a stopping server alive past its grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_open_connections_do_not_starve_others_or_block_shutdown() {
    let idle_count = 500;
    let partial_count = 50;
    let grace = Duration::from_secs(2);
    let server = live(grace).await;
    let addr = server.addr;
    let held = tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        for _ in 0..idle_count {
            held.push(TcpStream::connect(addr).expect("connect idle"));
        }
        for i in 0..partial_count {
            let mut stream = TcpStream::connect(addr).expect("connect partial");
            let head = format!("{HEAD}Content-Len");
            stream
                .write_all(&head.as_bytes()[..head.len() - i % 20])
                .expect("write");
            held.push(stream);
        }
        held
    })
    .await
    .expect("connect");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let mut slowest = Duration::ZERO;
    for i in 0..50 {
        let started = Instant::now();
        let answer = http
            .post(format!("{}/v1/receipts", server.base))
            .json(&json!({"receipt_id": format!("busy-{i}"), "finalized_at": 1}))
            .send()
            .await
            .expect("served despite idle connections");
        assert_eq!(answer.status(), 201);
        let answer = http
            .get(format!("{}/v1/receipts/busy-{i}", server.base))
            .send()
            .await
            .expect("served");
        assert_eq!(answer.status(), 200);
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(2),
        "slowest pair took {slowest:?}"
    );
    assert_eq!(server.status_counts().await["pending"], 50);
    let took = server.stop().await;
    assert!(
        took < grace + Duration::from_secs(3),
        "half-sent requests kept the server from stopping: {took:?}"
    );
    drop(held);
    println!(
        "{idle_count} idle + {partial_count} half-open connections: 100 requests served, slowest pair {slowest:.1?}, stopped in {took:.1?}"
    );
}

/// A client that sends part of a request head and then nothing is cut off
/// after the header read timeout (10 s), so such clients cannot pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_sending_its_request_head_is_cut_off() {
    let server = live(Duration::from_secs(2)).await;
    let addr = server.addr;
    let closed = tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .write_all(b"POST /v1/receipts HTTP/1.1\r\nHost: localhost\r\nContent-")
            .expect("write");
        let started = std::time::Instant::now();
        (
            closed_within(&mut stream, Duration::from_secs(20)),
            started.elapsed(),
        )
    })
    .await
    .expect("client");
    let (closed, took) = closed;
    assert!(
        closed,
        "the half-sent request head was still open after 20 s"
    );
    assert!(
        took >= Duration::from_secs(9),
        "cut off too early: {took:?}"
    );
    server.stop().await;
}

/// Limits with a short idle timeout, so that tests of it are quick.
fn short_idle(idle_timeout: Duration, max_connections: usize) -> Limits {
    Limits {
        idle_timeout,
        max_connections,
        grace: Duration::from_secs(2),
    }
}

/// The HTTP/2 connection preface and an empty SETTINGS frame: what a client
/// sends before its first request.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A connection that sends nothing, an HTTP/2 connection idle after its
/// preface, and an HTTP/1.1 keep-alive connection idle after a request are
/// all closed once idle for the idle timeout (here 1 s), and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_idle_and_preface_only_connections_are_closed_on_a_timer() {
    let idle = Duration::from_secs(1);
    let server = live_with(short_idle(idle, 100)).await;
    let addr = server.addr;
    let results = tokio::task::spawn_blocking(move || {
        let mut silent = TcpStream::connect(addr).expect("connect");
        let mut h2 = TcpStream::connect(addr).expect("connect");
        h2.write_all(H2_PREFACE).expect("preface");
        let mut kept = TcpStream::connect(addr).expect("connect");
        kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .expect("request");
        let answered = read_response(&mut kept, Duration::from_secs(10));
        let started = Instant::now();
        let mut results = Vec::new();
        for (name, stream) in [
            ("silent", &mut silent),
            ("h2", &mut h2),
            ("keep-alive", &mut kept),
        ] {
            results.push((name, closed_within(stream, Duration::from_secs(20))));
        }
        (answered, started.elapsed(), results)
    })
    .await
    .expect("client");
    let (answered, took, results) = results;
    assert_eq!(answered.map(|(status, _)| status), Some(200));
    for (name, closed) in results {
        assert!(closed, "the {name} connection was still open after 20 s");
    }
    // Not before the idle timeout (allowing for the time the request took).
    assert!(took >= idle / 2, "closed too early: {took:?}");
    server.stop().await;
}

/// At the connection cap, sockets that send nothing do not stop the service:
/// each new connection closes the one idle longest, so /healthz and real
/// requests are served while an attacker holds many more sockets than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_silent_sockets_make_room_for_real_clients() {
    let cap = 20;
    let server = live_with(short_idle(Duration::from_secs(600), cap)).await;
    let addr = server.addr;
    let held = tokio::task::spawn_blocking(move || {
        (0..cap * 5)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("connect");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    for i in 0..cap * 2 {
        let health = http
            .get(format!("{}/healthz", server.base))
            .send()
            .await
            .expect("served at the cap");
        assert_eq!(health.status(), 200);
        let created = http
            .post(format!("{}/v1/receipts", server.base))
            .json(&json!({"receipt_id": format!("cap-{i}"), "finalized_at": 1}))
            .send()
            .await
            .expect("served at the cap");
        assert_eq!(created.status(), 201);
    }
    let open = tokio::task::spawn_blocking(move || {
        let mut open = 0;
        for mut stream in held {
            if !closed_within(&mut stream, Duration::from_millis(20)) {
                open += 1;
            }
        }
        open
    })
    .await
    .expect("count");
    assert!(
        open <= cap,
        "{open} silent sockets still open with a cap of {cap}"
    );
    assert_eq!(server.status_counts().await["pending"], cap * 2);
    server.stop().await;
}

/// At the cap with every connection busy (long polls), a new connection is
/// closed at once rather than left waiting; once the polls end, new
/// connections are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_every_connection_busy_a_new_one_is_closed_at_once() {
    let cap = 2;
    let server = live_with(short_idle(Duration::from_secs(600), cap)).await;
    let addr = server.addr;
    let outcome = tokio::task::spawn_blocking(move || {
        let body = r#"{"worker_id":"w","lease_ms":1000,"limit":1,"wait_ms":4000}"#;
        let request = format!(
            "POST /v1/claims HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut polls: Vec<TcpStream> = (0..cap)
            .map(|_| {
                let mut stream = TcpStream::connect(addr).expect("connect");
                stream.write_all(request.as_bytes()).expect("write");
                stream
            })
            .collect();
        // Let both polls start waiting.
        std::thread::sleep(Duration::from_millis(500));
        let mut extra = TcpStream::connect(addr).expect("connect");
        let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let refused = read_response(&mut extra, Duration::from_secs(2)).is_none();
        let answered: Vec<_> = polls
            .iter_mut()
            .map(|s| read_response(s, Duration::from_secs(15)).map(|(status, _)| status))
            .collect();
        (refused, answered)
    })
    .await
    .expect("client");
    let (refused, answered) = outcome;
    assert!(
        refused,
        "a connection beyond the cap was served while all were busy"
    );
    assert_eq!(
        answered,
        vec![Some(200); cap],
        "the long polls were answered"
    );
    let health = reqwest::get(format!("{}/healthz", server.base))
        .await
        .expect("served after the polls");
    assert_eq!(health.status(), 200);
    server.stop().await;
}
