//! Hostile input, one file per thing attacked: receipt ids and paths
//! ([`ids`]), control characters in every string field ([`control_chars`]),
//! integers at and past their limits in bodies and queries ([`integers`]),
//! forged or out-of-range claim fields ([`claims`]), deep, huge and
//! mis-typed bodies ([`bodies`]), and slow, stalled and idle connections
//! ([`transport`]). Each is answered with a clear 4xx (problem+json with a
//! code and a class) or the documented success, and a refusal changes
//! nothing.
//!
//! Strings, ids, numbers and bodies run on every backend; the
//! connection-level tests (slow and idle clients) run once, on SQLite.

mod bodies;
mod claims;
mod control_chars;
mod ids;
mod integers;
mod transport;

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::Fresh;
use crate::common::http::{Answer, TestServer, spawn};

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

/// One bounded-integer refusal: (path, body, field, value, expected status,
/// expected code).
type Case<'a> = (String, Value, Vec<&'a str>, &'a str, u16, &'a str);

/// Send each case's body with its field set to its value; each is refused
/// as the case says.
async fn refuse_all(s: &TestServer, cases: &[Case<'_>]) {
    for (path, body, field, value, status, code) in cases {
        let answer = post_raw(s, path, with_number(body, field, value)).await;
        refused(
            &answer,
            *status,
            code,
            &format!("{path} {field:?} = {value}"),
        );
    }
}

/// Send each body with its field set to each value no integer field takes;
/// each is refused. Returns how many were sent.
async fn refuse_non_integers(s: &TestServer, fields: &[(String, Value, Vec<&str>)]) -> usize {
    let mut sent = 0;
    for (path, body, field) in fields {
        for value in NOT_AN_INTEGER {
            let answer = post_raw(s, path, with_number(body, field, value)).await;
            refused_as_not_an_integer(&answer, &format!("{path} {field:?} = {value}"));
            sent += 1;
        }
    }
    sent
}
