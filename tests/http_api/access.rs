//! Every endpoint × every role, no token and a wrong token.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{Value, json};
use settled::http::middleware::auth::Tokens;

use crate::common::fresh_sqlite;
use crate::common::http::spawn_with_tokens;

const ROLES: [(&str, &str); 4] = [
    ("producer", "producer-token-0123456789"),
    ("worker", "worker-token-0123456789"),
    ("reader", "reader-token-0123456789"),
    ("operator", "operator-token-0123456789"),
];

fn claim() -> Value {
    json!({"receipt_id": "r", "finalized_at": 1, "attempts": 0, "row_version": 1,
        "lease_owner": "w", "lease_token": "t", "lease_until_ms": 5})
}

/// (method, path, body, roles that may call it); `open` means no token needed.
fn endpoints() -> Vec<(Method, &'static str, Option<Value>, &'static [&'static str])> {
    let receipt = json!({"receipt_id": "r", "finalized_at": 1});
    let outcome = json!({"claim": claim(), "outcome": {"kind": "skipped", "reason": "denied"}});
    vec![
        (
            Method::POST,
            "/v1/receipts",
            Some(receipt.clone()),
            &["producer", "operator"],
        ),
        (
            Method::POST,
            "/v1/receipts/batch",
            Some(json!({"receipts": [receipt]})),
            &["producer", "operator"],
        ),
        (
            Method::GET,
            "/v1/receipts/r",
            None,
            &["producer", "worker", "reader", "operator"],
        ),
        (
            Method::POST,
            "/v1/claims",
            Some(json!({"worker_id": "w", "lease_ms": 5, "limit": 1})),
            &["worker", "operator"],
        ),
        (
            Method::POST,
            "/v1/receipts/r/claim",
            Some(json!({"worker_id": "w", "lease_ms": 5})),
            &["worker", "operator"],
        ),
        (
            Method::POST,
            "/v1/receipts/r/outcome",
            Some(outcome.clone()),
            &["worker", "operator"],
        ),
        (
            Method::POST,
            "/v1/outcomes",
            Some(json!({"outcomes": [outcome]})),
            &["worker", "operator"],
        ),
        (
            Method::POST,
            "/v1/receipts/r/lease",
            Some(json!({"claim": claim(), "extend_ms": 5})),
            &["worker", "operator"],
        ),
        (
            Method::POST,
            "/v1/leases/extend",
            Some(json!({"leases": [{"claim": claim(), "extend_ms": 5}]})),
            &["worker", "operator"],
        ),
        (
            Method::DELETE,
            "/v1/receipts/r/lease",
            Some(json!({"claim": claim()})),
            &["worker", "operator"],
        ),
        (
            Method::GET,
            "/v1/dead-letters",
            None,
            &["reader", "operator"],
        ),
        (
            Method::GET,
            "/v1/dead-letters/r",
            None,
            &["reader", "operator"],
        ),
        (
            Method::POST,
            "/v1/dead-letters/r/redrive",
            None,
            &["operator"],
        ),
        (
            Method::POST,
            "/v1/receipts/r/hold",
            Some(json!({})),
            &["operator"],
        ),
        (Method::POST, "/v1/receipts/r/unhold", None, &["operator"]),
        (
            Method::POST,
            "/v1/receipts/r/cancel",
            Some(json!({"reason": "x"})),
            &["operator"],
        ),
        (
            Method::POST,
            "/v1/bulk/hold",
            Some(json!({"receipt_ids": ["r"], "dry_run": true})),
            &["operator"],
        ),
        (Method::GET, "/v1/status", None, &["reader", "operator"]),
        (Method::GET, "/v1/stats", None, &["reader", "operator"]),
        (Method::GET, "/v1/groups", None, &["reader", "operator"]),
        (
            Method::GET,
            "/v1/groups/default",
            None,
            &["reader", "operator"],
        ),
        (
            Method::PUT,
            "/v1/groups/rail:ach",
            Some(json!({"max_leased": 5})),
            &["operator"],
        ),
        (
            Method::GET,
            "/v1/receipts?state=pending",
            None,
            &["reader", "operator"],
        ),
        (Method::GET, "/v1/history", None, &["reader", "operator"]),
        (
            Method::GET,
            "/v1/info",
            None,
            &["producer", "worker", "reader", "operator"],
        ),
        (Method::GET, "/healthz", None, &["open"]),
        (Method::GET, "/readyz", None, &["open"]),
        (Method::GET, "/openapi.json", None, &["open"]),
        (Method::GET, "/openapi.yaml", None, &["open"]),
        (Method::GET, "/docs/", None, &["open"]),
    ]
}

#[tokio::test]
async fn every_endpoint_answers_every_role_as_the_access_table_says() {
    let entries: Vec<String> = ROLES.iter().map(|(r, t)| format!("{r}:{t}")).collect();
    let s = spawn_with_tokens(fresh_sqlite().await, Tokens::parse(&entries).unwrap()).await;
    let callers: Vec<(&str, Option<&str>)> = ROLES
        .iter()
        .map(|(r, t)| (*r, Some(*t)))
        .chain([("none", None), ("wrong", Some("wrong-token-0123456789"))])
        .collect();
    let mut checked = 0;
    for (method, path, body, allowed) in endpoints() {
        for (who, token) in &callers {
            let mut request = s
                .client
                .request(method.clone(), format!("{}{path}", s.base));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &body {
                request = request.json(body);
            } else if method != Method::GET {
                // As every client must (see the cross-site request checks).
                request = request.header("content-type", "application/json");
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let www = response.headers().get("www-authenticate").cloned();
            let text = response.text().await.unwrap();
            let open = allowed.contains(&"open");
            let expected = if open || allowed.contains(who) {
                None
            } else if matches!(*who, "none" | "wrong") {
                Some((401, "unauthorized"))
            } else {
                Some((403, "forbidden"))
            };
            match expected {
                None => assert!(
                    status != 401 && status != 403,
                    "{who} {method} {path}: {status} {text}"
                ),
                Some((code, label)) => {
                    assert_eq!(status, code, "{who} {method} {path}: {text}");
                    let body: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(body["class"], "auth");
                    assert_eq!(body["code"], label);
                    if code == 401 {
                        assert_eq!(www.unwrap(), "Bearer");
                    }
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, endpoints().len() * 6);
    // Nothing a refused caller sent was stored: only allowed enqueues created `r`.
    s.stop().await;
}

/// The table above covers every operation the router serves, so a route
/// added without an entry (and so without a checked role list) fails here;
/// each `/v1` operation's roles are declared where its handler is registered.
#[test]
fn the_access_table_covers_every_route_of_the_router() {
    let doc = settled::http::openapi();
    let mut templates = matchit::Router::new();
    let mut served = BTreeSet::new();
    for (template, item) in &doc.paths.paths {
        templates
            .insert(template.clone(), template.clone())
            .unwrap();
        for (method, _) in settled::http::middleware::auth::operations(item) {
            served.insert((method.to_string(), template.clone()));
        }
    }
    let covered: BTreeSet<(String, String)> = endpoints()
        .into_iter()
        .filter_map(|(method, path, _, _)| {
            let path = path.split('?').next().unwrap_or_default();
            let template = templates.at(path).ok()?.value.clone();
            Some((method.to_string(), template))
        })
        .collect();
    let missing: Vec<_> = served.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "operations without an access row: {missing:?}"
    );
}

/// A token that is valid gets the router's own answer for a path or method
/// no operation has (404, 405), whatever its role; without one, 401.
#[tokio::test]
async fn a_path_no_operation_has_is_not_found_for_every_valid_token() {
    let entries: Vec<String> = ROLES.iter().map(|(r, t)| format!("{r}:{t}")).collect();
    let s = spawn_with_tokens(fresh_sqlite().await, Tokens::parse(&entries).unwrap()).await;
    for (role, token) in ROLES {
        let get = |path: &str| {
            s.client
                .get(format!("{}{path}", s.base))
                .bearer_auth(token)
                .send()
        };
        let missing = get("/v1/nope").await.unwrap();
        assert_eq!(missing.status().as_u16(), 404, "{role}");
        let wrong_method = get("/v1/claims").await.unwrap();
        assert_eq!(wrong_method.status().as_u16(), 405, "{role}");
        // HEAD runs the GET handler, so it needs GET's roles.
        let head = s
            .client
            .head(format!("{}/v1/dead-letters/r", s.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let expected = if matches!(role, "reader" | "operator") {
            404
        } else {
            403
        };
        assert_eq!(head.status().as_u16(), expected, "HEAD as {role}");
    }
    let anonymous = s.client.get(format!("{}/v1/nope", s.base)).send().await;
    assert_eq!(anonymous.unwrap().status().as_u16(), 401);
    s.stop().await;
}

/// `GET /v1/info` tells every token its role and name (never the token), so
/// that a client can show only what it may do; an anonymous server names none.
#[tokio::test]
async fn info_names_the_callers_role_and_token_name() {
    let entries = [
        "operator:alice:operator-token-0123456789".to_owned(),
        "reader:reader-token-0123456789".to_owned(),
    ];
    let s = spawn_with_tokens(fresh_sqlite().await, Tokens::parse(&entries).unwrap()).await;
    let info = |token: &'static str| {
        let request = s
            .client
            .get(format!("{}/v1/info", s.base))
            .bearer_auth(token);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let operator = info("operator-token-0123456789").await;
    assert_eq!(
        operator["caller"],
        json!({"role": "operator", "name": "alice"})
    );
    assert!(
        !operator.to_string().contains("operator-token"),
        "{operator}"
    );
    let reader = info("reader-token-0123456789").await;
    assert_eq!(reader["caller"], json!({"role": "reader"}));
    s.stop().await;
    let anonymous = crate::common::http::spawn(fresh_sqlite().await).await;
    let info = anonymous.get("/v1/info").await.ok(200).clone();
    assert!(info.get("caller").is_none(), "{info}");
    anonymous.stop().await;
}

#[tokio::test]
async fn a_refused_caller_changes_nothing() {
    let entries = ["reader:reader-token-0123456789".to_owned()];
    let s = spawn_with_tokens(fresh_sqlite().await, Tokens::parse(&entries).unwrap()).await;
    let response = s
        .client
        .post(format!("{}/v1/receipts", s.base))
        .bearer_auth("reader-token-0123456789")
        .json(&json!({"receipt_id": "r", "finalized_at": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let view = s
        .client
        .get(format!("{}/v1/receipts/r", s.base))
        .bearer_auth("reader-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(view.status().as_u16(), 404);
    s.stop().await;
}

/// The scheme name is case-insensitive (RFC 9110): `bearer` and `BEARER` work
/// like `Bearer`; another scheme, or a token alone, is still refused.
#[tokio::test]
async fn the_bearer_scheme_name_is_case_insensitive() {
    let token = "reader-token-0123456789";
    let entries = [format!("reader:{token}")];
    let s = spawn_with_tokens(fresh_sqlite().await, Tokens::parse(&entries).unwrap()).await;
    let status_with = |value: String| {
        let request = s
            .client
            .get(format!("{}/v1/status", s.base))
            .header("authorization", value);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        assert_eq!(
            status_with(format!("{scheme} {token}")).await,
            200,
            "{scheme}"
        );
    }
    for value in [
        format!("Basic {token}"),
        token.to_owned(),
        format!("Bearer{token}"),
    ] {
        assert_eq!(status_with(value.clone()).await, 401, "{value}");
    }
    s.stop().await;
}
