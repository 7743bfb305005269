//! A primary that goes silent (its packets dropped: no reset, no refusal)
//! behind a multi-host URL while its standby is promoted: settled gives up
//! on it after about `--pg-tcp-timeout-ms` instead of waiting on the
//! kernel's retransmissions for many minutes, and commits on the standby.

use super::net::Blackhole;
use super::pair::Pair;
use super::*;

const TCP_TIMEOUT_MS: u64 = 2_000;
/// On top of the TCP timeout: the next host's connect, the promotion, and
/// a loaded machine.
const RECOVERY_SLACK: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_primary_is_noticed_within_the_tcp_timeout() {
    let _turn = crate::turn(module_path!());
    if !may_run("silent_primary_is_noticed_within_the_tcp_timeout", true) {
        return;
    }
    let pair = Pair::start().await;
    let (a, b) = (pair.primary.addr(), pair.standby.addr());
    let url = format!("postgres://postgres@{a},{b}/postgres?target_session_attrs=read-write");
    let dir = tempfile::tempdir().expect("temp dir");
    let timeout = TCP_TIMEOUT_MS.to_string();
    let args = ["--pg-tcp-timeout-ms", &timeout, "--pg-max-connections", "4"];
    let replicas = start_replicas(dir.path(), 1, &url, &args).await;
    let _witness = Witness::of(&[("R", &replicas[0])]);
    let api = Api::new("R", &replicas[0]);

    let info = api.info().await;
    let database = database_of(&info);
    assert_eq!(database["primary"], a.as_str(), "the first host: {info}");
    assert_eq!(database["hosts"], json!([a, b]), "{info}");
    assert_eq!(database["writable"], true, "{info}");
    assert_eq!(database["failovers"], 0, "{info}");

    // Traffic flows, and leaves work in several states behind.
    for id in ["s-1", "l-1", "q-1", "q-2", "q-3"] {
        api.enqueue(id, None).await;
    }
    api.settle("s-1").await;
    let held = api.claim("l-1", 120_000).await;
    let ids = ["s-1", "l-1", "q-1", "q-2", "q-3"];
    let before = api.snapshot(&ids).await;

    let silenced = Instant::now();
    let _blackhole = Blackhole::port(pair.primary.port);
    pair.promote_standby().await;
    let promoted = silenced.elapsed();
    let bound = Duration::from_millis(TCP_TIMEOUT_MS) + RECOVERY_SLACK;
    let recovered = api
        .until_enqueued("after-silence", None, silenced, bound)
        .await;

    // The commit is on the standby: nothing can have reached the silent one.
    assert_eq!(
        pair.standby.receipts_among(&["after-silence"]).await,
        1,
        "the first enqueue that succeeded after the silence is on {b}"
    );
    let info = api.info().await;
    let database = database_of(&info);
    assert_eq!(database["primary"], b.as_str(), "the promoted host: {info}");
    assert_eq!(database["writable"], true, "{info}");
    assert!(
        database["failovers"].as_u64().is_some_and(|n| n >= 1),
        "the failover is counted: {info}"
    );
    assert_eq!(api.snapshot(&ids).await, before, "state after the failover");
    let answer = api.commit(&held, "tx-l-1").await;
    let route = api.ok(&answer, 200, "commit of a lease taken before the silence");
    assert_eq!(route, json!({"kind": "no_action"}));
    eprintln!(
        "pg_failover [silent]: with --pg-tcp-timeout-ms {TCP_TIMEOUT_MS}, an enqueue committed \
         on the standby {} ms after the primary went silent (the standby was promoted {} ms \
         after it)",
        recovered.as_millis(),
        promoted.as_millis()
    );
}
