//! A primary demoted in place (it stays up, read-only, its sessions open)
//! behind one address that then moves to the promoted standby: two replicas
//! say within seconds that they cannot write, refuse writes with a 503 a
//! client can retry, and find the new primary through the same URL with no
//! restart, having lost nothing acknowledged; long polls are woken across
//! replicas again, by notifications on the new primary.

use super::pair::Pair;
use super::proxy::Proxy;
use super::*;

/// Both replicas must say they cannot write within this of the demotion.
const NOTICE_BOUND: Duration = Duration::from_secs(8);
/// Both replicas must commit within this of the address moving.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);
/// Long polls woken by a notification answer in a few ms; one that only the
/// 250 ms fallback look finds answers ~125 ms after the enqueue on average,
/// and a replica listening on the old primary only ever gets those.
const WAKE_MEDIAN_BOUND: Duration = Duration::from_millis(100);
const WAKE_ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demoted_writer_is_left_within_seconds_and_long_polls_wake_again() {
    let _turn = crate::turn(module_path!());
    if !may_run(
        "demoted_writer_is_left_within_seconds_and_long_polls_wake_again",
        false,
    ) {
        return;
    }
    let pair = Pair::start().await;
    let proxy = Proxy::start(pair.primary.addr()).await;
    let url = format!("postgres://postgres@{}/postgres", proxy.addr);
    let dir = tempfile::tempdir().expect("temp dir");
    let args = ["--pg-tcp-timeout-ms", "3000", "--pg-max-connections", "4"];
    let replicas = start_replicas(dir.path(), 2, &url, &args).await;
    let _witness = Witness::of(&[("R1", &replicas[0]), ("R2", &replicas[1])]);
    let (r1, r2) = (Api::new("R1", &replicas[0]), Api::new("R2", &replicas[1]));

    let proxied = proxy.addr.to_string();
    for api in [&r1, &r2] {
        let info = api.info().await;
        let database = database_of(&info);
        assert_eq!(
            database["primary"],
            proxied.as_str(),
            "{}: {info}",
            api.name
        );
        assert_eq!(database["hosts"], json!([proxied]), "{}: {info}", api.name);
        assert_eq!(database["writable"], true, "{}: {info}", api.name);
        assert_eq!(database["failovers"], 0, "{}: {info}", api.name);
    }

    // Work acknowledged before the fault, in several states: settled by
    // either replica, leased (for longer than the test runs, so that its
    // commit after the failover must be accepted), pending and not yet due
    // (so that the long polls below find nothing until woken).
    let later = now_ms() + 3_600_000;
    r1.enqueue("s-1", None).await;
    r2.enqueue("s-2", None).await;
    r1.enqueue("l-1", None).await;
    r2.enqueue("p-1", Some(later)).await;
    r1.settle("s-1").await;
    r2.settle("s-2").await;
    let held = r2.claim("l-1", 120_000).await;
    let ids = ["s-1", "s-2", "l-1", "p-1"];
    let before = r1.snapshot(&ids).await;

    // A long poll waiting on R1 when the fault comes must still be answered.
    let waiting = {
        let r1 = r1.clone();
        tokio::spawn(async move {
            let request =
                json!({"worker_id": "waiter", "lease_ms": 60_000, "limit": 1, "wait_ms": 10_000});
            r1.post("/v1/claims", &request).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    let demoted = Instant::now();
    pair.demote_primary().await;
    let (seen_by_r1, seen_by_r2) = tokio::join!(
        r1.until_ready_is(503, demoted, NOTICE_BOUND),
        r2.until_ready_is(503, demoted, NOTICE_BOUND)
    );
    let mut refused_in = Vec::new();
    for (api, (_, readyz)) in [(&r1, &seen_by_r1), (&r2, &seen_by_r2)] {
        assert_eq!(
            readyz.content_type, "application/problem+json",
            "{}",
            api.name
        );
        let detail = readyz.body["detail"].as_str().unwrap_or_default();
        assert!(
            !detail.trim().is_empty(),
            "{}: /readyz says why it is not ready: {}",
            api.name,
            readyz.text
        );
        let id = format!("fault-{}", api.name);
        let answer = api
            .post("/v1/receipts", &Api::receipt(&id, Some(later)))
            .await;
        assert_unavailable(&api.name, "an enqueue", &answer);
        refused_in.push(answer.took);
        // An alert on the gauge must be able to fire: /metrics answers
        // while no host takes writes, and says so.
        let writable = api.metric("settled_postgres_writable").await;
        assert_eq!(
            writable,
            Some(0.0),
            "{}: settled_postgres_writable",
            api.name
        );
    }

    pair.promote_standby().await;
    proxy.switch(pair.standby.addr());
    let switched = Instant::now();
    let (back_r1, back_r2) = tokio::join!(
        r1.until_enqueued("after-R1", Some(later), switched, RECOVERY_BOUND),
        r2.until_enqueued("after-R2", Some(later), switched, RECOVERY_BOUND)
    );
    let since_demotion = demoted.elapsed();
    assert_eq!(
        pair.standby.receipts_among(&["after-R1", "after-R2"]).await,
        2,
        "the enqueues after the failover are on the new primary"
    );
    for api in [&r1, &r2] {
        api.until_ready_is(200, Instant::now(), Duration::from_secs(5))
            .await;
        let info = api.info().await;
        let database = database_of(&info);
        assert_eq!(database["writable"], true, "{}: {info}", api.name);
        assert_eq!(
            database["primary"],
            proxied.as_str(),
            "{}: {info}",
            api.name
        );
        assert!(
            database["failovers"].as_u64().is_some_and(|n| n >= 1),
            "{}: the failover is counted: {info}",
            api.name
        );
        let writable = api.metric("settled_postgres_writable").await;
        assert_eq!(
            writable,
            Some(1.0),
            "{}: settled_postgres_writable",
            api.name
        );
        let failovers = api.metric("settled_postgres_failovers_total").await;
        assert!(
            failovers.is_some_and(|n| n >= 1.0),
            "{}: settled_postgres_failovers_total {failovers:?}",
            api.name
        );
    }

    // Nothing acknowledged was lost, nothing refused was half done, and the
    // lease taken before the fault is still good.
    assert_eq!(r2.snapshot(&ids).await, before, "state after the failover");
    for api in [&r1, &r2] {
        let answer = r1.get(&format!("/v1/receipts/fault-{}", api.name)).await;
        assert_eq!(answer.status, 404, "a refused enqueue: {}", answer.text);
    }
    let answer = r1.commit(&held, "tx-l-1").await;
    let route = r1.ok(&answer, 200, "commit of a lease taken before the fault");
    assert_eq!(route, json!({"kind": "no_action"}));
    let view = r2.get("/v1/receipts/l-1").await;
    assert_eq!(r2.ok(&view, 200, "l-1")["state"], "settled");

    let waited = tokio::time::timeout(Duration::from_secs(25), waiting)
        .await
        .expect("the long poll waiting across the fault was answered")
        .expect("poll task");
    match waited.status {
        200 => assert_eq!(waited.body["claims"], json!([]), "{}", waited.text),
        _ => assert_unavailable("R1", "the long poll waiting across the fault", &waited),
    }

    let wakes = wake_rounds(&r1, &r2).await;
    let wake_median = median(&wakes);
    eprintln!(
        "pg_failover [demoted]: /readyz 503 {} ms (R1) / {} ms (R2) after the demotion; \
         enqueues refused in {refused_in:?}; an enqueue committed {} ms (R1) / {} ms (R2) after \
         the address moved ({} ms after the demotion); long polls on R1 woken {:?} ms after an \
         enqueue on R2, median {} ms",
        seen_by_r1.0.as_millis(),
        seen_by_r2.0.as_millis(),
        back_r1.as_millis(),
        back_r2.as_millis(),
        since_demotion.as_millis(),
        wakes.iter().map(Duration::as_millis).collect::<Vec<_>>(),
        wake_median.as_millis()
    );
    assert!(
        wake_median < WAKE_MEDIAN_BOUND,
        "long polls on R1 are not woken by enqueues on R2 after the failover (median \
         {wake_median:?} of {wakes:?}): R1 listens on the old primary?"
    );
}

/// Long poll on `waiter` while `producer` enqueues a due receipt; how long
/// each poll took to answer with it after the enqueue was sent.
async fn wake_rounds(waiter: &Api, producer: &Api) -> Vec<Duration> {
    let mut wakes = Vec::new();
    for round in 0..WAKE_ROUNDS {
        let poll = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let request = json!({"worker_id": "waiter", "lease_ms": 60_000, "limit": 1,
                    "wait_ms": 20_000});
                let answer = waiter.post("/v1/claims", &request).await;
                (answer, Instant::now())
            })
        };
        // Time for the poll to find nothing due and wait (not an assertion:
        // a poll that has not begun waiting answers at once, which is fast).
        tokio::time::sleep(Duration::from_millis(400)).await;
        let id = format!("wake-{round}");
        let sent = Instant::now();
        producer.enqueue(&id, None).await;
        let (answer, returned) = tokio::time::timeout(Duration::from_secs(25), poll)
            .await
            .expect("the long poll answered within its wait")
            .expect("poll task");
        let body = waiter.ok(&answer, 200, "a long poll");
        assert_eq!(body["claims"][0]["receipt_id"], id.as_str(), "{body}");
        wakes.push(returned.saturating_duration_since(sent));
    }
    wakes
}
