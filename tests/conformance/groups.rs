//! Groups (docs/groups.md): identity, fair claiming, and the limits an
//! operator sets — paused, max_leased, rate — on every backend, with
//! explicit clocks.

use settled::domain::{GroupLimits, GroupName, Rate, RetryPolicy};
use settled::store::postgres::{PostgresOptions, PostgresStore};
use settled::store::{Enqueued, GroupQuery, NewReceipt, ReceiptClaim, SharedStore};

use super::support::*;
use crate::common::Fresh;

fn group(name: &str) -> GroupName {
    GroupName::parse(name).expect("valid group")
}

/// A receipt of `group`, due at `visible`.
fn in_group(id: &str, name: &str, visible: u64) -> NewReceipt {
    NewReceipt {
        group: group(name),
        ..receipt_with(id, FIN, None, Some(visible))
    }
}

/// One group's figures, depth included.
fn one(name: &str) -> GroupQuery {
    GroupQuery {
        limit: 1,
        after: name.to_owned(),
        exact: true,
        depth: true,
    }
}

async fn set(fresh: &Fresh, name: &str, limits: GroupLimits, now: u64) {
    store(fresh)
        .set_group(&group(name), &limits, ms(now))
        .await
        .expect("set limits");
}

async fn claim_n(fresh: &Fresh, n: usize, now: u64, only: &[GroupName]) -> Vec<String> {
    let due = store(fresh)
        .claim_from(&worker("w"), ms(now), lease(600_000), limit(n), only)
        .await
        .expect("claim");
    due.claims
        .into_iter()
        .map(|c| c.group.as_str().to_owned())
        .collect()
}

fn count(groups: &[String], name: &str) -> usize {
    groups.iter().filter(|g| *g == name).count()
}

async fn the_group_is_part_of_the_identity_and_shown(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(
        &fresh,
        &[in_group("r", "rail:ach", T0), receipt("plain")],
        T0,
    )
    .await;
    let again = s
        .enqueue(&[in_group("r", "rail:ach", T0)], ms(T0))
        .await
        .unwrap();
    assert_eq!(again, vec![Enqueued::Existing]);
    let moved = s
        .enqueue(&[in_group("r", "rail:sepa", T0)], ms(T0))
        .await
        .unwrap();
    assert_eq!(
        moved,
        vec![Enqueued::Conflict],
        "another group is another receipt"
    );
    let defaulted = s.enqueue(&[receipt("r")], ms(T0)).await.unwrap();
    assert_eq!(defaulted, vec![Enqueued::Conflict]);
    assert_eq!(view(&fresh, "r", T0).await.group, "rail:ach");
    assert_eq!(view(&fresh, "plain", T0).await.group, "default");
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    assert_eq!(c.group, "rail:ach");
    let dead = record(
        &fresh,
        &c,
        &permanent(settled::domain::SettlementFailureCode::InvalidInput, "x"),
        RetryPolicy::default(),
        T0,
    )
    .await;
    assert!(dead.is_ok());
    let letter = s
        .dead_letter(&rid("r"))
        .await
        .unwrap()
        .expect("dead letter");
    assert_eq!(letter.group, "rail:ach");
    let all = GroupQuery {
        limit: 10,
        after: String::new(),
        exact: false,
        depth: true,
    };
    let listed = s.groups(ms(T0), &all).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|g| g.group.as_str()).collect();
    assert_eq!(names, ["default", "rail:ach"]);
}

async fn a_small_group_gets_its_share_from_the_first_claim(fresh: Fresh) {
    // The big group's receipts are all due before the small group's.
    let big: Vec<NewReceipt> = (0..1000)
        .map(|i| in_group(&format!("big-{i:04}"), "merchant:big", T0 - 10_000 + i))
        .collect();
    let small: Vec<NewReceipt> = (0..10)
        .map(|i| in_group(&format!("small-{i}"), "merchant:small", T0 - 100 + i))
        .collect();
    enqueue_new(&fresh, &big, T0).await;
    enqueue_new(&fresh, &small, T0).await;
    for round in 0..2 {
        let got = claim_n(&fresh, 10, T0, &[]).await;
        assert_eq!(
            (count(&got, "merchant:big"), count(&got, "merchant:small")),
            (5, 5),
            "claim {round}: {got:?}"
        );
    }
    let got = claim_n(&fresh, 10, T0, &[]).await;
    assert_eq!(count(&got, "merchant:big"), 10, "the small group is empty");
    // Within a group, the oldest due first.
    let c = store(&fresh)
        .claim_due(&worker("w"), ms(T0), lease(1000), limit(1))
        .await
        .unwrap();
    assert_eq!(c[0].receipt_id, "big-0020");
}

/// More groups than a claim takes: each claim reads only the groups whose
/// turn it is, and every group gets its turn before any gets a second.
async fn every_group_gets_its_turn(fresh: Fresh) {
    let receipts: Vec<NewReceipt> = (0..30)
        .flat_map(|g| {
            (0..3)
                .map(move |i| in_group(&format!("g{g:02}-{i}"), &format!("g{g:02}"), T0 - 100 + i))
        })
        .collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let mut served = std::collections::BTreeSet::new();
    for round in 0..3 {
        let got = claim_n(&fresh, 10, T0, &[]).await;
        assert_eq!(got.len(), 10);
        for g in got {
            assert!(served.insert(g.clone()), "round {round}: {g} served twice");
        }
    }
    assert_eq!(served.len(), 30, "each of the 30 groups once");
    let got = claim_n(&fresh, 30, T0, &[]).await;
    let again: std::collections::BTreeSet<String> = got.into_iter().collect();
    assert_eq!(again.len(), 30, "then each a second time");
}

/// More groups with work than a claim walks before it looks at them: a
/// claim of one still finds the one group with a receipt due, past 150
/// whose receipts are not due yet.
async fn a_claim_finds_due_work_past_many_groups_with_none_due(fresh: Fresh) {
    let mut receipts: Vec<NewReceipt> = (0..150)
        .map(|g| in_group(&format!("later-{g}"), &format!("g{g:03}"), T0 + 1_000_000))
        .collect();
    receipts.push(in_group("due", "zz", T0 - 1));
    enqueue_new(&fresh, &receipts, T0).await;
    assert_eq!(claim_n(&fresh, 1, T0, &[]).await, ["zz"]);
    assert!(claim_n(&fresh, 1, T0, &[]).await.is_empty());
}

/// With more groups than a claim walks, the turn still goes round every
/// group, wrapping past the last name, before any group is served twice.
async fn every_one_of_many_groups_gets_its_turn(fresh: Fresh) {
    let receipts: Vec<NewReceipt> = (0..150)
        .flat_map(|g| {
            (0..2).map(move |i| in_group(&format!("g{g:03}-{i}"), &format!("g{g:03}"), T0 - 10 + i))
        })
        .collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let mut served = Vec::new();
    for _ in 0..40 {
        served.extend(claim_n(&fresh, 5, T0, &[]).await);
    }
    let first: std::collections::BTreeSet<&String> = served[..150].iter().collect();
    assert_eq!(first.len(), 150, "each group once before any twice");
    let second: std::collections::BTreeSet<&String> = served[150..].iter().collect();
    assert_eq!(second.len(), 50, "then round again from the first");
}

async fn a_claim_may_name_its_groups(fresh: Fresh) {
    let receipts = [
        in_group("a", "rail:ach", T0 - 3),
        in_group("s", "rail:sepa", T0 - 2),
        receipt("d"),
    ];
    enqueue_new(&fresh, &receipts, T0).await;
    let got = claim_n(&fresh, 10, T0, &[group("rail:sepa"), group("nobody")]).await;
    assert_eq!(got, ["rail:sepa"]);
    let got = claim_n(&fresh, 10, T0, &[group("default")]).await;
    assert_eq!(got, ["default"]);
    let got = claim_n(&fresh, 10, T0, &[]).await;
    assert_eq!(got, ["rail:ach"]);
}

async fn a_paused_group_keeps_its_times_and_resumes_without_redrive(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(
        &fresh,
        &[
            in_group("p1", "rail:ach", T0 - 5),
            in_group("p2", "rail:ach", T0 - 4),
            receipt("d"),
        ],
        T0,
    )
    .await;
    let paused = GroupLimits {
        paused: true,
        ..GroupLimits::default()
    };
    set(&fresh, "rail:ach", paused, T0).await;
    let due = s
        .claim_from(&worker("w"), ms(T0), lease(1000), limit(10), &[])
        .await
        .unwrap();
    assert_eq!(due.claims.len(), 1, "only the default group's receipt");
    assert!(due.held_back);
    assert_eq!(
        try_claim(&fresh, "p1", "w", T0, 1000).await.unwrap(),
        ReceiptClaim::GroupLimited { paused: true }
    );
    let before = view(&fresh, "p1", T0).await;
    assert_eq!(before.next_visible_at_ms, Some(T0 - 5));
    let listed = s.groups(ms(T0 + 100), &one("rail:ach")).await.unwrap();
    assert!(listed[0].paused);
    assert_eq!((listed[0].depth, listed[0].leased), (Some(2), 0));
    assert_eq!(listed[0].oldest_due_age_ms, 105);
    set(&fresh, "rail:ach", GroupLimits::default(), T0 + 1).await;
    let got = claim_n(&fresh, 10, T0 + 1, &[]).await;
    assert_eq!(got, ["rail:ach", "rail:ach"]);
    let after = view(&fresh, "p1", T0 + 1).await;
    assert_eq!(
        (after.attempts, after.next_visible_at_ms),
        (0, Some(T0 - 5))
    );
}

async fn max_leased_caps_live_leases_and_frees_as_they_end(fresh: Fresh) {
    let receipts: Vec<NewReceipt> = (0..20)
        .map(|i| in_group(&format!("m-{i:02}"), "rail:card", T0 - 100 + i))
        .collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let capped = GroupLimits {
        max_leased: Some(3),
        ..GroupLimits::default()
    };
    set(&fresh, "rail:card", capped, T0).await;
    let s = store(&fresh);
    let first = s
        .claim_from(&worker("w"), ms(T0), lease(1_000), limit(10), &[])
        .await
        .unwrap();
    assert_eq!(first.claims.len(), 3);
    assert!(first.held_back);
    assert_eq!(claim_n(&fresh, 10, T0, &[]).await.len(), 0);
    assert_eq!(
        try_claim(&fresh, "m-10", "w", T0, 1000).await.unwrap(),
        ReceiptClaim::GroupLimited { paused: false }
    );
    // An outcome frees a place; an expired lease frees its own.
    let done = record(
        &fresh,
        &first.claims[0],
        &accepted("tx"),
        RetryPolicy::default(),
        T0,
    )
    .await;
    assert!(done.is_ok());
    assert_eq!(claim_n(&fresh, 10, T0, &[]).await.len(), 1);
    assert_eq!(claim_n(&fresh, 10, T0 + 1_000, &[]).await.len(), 2);
}

/// Stores on one database: three replicas on PostgreSQL, the one store on
/// SQLite (it has one writer by design).
async fn replicas(fresh: &Fresh) -> Vec<SharedStore> {
    let mut stores = vec![fresh.store.clone()];
    if fresh.url.starts_with("postgres") {
        for _ in 0..2 {
            let s = PostgresStore::open(&fresh.url, &PostgresOptions::default())
                .await
                .expect("replica");
            stores.push(s);
        }
    }
    stores
}

/// 16 workers over the replicas claim until nothing more is granted. No
/// lease ends in a phase, so the live count only grows: a final count at
/// the cap proves it was never above it. Then five finish and they race
/// again.
async fn max_leased_holds_under_racing_workers_and_replicas(fresh: Fresh) {
    let receipts: Vec<NewReceipt> = (0..400)
        .map(|i| in_group(&format!("x-{i:03}"), "rail:wire", T0 - 1_000 + i))
        .collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let capped = GroupLimits {
        max_leased: Some(7),
        ..GroupLimits::default()
    };
    set(&fresh, "rail:wire", capped, T0).await;
    let stores = replicas(&fresh).await;
    let mut held = Vec::new();
    for phase in 0..2 {
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..16 {
            let s = stores[w % stores.len()].clone();
            tasks.spawn(async move {
                let mut mine = Vec::new();
                for _ in 0..6 {
                    let due = s
                        .claim_from(
                            &worker(&format!("w{w}")),
                            ms(T0),
                            lease(600_000),
                            limit(3),
                            &[],
                        )
                        .await
                        .expect("claim");
                    mine.extend(due.claims);
                    tokio::task::yield_now().await;
                }
                mine
            });
        }
        while let Some(mine) = tasks.join_next().await {
            held.extend(mine.unwrap());
        }
        let live = store(&fresh)
            .groups(ms(T0), &one("rail:wire"))
            .await
            .unwrap()[0]
            .leased;
        assert_eq!(live, 7, "phase {phase}: the cap is reached, never passed");
        assert_eq!(held.len(), 7, "phase {phase}: claims granted");
        for c in held.drain(..5) {
            let r = record(&fresh, &c, &accepted("tx"), RetryPolicy::default(), T0).await;
            assert!(r.is_ok());
        }
    }
}

/// A rate of 50/s with a burst of 10, claimed every 20 ms for 10 s: the
/// burst plus 50 a second, within 10 %.
async fn a_rate_limit_holds_within_ten_percent_over_ten_seconds(fresh: Fresh) {
    let receipts: Vec<NewReceipt> = (0..1_000)
        .map(|i| in_group(&format!("t-{i:04}"), "rail:rtp", T0 - 2_000 + i))
        .collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let rated = GroupLimits {
        rate: Some(Rate::new(50.0, 10).unwrap()),
        ..GroupLimits::default()
    };
    set(&fresh, "rail:rtp", rated, T0).await;
    let s = store(&fresh);
    let mut claimed = 0;
    let mut hints = 0;
    for step in 0..=500 {
        let now = T0 + step * 20;
        let due = s
            .claim_from(&worker("w"), ms(now), lease(600_000), limit(5), &[])
            .await
            .unwrap();
        claimed += due.claims.len();
        if due.look_again_ms.is_some() {
            hints += 1;
        }
    }
    let expected = 10.0 + 50.0 * 10.0;
    let off = (claimed as f64 - expected).abs() / expected;
    assert!(off <= 0.10, "claimed {claimed}, expected about {expected}");
    assert!(hints > 0, "a held-back claim says when to look again");
    // Setting the same rate again keeps the (empty) bucket; another rate
    // starts a full one.
    let end = T0 + 500 * 20;
    set(&fresh, "rail:rtp", rated, end).await;
    assert_eq!(
        claim_n(&fresh, 5, end, &[]).await.len(),
        0,
        "same rate, same bucket"
    );
    let other = GroupLimits {
        rate: Some(Rate::new(50.0, 3).unwrap()),
        ..GroupLimits::default()
    };
    set(&fresh, "rail:rtp", other, end).await;
    assert_eq!(
        claim_n(&fresh, 5, end, &[]).await.len(),
        3,
        "a new rate, a full bucket"
    );
}

/// Each listed group's figures count its own leases only, live and lapsed,
/// whatever the other groups hold, and a page lists only its groups: the
/// list reads every lease once and shares it out by group. A held receipt's
/// lease is neither leased nor due.
async fn each_group_counts_only_its_own_leases(fresh: Fresh) {
    enqueue_new(
        &fresh,
        &[
            in_group("a1", "a", T0 - 100),
            in_group("a2", "a", T0 - 200),
            in_group("a3", "a", T0 - 50),
            in_group("b1", "b", T0 - 900),
            in_group("b2", "b", T0 + 60_000),
            in_group("c1", "c", T0 + 60_000),
        ],
        T0,
    )
    .await;
    let s = store(&fresh);
    claim(&fresh, "a1", "w", T0, 600_000).await;
    claim(&fresh, "a2", "w", T0, 600_000).await;
    claim(&fresh, "b1", "w", T0, 1_000).await;
    let hold = settled::store::OperatorAction::Hold { reason: None };
    let held = s.act(&hold, &[rid("a2")], None, ms(T0), false).await;
    assert!(held.unwrap().iter().all(Result::is_ok));
    let now = T0 + 5_000;
    let figures = |all: Vec<settled::store::GroupView>| {
        all.into_iter()
            .map(|g| (g.group, g.depth, g.leased, g.oldest_due_age_ms))
            .collect::<Vec<_>>()
    };
    let page = GroupQuery {
        limit: 2,
        after: String::new(),
        exact: false,
        depth: true,
    };
    // a: a1 leased (live), a2 held, a3 due 5 050 ms ago; b: b1's lease
    // lapsed (due 5 900 ms ago), b2 not yet due; c is past the page.
    assert_eq!(
        figures(s.groups(ms(now), &page).await.unwrap()),
        [
            ("a".to_owned(), Some(2), 1, 5_050),
            ("b".to_owned(), Some(2), 0, 5_900),
        ]
    );
    assert_eq!(
        figures(s.groups(ms(now), &one("c")).await.unwrap()),
        [("c".to_owned(), Some(1), 0, 0)]
    );
    // Before b1's lease lapses, b has nothing due and one lease.
    assert_eq!(
        figures(s.groups(ms(T0 + 500), &one("b")).await.unwrap()),
        [("b".to_owned(), Some(2), 1, 0)]
    );
}

crate::on_every_backend!(
    the_group_is_part_of_the_identity_and_shown,
    a_claim_finds_due_work_past_many_groups_with_none_due,
    every_one_of_many_groups_gets_its_turn,
    each_group_counts_only_its_own_leases,
    a_small_group_gets_its_share_from_the_first_claim,
    every_group_gets_its_turn,
    a_claim_may_name_its_groups,
    a_paused_group_keeps_its_times_and_resumes_without_redrive,
    max_leased_caps_live_leases_and_frees_as_they_end,
    max_leased_holds_under_racing_workers_and_replicas,
    a_rate_limit_holds_within_ten_percent_over_ten_seconds,
);
