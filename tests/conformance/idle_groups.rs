//! Idle groups are forgotten (docs/groups.md): a sweep deletes the rows of
//! groups with no limits set and no active receipt (waiting, not yet due,
//! leased or held), and only those; a group named again by a receipt, or
//! redriven into, is listed again. On every backend.

use settled::domain::{GroupLimits, GroupName, RetryPolicy, SettlementFailureCode};
use settled::store::{Acted, GroupQuery, NewReceipt, OperatorAction, SweptGroups};

use super::support::*;
use crate::common::Fresh;

fn in_group(id: &str, name: &str, visible: u64) -> NewReceipt {
    NewReceipt {
        group: GroupName::parse(name).expect("valid group"),
        ..receipt_with(id, FIN, None, Some(visible))
    }
}

/// Every group listed, by name, with its depth.
async fn listed(fresh: &Fresh, now: u64) -> Vec<(String, u64)> {
    let query = GroupQuery {
        limit: 100,
        after: String::new(),
        exact: false,
        depth: true,
    };
    store(fresh)
        .groups(ms(now), &query)
        .await
        .expect("groups")
        .into_iter()
        .map(|g| (g.group, g.depth.unwrap_or(0)))
        .collect()
}

/// A whole sweep in pages of `page` rows: the pages' figures in order.
async fn sweep(fresh: &Fresh, page: usize) -> Vec<SweptGroups> {
    let mut after = String::new();
    let mut pages = Vec::new();
    loop {
        let swept = store(fresh)
            .forget_idle_groups(&after, page)
            .await
            .expect("sweep");
        let next = swept.next.clone();
        pages.push(swept);
        match next {
            Some(next) => after = next,
            None => return pages,
        }
    }
}

async fn act(fresh: &Fresh, action: OperatorAction, id: &str, now: u64) {
    let done = store(fresh)
        .act(&action, &[rid(id)], Some("alice"), ms(now), false)
        .await
        .expect("act");
    assert_eq!(done, [Ok(Acted::Done)], "{action:?} {id}");
}

async fn only_idle_groups_without_limits_are_forgotten(fresh: Fresh) {
    enqueue_new(
        &fresh,
        &[
            in_group("settled-1", "m:settled", T0),
            in_group("dead-1", "m:dead", T0),
            in_group("canceled-1", "m:canceled", T0),
            in_group("waiting-1", "m:waiting", T0),
            in_group("later-1", "m:later", T0 + 3_600_000),
            in_group("leased-1", "m:leased", T0),
            in_group("held-1", "m:held", T0),
            in_group("limited-1", "m:limited", T0),
        ],
        T0,
    )
    .await;
    let done = claim(&fresh, "settled-1", "w", T0, 60_000).await;
    record(
        &fresh,
        &done.claim,
        &accepted("t"),
        RetryPolicy::default(),
        T0,
    )
    .await
    .unwrap();
    let dead = claim(&fresh, "dead-1", "w", T0, 60_000).await;
    let perm = permanent(SettlementFailureCode::Signature, "bad");
    record(&fresh, &dead.claim, &perm, RetryPolicy::default(), T0)
        .await
        .unwrap();
    let cancel = OperatorAction::Cancel {
        reason: "duplicate".into(),
    };
    act(&fresh, cancel.clone(), "canceled-1", T0).await;
    act(&fresh, cancel, "limited-1", T0).await;
    let capped = GroupLimits {
        max_leased: Some(3),
        ..GroupLimits::default()
    };
    store(&fresh)
        .set_group(&GroupName::parse("m:limited").unwrap(), &capped, ms(T0))
        .await
        .unwrap();
    // A lease that has lapsed is still active work of its group.
    claim(&fresh, "leased-1", "w", T0, 1_000).await;
    act(&fresh, OperatorAction::Hold { reason: None }, "held-1", T0).await;

    // Pages of three: the sweep goes on past a page that forgot nothing.
    let pages = sweep(&fresh, 3).await;
    let looked: u64 = pages.iter().map(|p| p.looked).sum();
    let forgotten: u64 = pages.iter().map(|p| p.forgotten).sum();
    assert_eq!((looked, forgotten), (9, 3), "{pages:?}");
    let now = T0 + 10_000;
    let names: Vec<String> = listed(&fresh, now)
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "default",
            "m:held",
            "m:later",
            "m:leased",
            "m:limited",
            "m:waiting"
        ],
        "the settled, dead-lettered and canceled groups are forgotten"
    );
    // What the forgotten groups held is still there, and still found by group.
    assert_eq!(
        state(&fresh, "dead-1", now).await,
        settled::store::ReceiptState::DeadLettered
    );
    // A second sweep finds nothing more to forget.
    let again: u64 = sweep(&fresh, 100).await.iter().map(|p| p.forgotten).sum();
    assert_eq!(again, 0);

    // Named again by a new receipt, or redriven into, a group is back.
    enqueue_new(&fresh, &[in_group("settled-2", "m:settled", now)], now).await;
    act(&fresh, OperatorAction::Redrive, "dead-1", now).await;
    let after = listed(&fresh, now).await;
    for name in ["m:settled", "m:dead"] {
        assert!(
            after.contains(&(name.to_owned(), 1)),
            "{name} is listed with its receipt again: {after:?}"
        );
    }
    assert!(!after.iter().any(|(n, _)| n == "m:canceled"));
    // And its work is claimed as any other.
    let due = store(&fresh)
        .claim_from(
            &worker("w2"),
            ms(now),
            lease(60_000),
            limit(10),
            &[GroupName::parse("m:dead").unwrap()],
        )
        .await
        .unwrap();
    assert_eq!(due.claims.len(), 1);
}

async fn a_sweep_of_no_groups_but_the_default_forgets_nothing(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("plain")], T0).await;
    let pages = sweep(&fresh, 10).await;
    assert_eq!(pages.len(), 1);
    assert_eq!((pages[0].looked, pages[0].forgotten), (1, 0));
    assert_eq!(listed(&fresh, T0).await, [("default".to_owned(), 1)]);
}

crate::on_every_backend!(
    only_idle_groups_without_limits_are_forgotten,
    a_sweep_of_no_groups_but_the_default_forgets_nothing,
);
