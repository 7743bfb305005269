//! Claims: who may claim what, when, and what a claim changes.

use std::collections::HashSet;

use settled::domain::{RetryPolicy, UnixMs};
use settled::store::{ReceiptClaim, ReceiptState};

use super::support::*;
use crate::common::{Fresh, raw_exec, raw_exec_unchecked};

async fn claim_leases_and_bumps_only_the_row_version(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt_with("r", FIN, None, Some(T0 - 40))], T0).await;
    let c = claim(&fresh, "r", "worker-1", T0, 30_000).await;
    assert_eq!(c.receipt_id, "r");
    assert_eq!(
        (c.finalized_at.get(), c.attempts, c.row_version.get()),
        (FIN, 0, 1)
    );
    assert_eq!(
        (c.lease_owner.as_str(), c.lease_until_ms.get()),
        ("worker-1", T0 + 30_000)
    );
    let v = view(&fresh, "r", T0).await;
    assert_eq!(
        (v.state, v.attempts, v.row_version),
        (ReceiptState::Leased, 0, 1)
    );
    assert_eq!(
        v.next_visible_at_ms,
        Some(T0 - 40),
        "a claim does not move visibility"
    );
    let lease_view = v.lease.expect("live lease is shown");
    assert_eq!(
        (lease_view.owner.as_str(), lease_view.until_ms),
        ("worker-1", T0 + 30_000)
    );
}

async fn lease_expires_exactly_at_its_deadline(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let first = claim(&fresh, "r", "w1", T0, 1_000).await;
    let until = first.lease_until_ms.get();
    let w2 = worker("w2");
    assert_eq!(
        try_claim(&fresh, "r", "w2", until - 1, 1_000)
            .await
            .unwrap(),
        ReceiptClaim::Leased
    );
    assert!(
        s.claim_due(&w2, ms(until - 1), lease(1_000), limit(5))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(state(&fresh, "r", until - 1).await, ReceiptState::Leased);
    assert_eq!(state(&fresh, "r", until).await, ReceiptState::Pending);
    let batch = s
        .claim_due(&w2, ms(until), lease(1_000), limit(5))
        .await
        .unwrap();
    assert_eq!(batch.len(), 1);
    let second = &batch[0];
    assert_eq!((second.row_version.get(), second.attempts), (2, 0));
    assert_eq!(
        (second.lease_owner.as_str(), second.lease_until_ms.get()),
        ("w2", until + 1_000)
    );
    assert_ne!(second.lease_token, first.lease_token);
    // claim_receipt also treats the deadline as expired.
    assert_eq!(
        try_claim(&fresh, "r", "w2", second.lease_until_ms - 1, 1_000)
            .await
            .unwrap(),
        ReceiptClaim::Leased
    );
    let ReceiptClaim::Claimed(third) =
        try_claim(&fresh, "r", "w2", second.lease_until_ms.get(), 1_000)
            .await
            .unwrap()
    else {
        panic!("expected a claim exactly at the second deadline")
    };
    assert_eq!((third.row_version.get(), third.attempts), (3, 0));
    assert_eq!(third.lease_until_ms.get(), second.lease_until_ms + 1_000);
}

async fn tokens_are_long_unpredictable_and_never_repeat(fresh: Fresh) {
    let s = store(&fresh);
    let ids: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let mut tokens = HashSet::new();
    for round in 0..3u64 {
        let now = T0 + round * 10;
        let claims = s
            .claim_due(&worker("w"), ms(now), lease(10), limit(1024))
            .await
            .unwrap();
        assert_eq!(claims.len(), 40);
        for c in claims {
            // The secret, then `.` and the claim time (metrics read it).
            let (secret, at) = c.lease_token.as_str().split_once('.').unwrap();
            assert!(
                secret.len() >= 32 && secret.chars().all(|ch| ch.is_ascii_hexdigit()),
                "token carries under 128 bits of hex: {:?}",
                c.lease_token
            );
            assert_eq!(at, now.to_string(), "the claim time follows the secret");
            assert!(
                tokens.insert(c.lease_token.clone()),
                "a lease token repeated"
            );
        }
    }
}

async fn claim_due_orders_and_respects_the_limit(fresh: Fresh) {
    let s = store(&fresh);
    let batch = [
        receipt_with("c", FIN, None, Some(T0 - 10)),
        receipt_with("a", FIN, None, Some(T0 - 10)),
        receipt_with("b", FIN, None, Some(T0 - 20)),
        receipt_with("d", FIN, None, Some(T0)),
        receipt_with("e", FIN, None, Some(T0 + 1)),
    ];
    enqueue_new(&fresh, &batch, 0).await;
    let w = worker("w");
    let first = s.claim_due(&w, ms(T0), lease(500), limit(2)).await.unwrap();
    let ids: Vec<_> = first.iter().map(|c| c.receipt_id.clone()).collect();
    assert_eq!(ids, ["b", "a"]);
    let rest = s
        .claim_due(&w, ms(T0), lease(500), limit(1024))
        .await
        .unwrap();
    let ids: Vec<_> = rest.iter().map(|c| c.receipt_id.clone()).collect();
    assert_eq!(
        ids,
        ["c", "d"],
        "leased rows and future rows are not claimable"
    );
    assert!(
        rest.iter()
            .all(|c| c.row_version == 1 && c.lease_until_ms == T0 + 500)
    );
    assert!(
        s.claim_due(&w, ms(T0), lease(500), limit(1))
            .await
            .unwrap()
            .is_empty()
    );
}

async fn claim_receipt_reports_why_it_did_not_claim(fresh: Fresh) {
    let batch = [
        receipt("live"),
        receipt_with("future", FIN, None, Some(T0 + 100)),
        receipt("done"),
    ];
    enqueue_new(&fresh, &batch, T0).await;
    claim(&fresh, "live", "w1", T0, 1_000).await;
    assert_eq!(
        try_claim(&fresh, "live", "other", T0 + 1, 50)
            .await
            .unwrap(),
        ReceiptClaim::Leased
    );
    assert_eq!(
        try_claim(&fresh, "future", "other", T0 + 99, 50)
            .await
            .unwrap(),
        ReceiptClaim::NotYetVisible
    );
    assert_eq!(
        try_claim(&fresh, "unknown", "other", T0, 50).await.unwrap(),
        ReceiptClaim::NoActiveWork
    );
    let c = claim(&fresh, "done", "w1", T0, 1_000).await;
    record(&fresh, &c, &accepted("t"), RetryPolicy::default(), T0 + 1)
        .await
        .unwrap();
    assert_eq!(
        try_claim(&fresh, "done", "other", T0 + 2, 50)
            .await
            .unwrap(),
        ReceiptClaim::NoActiveWork
    );
    // The refused attempts changed nothing.
    assert_eq!(view(&fresh, "future", T0).await.row_version, 0);
    assert_eq!(view(&fresh, "live", T0).await.row_version, 1);
    assert!(matches!(
        try_claim(&fresh, "future", "other", T0 + 100, 50)
            .await
            .unwrap(),
        ReceiptClaim::Claimed(_)
    ));
}

async fn a_corrupt_row_fails_the_whole_batch(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("a"), receipt("b"), receipt("c")], T0).await;
    raw_exec_unchecked(
        &fresh,
        "UPDATE receipts SET attempts = -1 WHERE receipt_id = 'b'",
    )
    .await
    .unwrap();
    let result = s
        .claim_due(&worker("w"), ms(T0), lease(100), limit(10))
        .await;
    assert_invalid(&result);
    for id in ["a", "c"] {
        let v = view(&fresh, id, T0).await;
        assert_eq!(
            (v.state, v.row_version),
            (ReceiptState::Pending, 0),
            "{id} was leased"
        );
    }
    assert_eq!(raw_i64(&fresh, "row_version", "b").await, Some(0));
    assert_eq!(raw_i64(&fresh, "lease_until_ms", "b").await, None);
    // Claiming the corrupt row by id is refused too, the others still work.
    let one = s
        .claim_receipt(&rid("b"), &worker("w"), ms(T0), lease(100))
        .await;
    assert_invalid(&one);
    raw_exec(
        &fresh,
        "UPDATE receipts SET attempts = 0 WHERE receipt_id = 'b'",
    )
    .await
    .unwrap();
    let claims = s
        .claim_due(&worker("w"), ms(T0), lease(100), limit(10))
        .await
        .unwrap();
    assert_eq!(claims.len(), 3);
}

async fn check_constraints_refuse_corrupt_writes(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let corrupt = [
        "UPDATE receipts SET attempts = -1 WHERE receipt_id = 'r'",
        "UPDATE receipts SET row_version = -1 WHERE receipt_id = 'r'",
        "UPDATE receipts SET attempts = 4294967296 WHERE receipt_id = 'r'",
        "UPDATE receipts SET status = 'bogus' WHERE receipt_id = 'r'",
        "UPDATE receipts SET lease_owner = 'w' WHERE receipt_id = 'r'",
        "UPDATE receipts SET status = 'settled' WHERE receipt_id = 'r'",
        "UPDATE receipts SET next_visible_at_ms = -5 WHERE receipt_id = 'r'",
        "UPDATE receipts SET failure_code = 'nope', failure_sha256 = NULL WHERE receipt_id = 'r'",
    ];
    for sql in corrupt {
        assert!(
            raw_exec(&fresh, sql).await.is_err(),
            "the database accepted: {sql}"
        );
    }
    let v = view(&fresh, "r", T0).await;
    assert_eq!(
        (v.state, v.attempts, v.row_version),
        (ReceiptState::Pending, 0, 0)
    );
}

async fn racing_claimers_never_share_a_receipt(fresh: Fresh) {
    let ids: Vec<String> = (0..60).map(|i| format!("r{i:03}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let mut tasks = Vec::new();
    for n in 0..6 {
        let s = fresh.store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = s
                    .claim_due(&worker(&format!("w{n}")), ms(T0), lease(60_000), limit(3))
                    .await;
                let got = got.expect("claim");
                if got.is_empty() {
                    break mine;
                }
                mine.extend(got.into_iter().map(|c| c.claim.receipt_id));
            }
        }));
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.unwrap());
    }
    let unique: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), 60, "every receipt claimed exactly once");
    assert_eq!(unique.len(), 60);
    for id in &ids {
        assert_eq!(view(&fresh, id, T0).await.row_version, 1);
    }
    // Racing for one receipt by id: one claim, everyone else sees the lease.
    enqueue_new(&fresh, &[receipt("one")], T0).await;
    let mut tasks = Vec::new();
    for n in 0..8 {
        let s = fresh.store.clone();
        tasks.push(tokio::spawn(async move {
            let w = worker(&format!("w{n}"));
            s.claim_receipt(&rid("one"), &w, ms(T0), lease(60_000))
                .await
        }));
    }
    let mut claimed = 0;
    for task in tasks {
        match task.await.unwrap().expect("claim") {
            ReceiptClaim::Claimed(c) => {
                claimed += 1;
                assert_eq!(c.row_version.get(), 1);
            }
            other => assert_eq!(other, ReceiptClaim::Leased),
        }
    }
    assert_eq!(claimed, 1);
}

async fn a_full_batch_is_1024_claims(fresh: Fresh) {
    let receipts: Vec<_> = (0..1030).map(|i| receipt(&format!("r{i:04}"))).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let s = store(&fresh);
    let batch = s
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(1024))
        .await
        .unwrap();
    assert_eq!(batch.len(), 1024);
    assert_eq!(batch[1023].receipt_id, "r1023");
    let rest = s
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(1024))
        .await
        .unwrap();
    assert_eq!(rest.len(), 6);
}

async fn clock_and_lease_overflow_are_invalid_records(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let w = worker("w");
    // A clock past the database's integers cannot reach the store (a
    // `UnixMs` holds no such time); at their very end no lease fits.
    assert_invalid(&s.claim_due(&w, UnixMs::MAX, lease(1), limit(1)).await);
    assert_invalid(&s.claim_receipt(&rid("r"), &w, UnixMs::MAX, lease(1)).await);
    // now fits, now + lease does not.
    let edge = i64::MAX as u64 - 10;
    assert_invalid(&s.claim_due(&w, ms(edge), lease(11), limit(1)).await);
    assert_invalid(&s.claim_receipt(&rid("r"), &w, ms(edge), lease(11)).await);
    // One item that does not fit refuses the whole enqueue: "x" is not stored.
    let too_big = i64::MAX as u64 + 1;
    let mixed = [receipt("x"), receipt_with("y", too_big, None, None)];
    assert_invalid(&s.enqueue(&mixed, ms(T0)).await);
    let v = view(&fresh, "r", T0).await;
    assert_eq!((v.state, v.row_version), (ReceiptState::Pending, 0));
    assert!(s.receipt(&rid("x"), ms(T0)).await.unwrap().is_none());
    // The very edge still works: now + lease == i64::MAX.
    let ok = s
        .claim_due(&w, ms(edge), lease(10), limit(1))
        .await
        .unwrap();
    assert_eq!(ok[0].lease_until_ms.get(), i64::MAX as u64);
}

async fn row_version_overflow_is_refused_and_changes_nothing(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("a"), receipt("max")], T0).await;
    raw_exec(
        &fresh,
        "UPDATE receipts SET row_version = 9223372036854775807 WHERE receipt_id = 'max'",
    )
    .await
    .unwrap();
    let w = worker("w");
    assert_invalid(&s.claim_receipt(&rid("max"), &w, ms(T0), lease(100)).await);
    assert_invalid(&s.claim_due(&w, ms(T0), lease(100), limit(10)).await);
    let v = view(&fresh, "max", T0).await;
    assert_eq!(
        (v.state, v.row_version),
        (ReceiptState::Pending, i64::MAX as u64)
    );
    assert!(v.lease.is_none());
    assert_eq!(raw_i64(&fresh, "lease_until_ms", "max").await, None);
    assert_eq!(
        view(&fresh, "a", T0).await.row_version,
        0,
        "the batch leased nothing"
    );
    let result = s.claim_due(&w, ms(T0), lease(100), limit(1)).await;
    assert_eq!(
        result.map(|c| c[0].receipt_id.as_str().to_owned()).ok(),
        Some("a".to_owned())
    );
}

crate::on_every_backend!(
    claim_leases_and_bumps_only_the_row_version,
    lease_expires_exactly_at_its_deadline,
    tokens_are_long_unpredictable_and_never_repeat,
    claim_due_orders_and_respects_the_limit,
    claim_receipt_reports_why_it_did_not_claim,
    a_corrupt_row_fails_the_whole_batch,
    check_constraints_refuse_corrupt_writes,
    racing_claimers_never_share_a_receipt,
    a_full_batch_is_1024_claims,
    clock_and_lease_overflow_are_invalid_records,
    row_version_overflow_is_refused_and_changes_nothing,
);
