//! `--forget-idle-groups`: the running service forgets a group once it has
//! nothing active and no limits, keeps the others, and lists a forgotten
//! group again when a receipt names it. On SQLite, and on PostgreSQL when
//! `SETTLED_TEST_POSTGRES_URL` is set.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::fresh_postgres_url;
use super::launch;

async fn status_of(client: &reqwest::Client, url: String) -> u16 {
    client.get(url).send().await.unwrap().status().as_u16()
}

async fn get_json(client: &reqwest::Client, url: String) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> u16 {
    client
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn forgets_idle_groups(database: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let args = [database, &["--forget-idle-groups", "1s"]].concat();
    let server = launch(dir.path(), "127.0.0.1:0", &args);
    let base = server.base.clone();
    let client = reqwest::Client::new();
    for (id, group) in [("r-1", "m:idle"), ("r-2", "m:busy"), ("r-3", "m:capped")] {
        let receipt = json!({"receipt_id": id, "finalized_at": 1764460800, "group": group});
        assert_eq!(
            post(&client, format!("{base}/v1/receipts"), receipt).await,
            201
        );
    }
    for id in ["r-1", "r-3"] {
        let cancel = json!({"reason": "duplicate"});
        let url = format!("{base}/v1/receipts/{id}/cancel");
        assert_eq!(post(&client, url, cancel).await, 200);
    }
    let capped = client
        .put(format!("{base}/v1/groups/m:capped"))
        .json(&json!({"max_leased": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(capped.status().as_u16(), 200);
    let started = Instant::now();
    while status_of(&client, format!("{base}/v1/groups/m:idle")).await != 404 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "m:idle is still listed; log:\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A pass ran: the group with work and the one with limits stay.
    assert_eq!(
        status_of(&client, format!("{base}/v1/groups/m:busy")).await,
        200
    );
    assert_eq!(
        status_of(&client, format!("{base}/v1/groups/m:capped")).await,
        200
    );
    let listed: Value = get_json(&client, format!("{base}/v1/groups")).await;
    let names: Vec<&str> = listed["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "m:busy", "m:capped"], "{listed}");
    // The canceled receipt is still there, with its group.
    let view: Value = get_json(&client, format!("{base}/v1/receipts/r-1")).await;
    assert_eq!(view["group"], "m:idle");
    // Named again, the group is back.
    let again = json!({"receipt_id": "r-4", "finalized_at": 1764460800, "group": "m:idle"});
    assert_eq!(
        post(&client, format!("{base}/v1/receipts"), again).await,
        201
    );
    let group: Value = get_json(&client, format!("{base}/v1/groups/m:idle")).await;
    assert_eq!(group["depth"], 1, "{group}");
}

#[tokio::test]
async fn the_service_forgets_idle_groups_on_sqlite() {
    let _turn = crate::turn(module_path!());
    forgets_idle_groups(&[]).await;
}

#[tokio::test]
async fn the_service_forgets_idle_groups_on_postgres() {
    let _turn = crate::turn(module_path!());
    let Some(url) = fresh_postgres_url().await else {
        return;
    };
    forgets_idle_groups(&["--database-url", &url]).await;
}
