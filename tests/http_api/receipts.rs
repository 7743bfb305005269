use reqwest::Method;
use serde_json::json;

use crate::common::Fresh;
use crate::common::http::{spawn, urlencode};

async fn enqueue_answers_201_then_200_then_409(fresh: Fresh) {
    let s = spawn(fresh).await;
    let body = json!({"receipt_id": "r-1", "finalized_at": 1764460800, "observation": {"amount": 5, "to": "x"}});
    let created = s.post("/v1/receipts", body.clone()).await;
    let view = created.ok(201);
    assert_eq!(view["state"], "pending");
    assert_eq!(view["attempts"], 0);
    assert_eq!(view["row_version"], 0);
    assert_eq!(view["observation"], json!({"amount": 5, "to": "x"}));
    assert_eq!(view["history"], json!([]));
    // Same identity, keys in another order, different visible_at_ms: identical.
    let again = json!({"receipt_id": "r-1", "finalized_at": 1764460800,
        "observation": {"to": "x", "amount": 5}, "visible_at_ms": 5});
    s.post("/v1/receipts", again).await.ok(200);
    let other = json!({"receipt_id": "r-1", "finalized_at": 1764460801, "observation": {"amount": 5, "to": "x"}});
    s.post("/v1/receipts", other)
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    let other = json!({"receipt_id": "r-1", "finalized_at": 1764460800});
    s.post("/v1/receipts", other)
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    assert_eq!(
        s.receipt("r-1").await["observation"],
        json!({"amount": 5, "to": "x"})
    );
    s.stop().await;
}

async fn absent_and_null_observation_are_the_same_receipt(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "r", "finalized_at": 1}),
    )
    .await
    .ok(201);
    s.post(
        "/v1/receipts",
        json!({"receipt_id": "r", "finalized_at": 1, "observation": null}),
    )
    .await
    .ok(200);
    s.stop().await;
}

async fn enqueue_does_not_resurrect_finished_work(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("done").await;
    let claim = s.claim("w", 1).await.remove(0);
    s.outcome(&claim, json!({"kind": "accepted", "transcript_id": "tx"}))
        .await
        .ok(200);
    let again = s
        .post(
            "/v1/receipts",
            json!({"receipt_id": "done", "finalized_at": 100}),
        )
        .await;
    assert_eq!(again.ok(200)["state"], "settled");
    assert!(s.claim("w", 1).await.is_empty());
    s.stop().await;
}

async fn enqueue_refuses_every_bad_field(fresh: Fresh) {
    let s = spawn(fresh).await;
    let big = "x".repeat(64 * 1024);
    let cases = [
        (
            json!({"receipt_id": "", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "r".repeat(513), "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "\u{e9}".repeat(257), "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "a\u{0}b", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "a\nb", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "..", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": ".", "finalized_at": 1}),
            "invalid_receipt_id",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": -1}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": "1"}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1.5}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 9_223_372_036_854_775_808u64}),
            "invalid_finalized_at",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 18_446_744_073_709_551_615u64}),
            "invalid_finalized_at",
        ),
        (json!({"receipt_id": "r"}), "invalid_body"),
        (json!({"finalized_at": 1}), "invalid_body"),
        (json!({"receipt_id": 7, "finalized_at": 1}), "invalid_body"),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "observation": [1]}),
            "invalid_observation",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "observation": "text"}),
            "invalid_observation",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "observation": {"blob": big}}),
            "observation_too_large",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "visible_at_ms": -5}),
            "invalid_body",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "visible_at_ms": 9_223_372_036_854_775_808u64}),
            "invalid_visible_at_ms",
        ),
        (
            json!({"receipt_id": "r", "finalized_at": 1, "extra": true}),
            "invalid_body",
        ),
        (json!([]), "invalid_body"),
    ];
    for (body, code) in cases {
        s.post("/v1/receipts", body.clone())
            .await
            .assert_problem(422, code, "validation");
    }
    // Nothing was stored by any of them.
    let status = s.get("/v1/status").await;
    assert_eq!(status.ok(200)["counts"]["pending"], 0);
    s.stop().await;
}

async fn receipt_ids_with_slashes_dots_and_unicode_round_trip(fresh: Fresh) {
    let s = spawn(fresh).await;
    for id in [
        "a/b",
        "%2F",
        "a/../b",
        "...",
        "é/ü 漢字",
        &"r".repeat(512),
        &"\u{e9}".repeat(256),
    ] {
        s.post("/v1/receipts", json!({"receipt_id": id, "finalized_at": 1}))
            .await
            .ok(201);
        assert_eq!(s.receipt(id).await["receipt_id"], id);
    }
    s.stop().await;
}

async fn get_receipt_answers_404_and_never_shows_the_token(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.get("/v1/receipts/nope")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.enqueue("r").await;
    let claim = s.claim("w", 1).await.remove(0);
    let token = claim["lease_token"].as_str().unwrap().to_owned();
    let view = s.receipt("r").await;
    assert_eq!(view["state"], "leased");
    assert_eq!(
        view["lease"],
        json!({"owner": "w", "until_ms": claim["lease_until_ms"]})
    );
    assert!(!view.to_string().contains(&token));
    let long = urlencode(&"r".repeat(513));
    s.get(&format!("/v1/receipts/{long}")).await.assert_problem(
        422,
        "invalid_receipt_id",
        "validation",
    );
    s.stop().await;
}

async fn batch_enqueue_judges_each_item(fresh: Fresh) {
    let s = spawn(fresh).await;
    s.enqueue("known").await;
    let body = json!({"receipts": [
        {"receipt_id": "new", "finalized_at": 100},
        {"receipt_id": "known", "finalized_at": 100},
        {"receipt_id": "known", "finalized_at": 999},
        {"receipt_id": "", "finalized_at": 1},
        {"receipt_id": "typed", "finalized_at": "x"},
        "not an object",
        {"receipt_id": "new", "finalized_at": 100},
    ]});
    let answer = s.post("/v1/receipts/batch", body).await;
    let results = answer.ok(200)["results"].as_array().unwrap().clone();
    let statuses: Vec<_> = results
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [
            "created", "existing", "conflict", "invalid", "invalid", "invalid", "existing"
        ]
    );
    assert_eq!(results[2]["error"]["code"], "receipt_conflict");
    assert_eq!(results[3]["error"]["code"], "invalid_receipt_id");
    assert_eq!(results[4]["receipt_id"], "typed");
    assert_eq!(results[4]["error"]["class"], "validation");
    assert!(results[5]["receipt_id"].is_null());
    assert!(results[0].get("error").is_none());
    assert_eq!(s.receipt("new").await["state"], "pending");
    s.get("/v1/receipts/typed")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.stop().await;
}

async fn batch_enqueue_refuses_malformed_batches(fresh: Fresh) {
    let s = spawn(fresh).await;
    let many: Vec<_> = (0..1025)
        .map(|i| json!({"receipt_id": format!("r{i}"), "finalized_at": 1}))
        .collect();
    s.post("/v1/receipts/batch", json!({"receipts": []}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/receipts/batch", json!({"receipts": many}))
        .await
        .assert_problem(422, "batch_size", "validation");
    s.post("/v1/receipts/batch", json!({"receipts": {}}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    s.post("/v1/receipts/batch", json!({}))
        .await
        .assert_problem(422, "invalid_body", "validation");
    let full: Vec<_> = (0..1024)
        .map(|i| json!({"receipt_id": format!("r{i}"), "finalized_at": 1}))
        .collect();
    let answer = s
        .post("/v1/receipts/batch", json!({"receipts": full}))
        .await;
    assert_eq!(answer.ok(200)["results"].as_array().unwrap().len(), 1024);
    assert_eq!(s.get("/v1/status").await.body["counts"]["pending"], 1024);
    s.stop().await;
}

async fn enqueue_refuses_wrong_media_and_broken_json(fresh: Fresh) {
    let s = spawn(fresh).await;
    let body = br#"{"receipt_id":"r","finalized_at":1}"#.to_vec();
    s.raw(Method::POST, "/v1/receipts", None, body.clone())
        .await
        .assert_problem(415, "unsupported_media_type", "validation");
    s.raw(Method::POST, "/v1/receipts", Some("text/plain"), body)
        .await
        .assert_problem(415, "unsupported_media_type", "validation");
    s.raw(
        Method::POST,
        "/v1/receipts",
        Some("application/json"),
        b"{\"receipt_id\":".to_vec(),
    )
    .await
    .assert_problem(400, "malformed_json", "validation");
    s.get("/v1/receipts/r")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.stop().await;
}

/// The raw text of a JSON answer's `observation`, as the server wrote it.
async fn observation_text(s: &crate::common::http::TestServer, path: &str) -> String {
    let text = s.get_text(path).await;
    let at = text.find("\"observation\":").expect("an observation") + "\"observation\":".len();
    // Observations here have no strings holding braces, so brace counting finds the end.
    let mut depth = 0;
    for (i, c) in text[at..].char_indices() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth -= 1;
                if depth == 0 {
                    return text[at..=at + i].to_owned();
                }
            }
            _ => {}
        }
    }
    panic!("unterminated observation in {text}")
}

/// Numbers in an observation are kept as the text sent: big integers, long
/// decimals and exponent forms come back byte for byte (in the receipt, the
/// claim and the batch path), the identical enqueue again is 200, and the
/// same amount written differently is different content (409).
async fn observation_numbers_are_kept_exactly_as_sent(fresh: Fresh) {
    let s = spawn(fresh).await;
    // (sent, kept): digits are kept as sent; only an exponent is written
    // as `e` with its sign (serde_json's arbitrary-precision form).
    let numbers = [
        ("123456789012345678901", "123456789012345678901"),
        (
            "-98765432109876543210987654321",
            "-98765432109876543210987654321",
        ),
        ("2.29940720536497944515e-01", "2.29940720536497944515e-01"),
        (
            "0.1000000000000000055511151231257827",
            "0.1000000000000000055511151231257827",
        ),
        ("1e400", "1e+400"),
        ("-1E-400", "-1e-400"),
        ("12.50", "12.50"),
        ("-0", "-0"),
    ];
    let sent: Vec<&str> = numbers.iter().map(|(sent, _)| *sent).collect();
    let kept: Vec<&str> = numbers.iter().map(|(_, kept)| *kept).collect();
    let fields: Vec<String> = sent
        .iter()
        .enumerate()
        .map(|(i, n)| format!("\"n{i}\":{n}"))
        .collect();
    let observation = format!("{{{},\"list\":[{}]}}", fields.join(","), sent.join(","));
    let body = |id: &str, observation: &str| {
        format!(r#"{{"receipt_id":"{id}","finalized_at":1,"observation":{observation}}}"#)
            .into_bytes()
    };
    let post = |bytes: Vec<u8>| {
        s.raw(
            Method::POST,
            "/v1/receipts",
            Some("application/json"),
            bytes,
        )
    };
    post(body("exact", &observation)).await.ok(201);
    let stored = observation_text(&s, "/v1/receipts/exact").await;
    for (i, n) in kept.iter().enumerate() {
        assert!(stored.contains(&format!("\"n{i}\":{n}")), "{n} in {stored}");
    }
    assert!(
        stored.contains(&format!("[{}]", kept.join(","))),
        "{stored}"
    );
    // Byte-identical again: the same receipt, however often.
    for _ in 0..3 {
        post(body("exact", &observation)).await.ok(200);
    }
    // The same amount written another way is other content.
    let rewritten = observation.replace("123456789012345678901", "1.23456789012345678901e20");
    post(body("exact", &rewritten))
        .await
        .assert_problem(409, "receipt_conflict", "conflict");
    // The batch path keeps and compares the same way.
    let batch = format!(
        r#"{{"receipts":[{},{}]}}"#,
        String::from_utf8(body("exact", &observation)).unwrap(),
        String::from_utf8(body("exact-batch", &observation)).unwrap()
    );
    let answer = s
        .raw(
            Method::POST,
            "/v1/receipts/batch",
            Some("application/json"),
            batch.into_bytes(),
        )
        .await;
    let results = &answer.ok(200)["results"];
    assert_eq!(results[0]["status"], "existing", "{results}");
    assert_eq!(results[1]["status"], "created", "{results}");
    assert_eq!(
        observation_text(&s, "/v1/receipts/exact-batch").await,
        stored
    );
    // A worker is handed the same text.
    let claim = s
        .client
        .post(format!("{}/v1/receipts/exact/claim", s.base))
        .json(&json!({"worker_id": "w", "lease_ms": 30_000}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(claim.contains(&stored), "{claim}");
    s.stop().await;
}

/// An object inside `observation` with the same key twice is refused, at any
/// depth and on both enqueue paths, and nothing is stored.
async fn duplicate_keys_inside_an_observation_are_refused(fresh: Fresh) {
    let s = spawn(fresh).await;
    let bodies = [
        r#"{"receipt_id":"d","finalized_at":1,"observation":{"a":1,"a":2}}"#,
        r#"{"receipt_id":"d","finalized_at":1,"observation":{"x":{"y":[{"k":1,"k":1}]}}}"#,
        r#"{"receipt_id":"d","finalized_at":1,"observation":{"a":1,"\u0061":1}}"#,
    ];
    for body in bodies {
        let answer = s
            .raw(
                Method::POST,
                "/v1/receipts",
                Some("application/json"),
                body.as_bytes().to_vec(),
            )
            .await;
        answer.assert_problem(422, "invalid_body", "validation");
        assert!(
            answer.body["detail"]
                .as_str()
                .unwrap()
                .contains("duplicate key"),
            "{:?}",
            answer.body
        );
        let batch = format!(r#"{{"receipts":[{body},{{"receipt_id":"ok","finalized_at":1}}]}}"#);
        let answer = s
            .raw(
                Method::POST,
                "/v1/receipts/batch",
                Some("application/json"),
                batch.into_bytes(),
            )
            .await;
        let results = &answer.ok(200)["results"];
        assert_eq!(results[0]["status"], "invalid", "{results}");
        assert_eq!(results[0]["receipt_id"], "d", "{results}");
        assert_eq!(results[0]["error"]["code"], "invalid_body", "{results}");
    }
    // A batch item with a repeated top-level field is refused too.
    let batch = r#"{"receipts":[{"receipt_id":"d","receipt_id":"e","finalized_at":1}]}"#;
    let answer = s
        .raw(
            Method::POST,
            "/v1/receipts/batch",
            Some("application/json"),
            batch.as_bytes().to_vec(),
        )
        .await;
    assert_eq!(answer.ok(200)["results"][0]["status"], "invalid");
    s.get("/v1/receipts/d")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.get("/v1/receipts/e")
        .await
        .assert_problem(404, "receipt_not_found", "not_found");
    s.stop().await;
}

crate::on_every_backend!(
    observation_numbers_are_kept_exactly_as_sent,
    duplicate_keys_inside_an_observation_are_refused,
    enqueue_answers_201_then_200_then_409,
    absent_and_null_observation_are_the_same_receipt,
    enqueue_does_not_resurrect_finished_work,
    enqueue_refuses_every_bad_field,
    receipt_ids_with_slashes_dots_and_unicode_round_trip,
    get_receipt_answers_404_and_never_shows_the_token,
    batch_enqueue_judges_each_item,
    batch_enqueue_refuses_malformed_batches,
    enqueue_refuses_wrong_media_and_broken_json,
);
