//! Bulk actions over the same receipts from two real `settled` processes on
//! one PostgreSQL database: they wait for each other, never deadlock.
//!
//! Runs when `SETTLED_TEST_POSTGRES_URL` names a PostgreSQL server; prints
//! SKIPPED and passes otherwise.

use serde_json::{Value, json};

use crate::common;
use crate::common::process::Launch;
use crate::pg_replicas::{client, post};

/// Two bulk actions over the same 1 000 receipts, naming them in opposite
/// orders, sent at once to two replicas, 20 rounds of hold then unhold:
/// every answer is 200 and complete, no replica logs a deadlock, and each
/// receipt's history holds exactly one hold and one unhold per round, in
/// turn. (Rows locked one by one in the order given deadlocked here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_in_opposite_orders_on_two_replicas_never_deadlock() {
    let _turn = crate::turn(module_path!());
    const ROUNDS: usize = 20;
    const COUNT: usize = 1_000;
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--database-url", url.as_str(), "--pg-max-connections", "6"];
    let starting: Vec<_> = (0..2)
        .map(|_| Launch::new(dir.path()).args(&args).spawn())
        .collect();
    let mut replicas = Vec::new();
    for replica in starting {
        replicas.push(replica.ready_async().await);
    }
    let (a, b) = (replicas[0].base.clone(), replicas[1].base.clone());
    let client = client();
    let ids: Vec<String> = (0..COUNT).map(|i| format!("bulk-{i:04}")).collect();
    for part in ids.chunks(500) {
        let items: Vec<Value> = part
            .iter()
            .map(|id| json!({"receipt_id": id, "finalized_at": 1_764_460_800}))
            .collect();
        let (status, body) = post(
            &client,
            &format!("{a}/v1/receipts/batch"),
            &json!({"receipts": items}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let forward = json!({"receipt_ids": ids});
    let backward = json!({"receipt_ids": ids.iter().rev().collect::<Vec<_>>()});
    for round in 0..ROUNDS {
        for action in ["hold", "unhold"] {
            let (to_a, to_b) = (
                format!("{a}/v1/bulk/{action}"),
                format!("{b}/v1/bulk/{action}"),
            );
            let one = post(&client, &to_a, &forward);
            let other = post(&client, &to_b, &backward);
            let ((s1, b1), (s2, b2)) = tokio::join!(one, other);
            // The bodies without their 1 000 results, to read when it fails.
            let brief = |b: &Value| {
                json!([
                    b["done"],
                    b["unchanged"],
                    b["refused"],
                    b["complete"],
                    b["stopped"],
                    b["code"]
                ])
            };
            assert_eq!(
                (s1, s2),
                (200, 200),
                "round {round} {action}: {} {}",
                brief(&b1),
                brief(&b2)
            );
            for body in [&b1, &b2] {
                assert_eq!(
                    body["complete"],
                    true,
                    "round {round} {action}: {}",
                    brief(body)
                );
                assert_eq!(
                    body["refused"],
                    0,
                    "round {round} {action}: {}",
                    brief(body)
                );
            }
            let done = b1["done"].as_u64().unwrap() + b2["done"].as_u64().unwrap();
            assert_eq!(
                done, COUNT as u64,
                "round {round} {action}: each receipt changed once"
            );
        }
    }
    for replica in &replicas {
        let log = replica.log_text();
        assert!(
            !log.contains("deadlock"),
            "a replica logged a deadlock: {log}"
        );
    }
    let mut conn = common::pg_raw(&url).await.expect("connect");
    let wrong: Vec<(String, i64)> = sqlx::query_as(
        "SELECT receipt_id, count(*) FROM receipt_history WHERE outcome IN ('hold', 'unhold') \
         GROUP BY receipt_id HAVING count(*) FILTER (WHERE outcome = 'hold') <> $1 \
         OR count(*) FILTER (WHERE outcome = 'unhold') <> $1",
    )
    .bind(i64::try_from(ROUNDS).unwrap())
    .fetch_all(&mut conn)
    .await
    .expect("history counts");
    assert!(
        wrong.is_empty(),
        "receipts not held and unheld once per round: {wrong:?}"
    );
    // In turn: in commit order, no receipt is held (or unheld) twice running.
    let repeated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT outcome, lag(outcome) OVER (PARTITION BY receipt_id \
         ORDER BY id) AS before FROM receipt_history) AS h WHERE outcome = before",
    )
    .fetch_one(&mut conn)
    .await
    .expect("history order");
    assert_eq!(
        repeated, 0,
        "holds and unholds alternate in every receipt's history"
    );
    println!(
        "pg_replicas: {ROUNDS} rounds of opposite-order bulk hold and unhold of {COUNT} receipts on two replicas: no deadlock"
    );
}
