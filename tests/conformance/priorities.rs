//! Priorities (docs/groups.md, "Priorities"): within a group a claim takes
//! the highest priority first, then the oldest due; groups are shared out
//! as without them; the priority is part of the receipt's identity and
//! shown wherever the receipt is.

use settled::domain::{GroupName, Priority};
use settled::store::{Enqueued, NewReceipt, ReceiptFilter, SearchOrder, SearchPage};

use super::support::*;
use crate::common::Fresh;

/// Receipt `id` of `group` with priority `priority`, due at `visible`.
fn ranked(id: &str, group: &str, priority: i64, visible: u64) -> NewReceipt {
    NewReceipt {
        group: GroupName::parse(group).expect("group"),
        priority: Priority::parse(priority).expect("priority"),
        trace: None,
        ..receipt_with(id, FIN, None, Some(visible))
    }
}

/// The ids one batch claim of `n` hands out, in the order it hands them out.
async fn claim_ids(fresh: &Fresh, n: usize, now: u64) -> Vec<String> {
    store(fresh)
        .claim_from(&worker("w"), ms(now), lease(600_000), limit(n), &[])
        .await
        .expect("claim")
        .claims
        .into_iter()
        .map(|c| c.receipt_id.as_str().to_owned())
        .collect()
}

async fn within_a_group_the_highest_priority_comes_first(fresh: Fresh) {
    enqueue_new(
        &fresh,
        &[
            ranked("old-low", "default", -1, T0 - 5_000),
            ranked("old-plain", "default", 0, T0 - 3_000),
            ranked("new-high", "default", 5, T0 - 1_000),
            ranked("older-high", "default", 5, T0 - 2_000),
            ranked("later-top", "default", 9, T0 + 60_000),
        ],
        T0,
    )
    .await;
    // Highest first, oldest due within a priority; one not yet due waits
    // whatever its priority.
    assert_eq!(claim_ids(&fresh, 2, T0).await, ["older-high", "new-high"]);
    assert_eq!(claim_ids(&fresh, 10, T0).await, ["old-plain", "old-low"]);
    assert!(claim_ids(&fresh, 10, T0).await.is_empty());
    assert_eq!(claim_ids(&fresh, 10, T0 + 60_000).await, ["later-top"]);
}

async fn many_rows_not_yet_due_at_a_high_priority_do_not_hide_due_work(fresh: Fresh) {
    let later: Vec<NewReceipt> = (0..300)
        .map(|i| ranked(&format!("later-{i:03}"), "default", 1000, T0 + 60_000 + i))
        .collect();
    enqueue_new(&fresh, &later, T0).await;
    enqueue_new(
        &fresh,
        &[
            ranked("due-a", "default", 3, T0 - 10),
            ranked("due-b", "default", -1000, T0 - 20),
        ],
        T0,
    )
    .await;
    assert_eq!(claim_ids(&fresh, 5, T0).await, ["due-a", "due-b"]);
}

async fn priorities_do_not_change_how_groups_share_a_claim(fresh: Fresh) {
    let mut receipts = Vec::new();
    for i in 0..4 {
        receipts.push(ranked(&format!("a-top-{i}"), "rail:a", 50, T0 - 100 + i));
        receipts.push(ranked(&format!("a-low-{i}"), "rail:a", 0, T0 - 1_000 + i));
        receipts.push(ranked(&format!("b-{i}"), "rail:b", 0, T0 - 50 + i));
    }
    enqueue_new(&fresh, &receipts, T0).await;
    let got = claim_ids(&fresh, 4, T0).await;
    let mut from_a: Vec<&str> = got
        .iter()
        .map(String::as_str)
        .filter(|id| id.starts_with("a-"))
        .collect();
    from_a.sort_unstable();
    let from_b = got.iter().filter(|id| id.starts_with("b-")).count();
    // Round robin: two each; group a gives its highest priority first.
    assert_eq!(from_b, 2, "{got:?}");
    assert_eq!(from_a, ["a-top-0", "a-top-1"], "{got:?}");
    // A claim of one group only takes the same order.
    let a_only = store(&fresh)
        .claim_from(
            &worker("w"),
            ms(T0),
            lease(600_000),
            limit(3),
            &[GroupName::parse("rail:a").unwrap()],
        )
        .await
        .unwrap();
    let ids: Vec<&str> = a_only
        .claims
        .iter()
        .map(|c| c.receipt_id.as_str())
        .collect();
    assert_eq!(ids, ["a-top-2", "a-top-3", "a-low-0"]);
}

async fn the_priority_is_part_of_the_identity_and_shown(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(
        &fresh,
        &[ranked("r", "default", 7, T0), receipt("plain")],
        T0,
    )
    .await;
    assert_eq!(
        s.enqueue(&[ranked("r", "default", 7, T0)], ms(T0))
            .await
            .unwrap(),
        vec![Enqueued::Existing]
    );
    assert_eq!(
        s.enqueue(&[ranked("r", "default", 8, T0)], ms(T0))
            .await
            .unwrap(),
        vec![Enqueued::Conflict],
        "another priority is another receipt"
    );
    assert_eq!(
        s.enqueue(&[receipt("r")], ms(T0)).await.unwrap(),
        vec![Enqueued::Conflict]
    );
    assert_eq!(view(&fresh, "r", T0).await.priority, 7);
    assert_eq!(view(&fresh, "plain", T0).await.priority, 0);
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    assert_eq!(c.priority.get(), 7);
    let page = SearchPage {
        order: SearchOrder::Oldest,
        limit: 10,
        after: None,
    };
    let found = s
        .find_receipts(
            &ReceiptFilter {
                priority: Some(Priority::parse(7).unwrap()),
                ..ReceiptFilter::default()
            },
            &page,
            ms(T0),
        )
        .await
        .unwrap();
    let ids: Vec<(&str, i64)> = found
        .receipts
        .iter()
        .map(|r| (r.receipt_id.as_str(), r.priority))
        .collect();
    assert_eq!(ids, [("r", 7)]);
}

/// Each group with its depth, live leases and oldest due age at `now`.
async fn groups_at(fresh: &Fresh, now: u64) -> Vec<(String, Option<u64>, u64, u64)> {
    let all = settled::store::GroupQuery {
        limit: 10,
        after: String::new(),
        exact: false,
        depth: true,
    };
    store(fresh)
        .groups(ms(now), &all)
        .await
        .expect("groups")
        .into_iter()
        .map(|g| (g.group, g.depth, g.leased, g.oldest_due_age_ms))
        .collect()
}

/// A receipt whose lease lapsed is claimable again at its own place in the
/// claim order (its priority, then its due time), whatever priorities the
/// receipts holding no lease have; a group's depth and oldest due count it.
async fn lapsed_leases_come_back_in_claim_order(fresh: Fresh) {
    enqueue_new(
        &fresh,
        &[
            ranked("lapsed-high", "default", 5, T0 - 500),
            ranked("plain-old", "default", 0, T0 - 1_000),
            ranked("plain-new", "default", 0, T0 - 100),
            ranked("b-lapsed", "rail:b", 0, T0 - 2_000),
        ],
        T0,
    )
    .await;
    claim(&fresh, "lapsed-high", "w1", T0, 1_000).await;
    claim(&fresh, "b-lapsed", "w1", T0, 1_000).await;
    assert_eq!(
        groups_at(&fresh, T0 + 999).await,
        [
            ("default".to_owned(), Some(3), 1, 1_000 + 999),
            ("rail:b".to_owned(), Some(1), 1, 0),
        ]
    );
    assert_eq!(
        groups_at(&fresh, T0 + 1_000).await,
        [
            ("default".to_owned(), Some(3), 0, 2_000),
            ("rail:b".to_owned(), Some(1), 0, 3_000),
        ]
    );
    // Round robin over the groups, each in its own order (the lapsed
    // high-priority lease first in `default`); within a round oldest due
    // first.
    assert_eq!(
        claim_ids(&fresh, 4, T0 + 1_000).await,
        ["b-lapsed", "lapsed-high", "plain-old", "plain-new"]
    );
}

/// A group's oldest due time is its earliest due receipt of any priority
/// (each priority's first entry of the claim index), not the highest
/// priority's, and not a receipt not yet due.
async fn a_groups_oldest_due_spans_its_priorities(fresh: Fresh) {
    enqueue_new(
        &fresh,
        &[
            ranked("high", "mixed", 9, T0 - 100),
            ranked("mid", "mixed", 0, T0 - 700),
            ranked("low", "mixed", -3, T0 - 300),
            ranked("later", "mixed", 4, T0 + 500),
        ],
        T0,
    )
    .await;
    let mixed = |all: Vec<(String, Option<u64>, u64, u64)>| {
        all.into_iter()
            .filter(|g| g.0 == "mixed")
            .map(|g| (g.1, g.2, g.3))
            .collect::<Vec<_>>()
    };
    assert_eq!(mixed(groups_at(&fresh, T0).await), [(Some(4), 0, 700)]);
    claim(&fresh, "mid", "w", T0, 1_000).await;
    assert_eq!(mixed(groups_at(&fresh, T0).await), [(Some(4), 1, 300)]);
}

crate::on_every_backend!(
    a_groups_oldest_due_spans_its_priorities,
    within_a_group_the_highest_priority_comes_first,
    many_rows_not_yet_due_at_a_high_priority_do_not_hide_due_work,
    priorities_do_not_change_how_groups_share_a_claim,
    the_priority_is_part_of_the_identity_and_shown,
    lapsed_leases_come_back_in_claim_order,
);
