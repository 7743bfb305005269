//! A claim whose bounded walk of the groups falls back to a walk of every
//! group gives up the bounded walk's group locks first: every claim then
//! locks the limited groups in one order, by name, and two claims never
//! wait for each other (a deadlock fails one of them).

use std::time::Duration;

use super::test_support::{fresh_store, raw, receipt};
use crate::domain::{ClaimLimit, GroupLimits, GroupName, LeaseMs, UnixMs, WorkerId};
use crate::store::{NewReceipt, SettlementOutcomeStore};

const NOW: u64 = 1_000_000;

fn in_group(group: &str, due_later: bool) -> NewReceipt {
    let mut r = receipt(&format!("r-{group}"));
    r.group = GroupName::parse(group).expect("group");
    r.visible_at_ms = due_later.then(|| UnixMs::saturating(NOW + 3_600_000));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_walks_every_group_keeps_no_lock_of_its_bounded_walk() {
    let Some((url, store)) = fresh_store().await else {
        return;
    };
    let now = UnixMs::saturating(NOW);
    let worker = WorkerId::parse("w").expect("worker");
    let lease = LeaseMs::try_from(60_000).expect("lease");
    // `m` and `z` are limited, with receipts due; the other groups hold
    // work due later: 100 before `m`, 10 between `m` and `z`.
    let mut receipts = vec![in_group("m", false), in_group("z", false)];
    let mut second = in_group("m", false);
    second.receipt_id = crate::domain::ReceiptId::parse("r-m-2").expect("id");
    receipts.push(second);
    receipts.extend((0..100).map(|i| in_group(&format!("a{i:03}"), true)));
    receipts.extend((0..10).map(|i| in_group(&format!("n{i:03}"), true)));
    store.enqueue(&receipts, now).await.expect("enqueue");
    let limits = GroupLimits {
        max_leased: Some(10),
        ..GroupLimits::default()
    };
    for group in ["m", "z"] {
        let group = GroupName::parse(group).expect("group");
        store.set_group(&group, &limits, now).await.expect("limits");
    }
    // A claim of one takes from `m`: the next turn starts after it.
    let one = ClaimLimit::try_from(1).expect("limit");
    let first = store
        .claim_from(&worker, now, lease, one, &[])
        .await
        .expect("claim");
    assert_eq!(first.claims[0].group.as_str(), "m");
    // Another replica's claim, walking every group, holds `m` and is about
    // to lock `z`.
    let mut other = raw(&url).await;
    sqlx::raw_sql("BEGIN; SELECT name FROM receipt_groups WHERE name = 'm' FOR UPDATE")
        .execute(&mut other)
        .await
        .expect("lock m");
    // A claim of two walks `n000`..`n009`, `z` and 61 of the `a` groups (its
    // bound, short of `m`), locks `z`, finds one receipt, and walks every
    // group: it waits for `m`.
    let claim = tokio::spawn(async move {
        let limit = ClaimLimit::try_from(2).expect("limit");
        store.claim_from(&worker, now, lease, limit, &[]).await
    });
    let mut watch = raw(&url).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watch)
        .await
        .expect("activity");
        if waiting > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the claim never waited for m"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Had the claim kept its bounded walk's lock of `z`, each would now
    // wait for the other.
    let z = sqlx::raw_sql("SELECT name FROM receipt_groups WHERE name = 'z' FOR UPDATE")
        .execute(&mut other)
        .await;
    assert!(z.is_ok(), "the other claim failed: {z:?}");
    sqlx::raw_sql("COMMIT")
        .execute(&mut other)
        .await
        .expect("commit");
    let claimed = claim.await.expect("task").expect("the claim failed");
    let mut groups: Vec<&str> = claimed.claims.iter().map(|c| c.group.as_str()).collect();
    groups.sort_unstable();
    assert_eq!(groups, ["m", "z"]);
}
