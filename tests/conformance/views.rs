//! What the store reports: receipt state and history, dead letters and
//! redrive, status, and the store binding.

use settled::domain::{RetryPolicy, Route, SettlementFailureCode, SettlementSkipReason};
use settled::store::postgres::PostgresOptions;
use settled::store::{ReceiptState, open_store};

use super::support::*;
use crate::common::{Fresh, fresh_sqlite};

async fn state_is_derived_from_the_clock_it_is_asked_at(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    assert_eq!(state(&fresh, "r", T0).await, ReceiptState::Pending);
    let c = claim(&fresh, "r", "w", T0, 1_000).await;
    assert_eq!(state(&fresh, "r", T0 + 999).await, ReceiptState::Leased);
    // Expired, unreclaimed: pending again, and no lease is shown.
    let v = view(&fresh, "r", T0 + 1_000).await;
    assert_eq!(
        (v.state, v.lease.is_none(), v.row_version),
        (ReceiptState::Pending, true, 1)
    );
    record(&fresh, &c, &rpc("x"), RetryPolicy::default(), T0 + 1)
        .await
        .unwrap();
    assert_eq!(
        state(&fresh, "r", T0 + 2).await,
        ReceiptState::RetryScheduled
    );
    assert_eq!(
        state(&fresh, "r", T0 + 10_000).await,
        ReceiptState::RetryScheduled
    );
    let c = claim(&fresh, "r", "w", T0 + 251, 1_000).await;
    assert_eq!(state(&fresh, "r", T0 + 251).await, ReceiptState::Leased);
    assert_eq!(
        state(&fresh, "r", T0 + 1_251).await,
        ReceiptState::RetryScheduled
    );
    record(
        &fresh,
        &c,
        &skipped(SettlementSkipReason::NoEconomicIntent),
        RetryPolicy::default(),
        T0 + 300,
    )
    .await
    .unwrap();
    assert_eq!(state(&fresh, "r", T0 + 300).await, ReceiptState::Skipped);
}

async fn history_keeps_digests_and_never_the_detail_or_token(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    let secret = "SECRET-api-key-8f3a rail said no";
    let c1 = claim(&fresh, "r", "worker-a", T0, 1_000).await;
    record(&fresh, &c1, &rpc(secret), RetryPolicy::default(), T0 + 10)
        .await
        .unwrap();
    let c2 = claim(&fresh, "r", "worker-b", T0 + 260, 1_000).await;
    let code = SettlementFailureCode::InvalidReceiptSignature;
    let second = permanent(code, "SECRET second");
    let route = record(&fresh, &c2, &second, RetryPolicy::default(), T0 + 270).await;
    assert_eq!(route.unwrap(), Route::DeadLettered { attempts: 2 });
    let v = view(&fresh, "r", T0 + 270).await;
    let h = &v.history;
    assert_eq!(h.len(), 2);
    assert_eq!(
        (h[0].attempt, h[0].outcome.as_str(), h[0].code),
        (1, "retryable", Some(SettlementFailureCode::Rpc))
    );
    assert_eq!(
        h[0].detail_sha256.as_deref(),
        Some(sha256_hex(secret).as_str())
    );
    assert_eq!(
        (h[0].worker_id.as_str(), h[0].observed_at_ms),
        ("worker-a", T0 + 10)
    );
    assert_eq!(h[0].route.as_deref(), Some("retry_scheduled"));
    assert_eq!(
        (h[1].attempt, h[1].outcome.as_str(), h[1].code),
        (2, "permanent", Some(code))
    );
    assert_eq!(
        h[1].detail_sha256.as_deref(),
        Some(sha256_hex("SECRET second").as_str())
    );
    assert_eq!(
        (h[1].worker_id.as_str(), h[1].route.as_deref()),
        ("worker-b", Some("dead_lettered"))
    );
    assert!(
        sha256_hex(secret)
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase())
    );
    // The detail text is stored nowhere; the token is never reported.
    let stored = everything_stored(&fresh).await;
    assert!(stored.contains(&sha256_hex(secret)), "the digest is stored");
    assert!(
        !stored.contains("SECRET"),
        "a failure detail reached the database"
    );
    if let Some(path) = fresh.url.strip_prefix("sqlite:") {
        for file in [path.to_owned(), format!("{path}-wal")] {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(
                !bytes.windows(6).any(|w| w == b"SECRET"),
                "{file} holds a failure detail"
            );
        }
    }
    let c3 = {
        store(&fresh)
            .redrive(&rid("r"), ms(T0 + 300))
            .await
            .unwrap()
            .unwrap();
        claim(&fresh, "r", "w", T0 + 300, 1_000).await
    };
    // As the API shows it: the store's view converted to the API's body.
    let shown = settled::http::wire::ReceiptView::from(view(&fresh, "r", T0 + 300).await);
    let json = serde_json::to_string(&shown).unwrap();
    assert!(json.contains("\"leased\""));
    for token in [&c1.lease_token, &c2.lease_token, &c3.lease_token] {
        assert!(
            !json.contains(token.as_str()),
            "the receipt view exposes a lease token"
        );
    }
}

async fn dead_letters_page_in_order_and_redrive(fresh: Fresh) {
    let s = store(&fresh);
    // finalized_at orders the list before the id does.
    let batch = [
        receipt_with("m", FIN + 2, None, None),
        receipt_with("b", FIN + 1, None, None),
        receipt_with("a", FIN + 1, None, None),
        receipt_with("z", FIN, None, None),
        receipt_with("alive", FIN, None, None),
    ];
    enqueue_new(&fresh, &batch, T0).await;
    for (n, id) in ["m", "b", "a", "z"].into_iter().enumerate() {
        let c = claim(&fresh, id, "w", T0, 1_000).await;
        let outcome = permanent(SettlementFailureCode::Verification, &format!("d{n}"));
        record(&fresh, &c, &outcome, RetryPolicy::default(), T0 + n as u64)
            .await
            .unwrap();
    }
    let all = s.dead_letters(100, None).await.unwrap();
    let ids: Vec<_> = all.iter().map(|d| d.receipt_id.as_str()).collect();
    assert_eq!(ids, ["z", "a", "b", "m"]);
    let first = s.dead_letters(2, None).await.unwrap();
    assert_eq!(first, all[..2]);
    let cursor = (first[1].finalized_at, first[1].receipt_id.clone());
    let second = s.dead_letters(2, Some(cursor)).await.unwrap();
    assert_eq!(second, all[2..]);
    let last = (all[3].finalized_at, all[3].receipt_id.clone());
    assert!(s.dead_letters(2, Some(last)).await.unwrap().is_empty());
    let m = s.dead_letter(&rid("m")).await.unwrap().unwrap();
    assert_eq!(
        (m.finalized_at, m.attempts, m.code),
        (FIN + 2, 1, SettlementFailureCode::Verification)
    );
    assert_eq!(
        (m.detail_sha256.clone(), m.dead_lettered_at_ms),
        (sha256_hex("d0"), T0)
    );
    assert_eq!(s.dead_letter(&rid("alive")).await.unwrap(), None);
    assert_eq!(s.dead_letter(&rid("unknown")).await.unwrap(), None);

    let redriven = s
        .redrive(&rid("m"), ms(T0 + 50))
        .await
        .unwrap()
        .expect("redriven");
    assert_eq!(
        (redriven.state, redriven.attempts),
        (ReceiptState::Pending, 0)
    );
    assert_eq!(
        (redriven.next_visible_at_ms, redriven.dead_letter.clone()),
        (Some(T0 + 50), None)
    );
    let outcomes: Vec<_> = redriven
        .history
        .iter()
        .map(|h| h.outcome.as_str())
        .collect();
    assert_eq!(outcomes, ["permanent", "redrive"]);
    let entry = &redriven.history[1];
    assert_eq!(
        (
            entry.attempt,
            entry.worker_id.as_str(),
            entry.observed_at_ms
        ),
        (1, "operator", T0 + 50)
    );
    assert_eq!(redriven, view(&fresh, "m", T0 + 50).await);
    assert_eq!(s.dead_letters(100, None).await.unwrap().len(), 3);
    // Redrive only applies to dead letters.
    assert_eq!(s.redrive(&rid("m"), ms(T0 + 51)).await.unwrap(), None);
    assert_eq!(s.redrive(&rid("alive"), ms(T0 + 51)).await.unwrap(), None);
    assert_eq!(s.redrive(&rid("unknown"), ms(T0 + 51)).await.unwrap(), None);
    assert_eq!(view(&fresh, "m", T0 + 51).await.history.len(), 2);
    // Claimable again, counting attempts from zero, and it can settle.
    let claims = s
        .claim_due(&worker("w"), ms(T0 + 50), lease(1_000), limit(10))
        .await
        .unwrap();
    let ids: Vec<_> = claims.iter().map(|c| c.receipt_id.as_str()).collect();
    assert_eq!(ids, ["alive", "m"]);
    let c = claims.iter().find(|c| c.receipt_id == "m").unwrap();
    assert_eq!(c.attempts, 0);
    let route = record(&fresh, c, &rpc("x"), RetryPolicy::default(), T0 + 60)
        .await
        .unwrap();
    assert_eq!(
        route,
        Route::RetryScheduled {
            attempt: 1,
            next_visible_at_ms: T0 + 310
        }
    );
}

async fn status_counts_samples_and_oldest_due_age(fresh: Fresh) {
    let s = store(&fresh);
    let empty = s.status(ms(T0), 10).await.unwrap();
    assert_eq!(
        (empty.counts, empty.oldest_due_age_ms),
        (Default::default(), 0)
    );
    let batch = [
        receipt_with("p2", FIN + 1, None, Some(T0 - 700)),
        receipt_with("p1", FIN + 1, None, Some(T0 - 100)),
        receipt_with("p0", FIN, None, Some(T0 + 5_000)),
        receipt_with("l", FIN, None, Some(T0 - 900)),
        receipt_with("rs", FIN, None, None),
        receipt_with("st", FIN, None, None),
        receipt_with("sk", FIN, None, None),
        receipt_with("dl", FIN, None, None),
    ];
    enqueue_new(&fresh, &batch, T0).await;
    claim(&fresh, "l", "w", T0, 10_000).await;
    let policy = RetryPolicy::default();
    let c = claim(&fresh, "rs", "w", T0, 1_000).await;
    record(&fresh, &c, &rpc("x"), policy, T0).await.unwrap();
    let c = claim(&fresh, "st", "w", T0, 1_000).await;
    record(&fresh, &c, &accepted("t"), policy, T0)
        .await
        .unwrap();
    let c = claim(&fresh, "sk", "w", T0, 1_000).await;
    record(
        &fresh,
        &c,
        &skipped(SettlementSkipReason::Denied),
        policy,
        T0,
    )
    .await
    .unwrap();
    let c = claim(&fresh, "dl", "w", T0, 1_000).await;
    record(
        &fresh,
        &c,
        &permanent(SettlementFailureCode::Signature, "x"),
        policy,
        T0,
    )
    .await
    .unwrap();

    let now = T0 + 100;
    let status = s.status(ms(now), 2).await.unwrap();
    let c = status.counts;
    let counts = [
        c.pending,
        c.leased,
        c.retry_scheduled,
        c.settled,
        c.skipped,
        c.dead_lettered,
    ];
    assert_eq!(counts, [3, 1, 1, 1, 1, 1]);
    // p2 has been due since T0 - 700; "l" is older but leased, "rs" is not due.
    assert_eq!(status.oldest_due_age_ms, 800);
    let pending = &status.samples[&ReceiptState::Pending];
    let ids: Vec<_> = pending
        .receipts
        .iter()
        .map(|r| r.receipt_id.as_str())
        .collect();
    assert_eq!(
        ids,
        ["p0", "p1"],
        "ordered by (finalized_at, receipt_id), cut at the limit"
    );
    assert_eq!(
        (pending.total, pending.returned, pending.truncated),
        (3, 2, true)
    );
    let retry = &status.samples[&ReceiptState::RetryScheduled];
    assert_eq!(
        (retry.total, retry.truncated, retry.receipts[0].attempts),
        (1, false, 1)
    );
    assert_eq!(
        status.samples[&ReceiptState::Leased].receipts[0].receipt_id,
        "l"
    );
    assert_eq!(status.samples.len(), ReceiptState::ALL.len());
    // Later, the lease has expired and the retry is due: the oldest due is "l".
    let later = s.status(ms(T0 + 10_000), 10).await.unwrap();
    let c = later.counts;
    assert_eq!([c.pending, c.leased, c.retry_scheduled], [4, 0, 1]);
    assert_eq!(later.oldest_due_age_ms, 10_900);
    assert!(!later.samples[&ReceiptState::Pending].truncated);
}

async fn binding_is_stable_per_database_and_distinct_between_them(fresh: Fresh) {
    let binding = store(&fresh).settlement_store_binding();
    assert_eq!(binding.as_bytes().len(), 32);
    assert_ne!(binding.as_bytes(), &[0u8; 32]);
    assert_eq!(binding.to_hex().len(), 64);
    let again = open_store(&fresh.url, &PostgresOptions::default())
        .await
        .expect("reopen");
    assert_eq!(
        again.settlement_store_binding(),
        binding,
        "same database, same binding"
    );
    assert_eq!(again.backend(), fresh.store.backend());
    let other = match crate::common::fresh(fresh.store.backend().as_str()).await {
        Some(other) => other,
        None => fresh_sqlite().await,
    };
    assert_ne!(
        other.store.settlement_store_binding(),
        binding,
        "two databases, two bindings"
    );
    // Both handles write the same ledger.
    enqueue_new(&fresh, &[receipt("r")], T0).await;
    assert!(again.receipt(&rid("r"), ms(T0)).await.unwrap().is_some());
    store(&fresh).ping().await.unwrap();
}

crate::on_every_backend!(
    state_is_derived_from_the_clock_it_is_asked_at,
    history_keeps_digests_and_never_the_detail_or_token,
    dead_letters_page_in_order_and_redrive,
    status_counts_samples_and_oldest_due_age,
    binding_is_stable_per_database_and_distinct_between_them,
);
