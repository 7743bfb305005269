//! `status` keeps its counts in counters maintained by the database in the
//! same transaction as every write; here every kind of write is followed by
//! a full recount of the rows, done by the test in plain SQL, which the
//! status must match exactly (counts, samples and the oldest due age).

use settled::domain::{RetryPolicy, SettlementFailureCode, SettlementSkipReason};
use settled::store::{OperatorAction, ReceiptState, StatusView};

use super::support::*;
use crate::common::{Fresh, raw_exec, raw_scalars};

/// The state of a row at `now`, in SQL both backends speak.
fn state_sql(now: u64) -> String {
    format!(
        "(CASE WHEN status <> 'active' THEN status WHEN lease_until_ms > {now} THEN 'leased' \
         WHEN attempts = 0 THEN 'pending' ELSE 'retry_scheduled' END)"
    )
}

/// Status at `now` must equal a recount of every row.
async fn assert_exact(fresh: &Fresh, now: u64, step: &str) -> StatusView {
    let limit = 3;
    let status = store(fresh).status(ms(now), limit).await.unwrap();
    for state in ReceiptState::ALL {
        let (sql_state, name) = (state_sql(now), state.as_str());
        let counted: Vec<i64> = raw_scalars(
            fresh,
            &format!("SELECT COUNT(*) FROM receipts WHERE {sql_state} = '{name}'"),
        )
        .await;
        assert_eq!(
            status.counts.get(state),
            counted[0] as u64,
            "{step}: count of {name}"
        );
        let first: Vec<String> = raw_scalars(
            fresh,
            &format!(
                "SELECT receipt_id FROM receipts WHERE {sql_state} = '{name}' \
                 ORDER BY finalized_at, receipt_id LIMIT {limit}"
            ),
        )
        .await;
        let sample = &status.samples[&state];
        let sampled: Vec<String> = sample
            .receipts
            .iter()
            .map(|r| r.receipt_id.clone())
            .collect();
        assert_eq!(sampled, first, "{step}: sample of {name}");
        assert_eq!(sample.total, counted[0] as u64, "{step}: total of {name}");
    }
    // Not a state: of the pending receipts, those never attempted and not yet visible.
    let scheduled: Vec<i64> = raw_scalars(
        fresh,
        &format!(
            "SELECT COUNT(*) FROM receipts WHERE status = 'active' AND attempts = 0 \
             AND next_visible_at_ms > {now}"
        ),
    )
    .await;
    assert_eq!(
        status.counts.scheduled, scheduled[0] as u64,
        "{step}: count of scheduled"
    );
    assert!(status.counts.scheduled <= status.counts.pending, "{step}");
    let oldest: Vec<Option<i64>> = raw_scalars(
        fresh,
        &format!(
            "SELECT MIN(next_visible_at_ms) FROM receipts WHERE status = 'active' \
             AND held_at_ms IS NULL AND next_visible_at_ms <= {now} \
             AND (lease_until_ms IS NULL OR lease_until_ms <= {now})"
        ),
    )
    .await;
    let age = oldest[0].map_or(0, |t| now.saturating_sub(t as u64));
    assert_eq!(status.oldest_due_age_ms, age, "{step}: oldest due age");
    status
}

async fn counts_stay_exact_through_every_kind_of_write(fresh: Fresh) {
    let s = store(&fresh);
    let policy = RetryPolicy::default();
    assert_exact(&fresh, T0, "empty").await;

    let batch: Vec<_> = (0..12)
        .map(|n| receipt_with(&format!("r{n:02}"), FIN + n % 3, None, Some(T0 - 10 * n)))
        .collect();
    enqueue_new(&fresh, &batch, T0).await;
    enqueue_new(
        &fresh,
        &[receipt_with("later", FIN, None, Some(T0 + 50_000))],
        T0,
    )
    .await;
    // An identical replay and a conflicting one change nothing.
    s.enqueue(
        &[batch[0].clone(), receipt_with("r01", FIN + 9, None, None)],
        ms(T0),
    )
    .await
    .unwrap();
    assert_exact(&fresh, T0, "enqueue").await;

    let one = claim(&fresh, "r00", "w", T0, 1_000).await;
    let many = s
        .claim_due(&worker("w"), ms(T0), lease(1_000), limit(8))
        .await
        .unwrap();
    assert_eq!(many.len(), 8);
    assert_exact(&fresh, T0, "claims").await;

    // One of each route in a batch, plus a refused outcome.
    let outcomes = vec![
        (many[0].clone(), accepted("t0")),
        (many[1].clone(), skipped(SettlementSkipReason::ZeroCharge)),
        (many[2].clone(), rpc("x")),
        (
            many[3].clone(),
            permanent(SettlementFailureCode::Signature, "y"),
        ),
        (one.clone(), accepted("t1")),
        (one.clone(), accepted("t1 again")),
    ];
    let routed = s
        .record_claimed_outcomes(&leases(outcomes), policy, ms(T0 + 1))
        .await
        .unwrap();
    assert!(routed[..5].iter().all(Result::is_ok), "{routed:?}");
    assert_conflict(&routed[5]);
    assert_exact(&fresh, T0 + 1, "outcomes").await;

    // A retry exhausted by the policy dead-letters the receipt.
    let tight = RetryPolicy::new(0, 250, 2, 60_000).unwrap();
    record(&fresh, &many[4], &rpc("z"), tight, T0 + 2)
        .await
        .unwrap();
    assert_exact(&fresh, T0 + 2, "exhausted retry").await;

    let extended = s
        .extend_lease(&many[5], lease(60_000), ms(T0 + 3))
        .await
        .unwrap();
    s.release_lease(&many[6], ms(T0 + 3)).await.unwrap();
    assert_exact(&fresh, T0 + 3, "extend and release").await;

    // By the clock alone: the 1 s leases expire, the extended one does not.
    let expired = assert_exact(&fresh, T0 + 1_000, "leases expire").await;
    assert_eq!(expired.counts.leased, 1);
    // An expired lease taken over, and a retry claimed once it is due.
    let again = s
        .claim_due(&worker("w2"), ms(T0 + 1_000), lease(1_000), limit(2))
        .await
        .unwrap();
    assert_eq!(again.len(), 2);
    assert_exact(&fresh, T0 + 1_000, "expired leases taken over").await;
    record(&fresh, &extended, &rpc("w"), policy, T0 + 1_001)
        .await
        .unwrap();
    assert_exact(&fresh, T0 + 1_001, "retry of an extended lease").await;

    let letter = s.redrive(&many[3].receipt_id, ms(T0 + 2_000)).await;
    assert!(letter.unwrap().is_some());
    assert_exact(&fresh, T0 + 2_000, "redrive").await;

    // Operators' actions: a hold keeps the count where it was and leaves the
    // oldest due; a cancel moves receipts to their own bucket.
    let ids: Vec<_> = ["r07", "r08", "r09", "later"].map(rid).to_vec();
    let hold = OperatorAction::Hold { reason: None };
    s.act(&hold, &ids[..2], None, ms(T0 + 2_000), false)
        .await
        .unwrap();
    assert_exact(&fresh, T0 + 2_000, "hold").await;
    let cancel = OperatorAction::Cancel {
        reason: "stop".into(),
    };
    let canceled = s
        .act(&cancel, &ids, None, ms(T0 + 2_000), false)
        .await
        .unwrap();
    assert!(canceled.iter().all(Result::is_ok), "{canceled:?}");
    let after = assert_exact(&fresh, T0 + 2_000, "cancel").await;
    assert!(after.counts.canceled >= 3, "{:?}", after.counts);

    let purged = s.purge_finished(ms(T0 + 10), 1).await.unwrap();
    assert_eq!(purged, 1);
    assert_exact(&fresh, T0 + 2_000, "one purge").await;
    s.purge_finished(ms(T0 + 10), 100).await.unwrap();
    assert_exact(&fresh, T0 + 2_000, "purge the rest").await;
    assert_exact(&fresh, T0 + 60_000, "much later").await;
}

/// `scheduled` counts receipts enqueued for later until they come due, and
/// never a retry waiting out its backoff (that is `retry_scheduled`), a
/// release or a redrive (due at once).
async fn scheduled_counts_never_attempted_receipts_until_they_are_visible(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(
        &fresh,
        &[
            receipt("now"),
            receipt_with("in-10s", FIN, None, Some(T0 + 10_000)),
            receipt_with("in-1h", FIN, None, Some(T0 + 3_600_000)),
            receipt_with("past", FIN, None, Some(T0 - 5_000)),
        ],
        T0,
    )
    .await;
    let at_t0 = assert_exact(&fresh, T0, "enqueued").await;
    assert_eq!((at_t0.counts.pending, at_t0.counts.scheduled), (4, 2));
    // Visible *at* visible_at_ms: due, no longer scheduled.
    let later = assert_exact(&fresh, T0 + 10_000, "the first comes due").await;
    assert_eq!((later.counts.pending, later.counts.scheduled), (4, 1));
    let c = claim(&fresh, "in-10s", "w", T0 + 10_000, 1_000).await;
    record(&fresh, &c, &rpc("x"), RetryPolicy::default(), T0 + 10_001)
        .await
        .unwrap();
    let retry = assert_exact(&fresh, T0 + 10_001, "a retry waits its backoff").await;
    assert_eq!(
        (retry.counts.retry_scheduled, retry.counts.scheduled),
        (1, 1)
    );
    let c = claim(&fresh, "now", "w", T0 + 10_002, 1_000).await;
    s.release_lease(&c, ms(T0 + 10_003)).await.unwrap();
    assert_exact(&fresh, T0 + 10_003, "released").await;
    let c = claim(&fresh, "past", "w", T0 + 10_004, 1_000).await;
    let dead = permanent(SettlementFailureCode::Signature, "y");
    record(&fresh, &c, &dead, RetryPolicy::default(), T0 + 10_005)
        .await
        .unwrap();
    s.redrive(&rid("past"), ms(T0 + 10_006)).await.unwrap();
    assert_exact(&fresh, T0 + 10_006, "redriven").await;
    let hour = assert_exact(&fresh, T0 + 3_600_000, "the hour is up").await;
    assert_eq!(hour.counts.scheduled, 0);
}

async fn counts_of_rows_stored_before_the_counters_are_back_filled(fresh: Fresh) {
    // Rows written around the store, as the 0004 migration finds them in a
    // database already in use: take the counters away, load rows in bulk,
    // then run the migration's back-fill again.
    let sqlite = fresh.url.starts_with("sqlite:");
    let (load, rebuild) = if sqlite {
        (
            include_str!("../../bench/status-load.sqlite.sql").replace("@n", "3000"),
            "DELETE FROM receipt_counts; \
             INSERT INTO receipt_counts (id, fresh, retried, settled, skipped, dead_lettered, \
             canceled) \
             SELECT 1, COUNT(*) FILTER (WHERE status = 'active' AND attempts = 0), \
             COUNT(*) FILTER (WHERE status = 'active' AND attempts > 0), \
             COUNT(*) FILTER (WHERE status = 'settled'), \
             COUNT(*) FILTER (WHERE status = 'skipped'), \
             COUNT(*) FILTER (WHERE status = 'dead_lettered'), \
             COUNT(*) FILTER (WHERE status = 'canceled') FROM receipts",
        )
    } else {
        (
            include_str!("../../bench/status-load.postgres.sql")
                .replace(":n", "3000")
                .replace("VACUUM ANALYZE", "ANALYZE"),
            "DELETE FROM receipt_counts; \
             INSERT INTO receipt_counts (fresh, retried, settled, skipped, dead_lettered) \
             SELECT COUNT(*) FILTER (WHERE status = 'active' AND attempts = 0), \
             COUNT(*) FILTER (WHERE status = 'active' AND attempts > 0), \
             COUNT(*) FILTER (WHERE status = 'settled'), \
             COUNT(*) FILTER (WHERE status = 'skipped'), \
             COUNT(*) FILTER (WHERE status = 'dead_lettered') FROM receipts",
        )
    };
    enqueue_new(&fresh, &[receipt("before")], T0).await;
    raw_multi(&fresh, &load).await;
    raw_multi(&fresh, rebuild).await;
    // The loader's clock: 2023, between its expired and its live leases.
    let now = 1_700_000_100_000;
    let status = assert_exact(&fresh, now, "back-filled").await;
    assert_eq!(status.counts.settled, 1_800);
    assert_eq!(status.counts.leased, 2, "two live leases, one expired");
    // The counters keep counting after the back-fill.
    let c = claim(&fresh, "r0000000071", "w", now, 1_000).await;
    record(&fresh, &c, &accepted("t"), RetryPolicy::default(), now)
        .await
        .unwrap();
    assert_exact(&fresh, now, "after the back-fill").await;
}

/// Several statements in one string, straight on the test's database.
async fn raw_multi(fresh: &Fresh, sql: &str) {
    let code: String = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in code.split(';').map(str::trim) {
        if statement.is_empty()
            || statement.eq_ignore_ascii_case("begin")
            || statement.eq_ignore_ascii_case("commit")
        {
            continue;
        }
        raw_exec(fresh, statement).await.expect("raw statement");
    }
}

crate::on_every_backend!(
    counts_stay_exact_through_every_kind_of_write,
    scheduled_counts_never_attempted_receipts_until_they_are_visible,
    counts_of_rows_stored_before_the_counters_are_back_filled,
);
