//! A PostgreSQL outage, made by a TCP proxy the test controls between a real
//! `settled` process and the (never stopped) shared server: during the cut
//! every request that needs the database answers 503 `backend_unavailable`
//! quickly and without internals, `/readyz` says not ready, `/healthz` stays
//! alive; after it the service recovers by itself and nothing acknowledged
//! is lost.
//!
//! Runs when `SETTLED_TEST_POSTGRES_URL` names a PostgreSQL server; prints
//! SKIPPED and passes otherwise.

use crate::common;
use crate::common::process::{Launch, Server};
use crate::common::rng::now_ms;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Each request during the outage must be answered within this.
const ANSWER_BOUND: Duration = Duration::from_secs(5);
/// After the cut is lifted, `/readyz` must say ready within this.
const RECOVERY_BOUND: Duration = Duration::from_secs(15);

mod api;
mod proxy;

use api::*;
use proxy::*;

/// One outage in `mode`: the live state in `ids` must come through it; the
/// claims in `leased` (live 60 s leases) are committed once it is over.
async fn outage(
    api: &Api,
    proxy: &Proxy,
    mode: Mode,
    ids: &[&str],
    leased: &Value,
    secrets: &[String],
) -> (Duration, Duration) {
    let label = format!("{mode:?}").to_lowercase();
    let before = api.snapshot(ids).await;
    // Nothing is due, so this long poll is waiting when the cut comes.
    let poll = {
        let api = Api {
            client: api.client.clone(),
            base: api.base.clone(),
        };
        tokio::spawn(async move {
            let answer = api
                .post(
                    "/v1/claims",
                    &json!({"worker_id": "poller", "lease_ms": 1000, "limit": 4, "wait_ms": 20_000}),
                )
                .await;
            (answer, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let cut = Instant::now();
    proxy.set(mode);
    let to_unready = api.until_ready_is(503, ANSWER_BOUND).await;

    let mut took = Vec::new();
    let missing = format!("{label}-lost");
    let mut check = |what: &str, answer: Answer| {
        took.push(format!("{what} {} ms", answer.took.as_millis()));
        assert_unavailable(what, &answer, secrets);
    };
    check(
        "enqueue",
        api.post(
            "/v1/receipts",
            &json!({"receipt_id": missing, "finalized_at": 1_764_460_800}),
        )
        .await,
    );
    check(
        "batch enqueue",
        api.post(
            "/v1/receipts/batch",
            &json!({"receipts": [{"receipt_id": format!("{missing}-b"), "finalized_at": 1_764_460_800}]}),
        )
        .await,
    );
    check(
        "claim",
        api.post(
            "/v1/claims",
            &json!({"worker_id": "w", "lease_ms": 1000, "limit": 8}),
        )
        .await,
    );
    check(
        "long-poll claim",
        api.post(
            "/v1/claims",
            &json!({"worker_id": "w", "lease_ms": 1000, "limit": 8, "wait_ms": 3000}),
        )
        .await,
    );
    check(
        "claim by id",
        api.post(
            &format!("/v1/receipts/{}/claim", ids[0]),
            &json!({"worker_id": "w", "lease_ms": 1000}),
        )
        .await,
    );
    check(
        "outcome",
        api.commit(leased, accepted("tx-during-outage")).await,
    );
    check(
        "batch outcome",
        api.post(
            "/v1/outcomes",
            &json!({"outcomes": [{"claim": leased, "outcome": accepted("tx-during-outage")}]}),
        )
        .await,
    );
    check("status", api.get("/v1/status").await);
    check(
        "receipt",
        api.get(&format!("/v1/receipts/{}", ids[0])).await,
    );
    check("dead letters", api.get("/v1/dead-letters").await);
    check("readyz", api.get("/readyz").await);
    let health = api.get("/healthz").await;
    assert_eq!(health.status, 200, "/healthz during the outage");
    let info = api.get("/v1/info").await;
    assert_eq!(info.status, 200, "/v1/info needs no database");

    // The long poll that was waiting when the cut came does not hang.
    let (answer, returned) = tokio::time::timeout(Duration::from_secs(25), poll)
        .await
        .expect("a long poll waiting across the outage returned")
        .expect("poll task");
    let poll_after_cut = returned.saturating_duration_since(cut);
    match answer.status {
        503 => assert_unavailable("waiting long poll", &answer, secrets),
        200 => assert_eq!(answer.body["claims"], json!([]), "{}", answer.text),
        other => panic!("waiting long poll answered {other}: {}", answer.text),
    }

    proxy.set(Mode::Open);
    let to_ready = api.until_ready_is(200, RECOVERY_BOUND).await;
    println!(
        "pg_outage [{label}]: /readyz 503 {} ms after the cut; answers during the cut: {}; \
         a long poll waiting across the cut answered {} {} ms after it; ready again {} ms after \
         the restore",
        to_unready.as_millis(),
        took.join(", "),
        answer.status,
        poll_after_cut.as_millis(),
        to_ready.as_millis()
    );

    // Everything acknowledged before the cut is as it was; nothing refused
    // during it was half done.
    assert_eq!(
        api.snapshot(ids).await,
        before,
        "state after the {label} outage"
    );
    for id in [missing.clone(), format!("{missing}-b")] {
        let answer = api.get(&format!("/v1/receipts/{id}")).await;
        assert_eq!(answer.status, 404, "{id}: {}", answer.text);
    }
    // The claim taken before the outage is still good; the 503 commits
    // during it changed nothing.
    let route = Api::ok(
        &api.commit(leased, accepted(&format!("tx-{label}-after")))
            .await,
        200,
        "commit of a lease taken before the outage",
    );
    assert_eq!(route, json!({"kind": "no_action"}));
    // New work flows: enqueue, long-poll claim, settle.
    let fresh = format!("{label}-new");
    api.enqueue(&fresh, None).await;
    let claims = Api::ok(
        &api.post(
            "/v1/claims",
            &json!({"worker_id": "after", "lease_ms": 30_000, "limit": 8, "wait_ms": 5000}),
        )
        .await,
        200,
        "claim after the outage",
    );
    assert_eq!(
        claims["claims"].as_array().map(Vec::len),
        Some(1),
        "{claims}"
    );
    assert_eq!(claims["claims"][0]["receipt_id"], fresh.as_str());
    let route = Api::ok(
        &api.commit(&claims["claims"][0], accepted("tx-new")).await,
        200,
        "settle new work",
    );
    assert_eq!(route, json!({"kind": "no_action"}));
    let view = Api::ok(
        &api.get(&format!("/v1/receipts/{fresh}")).await,
        200,
        &fresh,
    );
    assert_eq!(view["state"], "settled");
    (to_unready, to_ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_answers_503_during_an_outage_and_recovers_by_itself() {
    let _turn = crate::turn(module_path!());
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let mut proxied = reqwest::Url::parse(&url).expect("postgres URL");
    let upstream = format!(
        "{}:{}",
        proxied.host_str().expect("host"),
        proxied.port().unwrap_or(5432)
    );
    let proxy = Proxy::start(upstream.clone()).await;
    proxied.set_host(Some("127.0.0.1")).expect("host");
    proxied.set_port(Some(proxy.addr.port())).expect("port");
    let dir = tempfile::tempdir().expect("temp dir");
    let settled = start_settled(
        dir.path(),
        &[
            "--database-url",
            proxied.as_str(),
            "--pg-connect-timeout-ms",
            "1000",
            "--pg-statement-timeout-ms",
            "2000",
            "--pg-max-connections",
            "4",
            // Retries stay scheduled for the whole test: nothing comes due by itself.
            "--initial-backoff-ms",
            "3600000",
            "--backoff-cap-ms",
            "3600000",
        ],
    )
    .await;
    let api = Api {
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(40))
            .build()
            .expect("client"),
        base: settled.base.clone(),
    };
    let db_name = proxied.path().trim_start_matches('/').to_owned();
    let secrets: Vec<String> = [
        upstream.clone(),
        proxy.addr.to_string(),
        format!(":{}", proxy.addr.port()),
        "5432".to_owned(),
        db_name,
        "select".into(),
        "insert".into(),
        "update ".into(),
        "sqlx".into(),
        "pool".into(),
        "tcp".into(),
        "connection".into(),
        "postgres".into(),
    ]
    .into();

    // Work in every state: settled, dead-lettered, retry scheduled, leased,
    // pending (not yet visible).
    let later = now_ms() + 3_600_000;
    for id in ["s-1", "s-2", "s-3", "d-1", "t-1", "l-1", "l-2"] {
        api.enqueue(id, None).await;
    }
    for id in ["p-1", "p-2"] {
        api.enqueue(id, Some(later)).await;
    }
    for id in ["s-1", "s-2", "s-3"] {
        assert_eq!(
            api.settle(id, accepted(&format!("tx-{id}"))).await,
            json!({"kind": "no_action"})
        );
    }
    let route = api
        .settle(
            "d-1",
            json!({"kind": "permanent", "code": "invalid_receipt_signature", "detail": "bad"}),
        )
        .await;
    assert_eq!(route["kind"], "dead_lettered");
    let route = api
        .settle(
            "t-1",
            json!({"kind": "retryable", "code": "rpc", "detail": "timeout"}),
        )
        .await;
    assert_eq!(route["kind"], "retry_scheduled");
    let leased = [
        api.claim("l-1", 60_000).await,
        api.claim("l-2", 60_000).await,
    ];
    let ids = ["s-1", "s-2", "s-3", "d-1", "t-1", "p-1", "p-2"];
    let snapshot = api.snapshot(&ids).await;
    assert_eq!(snapshot["s-1"]["state"], "settled");
    assert_eq!(snapshot["d-1"]["state"], "dead_lettered");
    assert_eq!(snapshot["t-1"]["state"], "retry_scheduled");
    assert_eq!(snapshot["p-1"]["state"], "pending");

    // The server went away: connections reset, new ones refused.
    let (refused_503, refused_back) =
        outage(&api, &proxy, Mode::Refuse, &ids, &leased[0], &secrets).await;
    // The network went silent: connections closed, new ones never answered.
    let (held_503, held_back) = outage(&api, &proxy, Mode::Hold, &ids, &leased[1], &secrets).await;

    let logs = settled.log_text();
    assert!(
        logs.contains("backend failure"),
        "the internals of a 503 go to the log"
    );
    println!(
        "pg_outage: time to 503 after the cut {} ms (refused) / {} ms (held); time to recover \
         after the restore {} ms (refused) / {} ms (held); {} proxied connections in all",
        refused_503.as_millis(),
        held_503.as_millis(),
        refused_back.as_millis(),
        held_back.as_millis(),
        proxy.forwarded.load(Ordering::Relaxed)
    );
}

/// Sessions of this database inside a transaction, with how long each has
/// been in its current state (s).
async fn open_transactions(admin: &mut sqlx::PgConnection) -> Vec<(String, f64)> {
    open_transactions_begun_by(admin, "infinity").await
}

/// [`open_transactions`] that began by `when` (a timestamp, as text): the
/// other replica's own transactions (its rate counts every 2 s) begin later.
async fn open_transactions_begun_by(
    admin: &mut sqlx::PgConnection,
    when: &str,
) -> Vec<(String, f64)> {
    sqlx::query_as(
        "SELECT state, EXTRACT(EPOCH FROM now() - state_change)::float8 FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
         AND xact_start IS NOT NULL AND xact_start <= $1::timestamptz",
    )
    .bind(when)
    .fetch_all(admin)
    .await
    .expect("pg_stat_activity")
}

/// A replica cut off by a silent partition in the middle of a transaction
/// must not keep that transaction (and its row locks, which hide receipts
/// from every other replica) open on the server: the server ends it after
/// the statement timeout. The cut-off request itself is answered 503 once
/// the store's own bound (statement timeout + 2 × connect timeout) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_mid_transaction_does_not_hold_locks_on_the_others() {
    let _turn = crate::turn(module_path!());
    use sqlx::Connection;
    let Some(url) = common::fresh_postgres_url().await else {
        return;
    };
    let mut proxied = reqwest::Url::parse(&url).expect("postgres URL");
    let upstream = format!(
        "{}:{}",
        proxied.host_str().expect("host"),
        proxied.port().unwrap_or(5432)
    );
    let proxy = Proxy::start(upstream).await;
    proxied.set_host(Some("127.0.0.1")).expect("host");
    proxied.set_port(Some(proxy.addr.port())).expect("port");
    let dir = tempfile::tempdir().expect("temp dir");
    let flags = [
        "--pg-connect-timeout-ms",
        "1000",
        "--pg-statement-timeout-ms",
        "2000",
        "--pg-max-connections",
        "4",
    ];
    let through_proxy = [&["--database-url", proxied.as_str()][..], &flags].concat();
    let direct = [&["--database-url", url.as_str()][..], &flags].concat();
    let a = start_settled(dir.path(), &through_proxy).await;
    let b = start_settled(dir.path(), &direct).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let (api_a, api_b) = (
        Api {
            client: client.clone(),
            base: a.base.clone(),
        },
        Api {
            client,
            base: b.base.clone(),
        },
    );
    let mut admin = sqlx::PgConnection::connect(&url)
        .await
        .expect("admin connection");

    // A large batch enqueue on A: one transaction of 1024 inserts, in id order.
    let receipts: Vec<Value> = (0..1024)
        .map(|i| json!({"receipt_id": format!("x-{i:04}"), "finalized_at": 1_764_460_800}))
        .collect();
    let batch = tokio::spawn(async move {
        api_a
            .post("/v1/receipts/batch", &json!({"receipts": receipts}))
            .await
    });
    // Cut A off as soon as its transaction is open on the server.
    let watching = Instant::now();
    while open_transactions(&mut admin).await.is_empty() {
        assert!(
            watching.elapsed() < Duration::from_secs(10) && !batch.is_finished(),
            "did not catch the enqueue transaction open"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let cut = Instant::now();
    proxy.set(Mode::Stall);
    let cut_at: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(&mut admin)
        .await
        .expect("server time");

    // Well past the statement timeout, the server has ended A's transaction,
    // and B can enqueue a receipt whose row A had inserted but not committed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let open = open_transactions_begun_by(&mut admin, &cut_at).await;
    let blocked = api_b
        .post(
            "/v1/receipts",
            &json!({"receipt_id": "x-0000", "finalized_at": 1_764_460_800}),
        )
        .await;
    println!(
        "pg_outage [stall]: {:.1} s into a silent partition of replica A, open transactions on \
         the server {open:?}; replica B enqueueing a receipt A had inserted: {} in {} ms",
        cut.elapsed().as_secs_f64(),
        blocked.status,
        blocked.took.as_millis()
    );
    assert!(
        open.is_empty(),
        "the cut-off replica's transaction is still open on the server: {open:?}"
    );
    assert!(
        matches!(blocked.status, 200 | 201),
        "replica B is blocked by the cut-off replica's locks: {} {}",
        blocked.status,
        blocked.text
    );

    // A's own request, its statement in flight, ends with the store's bound
    // (2000 + 2 × 1000 ms here), well before the 30 s request timeout.
    let answer = tokio::time::timeout(Duration::from_secs(40), batch)
        .await
        .expect("the cut-off request is answered")
        .expect("batch task");
    let answered = cut.elapsed();
    assert_eq!(answer.status, 503, "{}", answer.text);
    assert_eq!(answer.body["code"], "backend_unavailable");
    assert!(
        answered < Duration::from_secs(10),
        "answered after {answered:?}"
    );
    proxy.set(Mode::Open);
    let api_a = Api {
        client: reqwest::Client::new(),
        base: a.base.clone(),
    };
    let recovered = api_a.until_ready_is(200, RECOVERY_BOUND).await;
    let retried = api_a
        .post(
            "/v1/receipts",
            &json!({"receipt_id": "x-0001", "finalized_at": 1_764_460_800}),
        )
        .await;
    assert!(matches!(retried.status, 200 | 201), "{}", retried.text);
    println!(
        "pg_outage [stall]: the request cut off mid-statement answered 503 after {} ms (the \
         store bound: statement + 2 x connect timeout); A ready {} ms after the partition healed",
        answered.as_millis(),
        recovered.as_millis()
    );
}
