//! The history feed: every history entry in commit order after a position,
//! with no skip and no repeat across pages, and retention that tells a
//! reader it fell behind (docs/operators.md, "Follow every outcome").

use settled::domain::{RetryPolicy, SettlementFailureCode, SettlementSkipReason};
use settled::store::{FeedEntry, FeedPosition, FeedRead, FeedStart};

use super::support::*;
use crate::common::{Fresh, pg_raw};

/// A page; it must not be expired or refused.
async fn page(fresh: &Fresh, start: FeedStart, limit: usize) -> (Vec<FeedEntry>, FeedPosition) {
    match store(fresh).history_feed(start, limit).await.expect("feed") {
        FeedRead::Page { entries, next } => (entries, next),
        other => panic!("expected a page after {start:?}, got {other:?}"),
    }
}

/// Read on from `start`, `limit` at a time, until `n` entries came. On
/// PostgreSQL an entry shows once every transaction older than its own has
/// ended, on the whole database server (other tests' included), so a
/// committed entry may take a moment to show (as long as a transaction of
/// another test, on any database of the server, stays open).
async fn follow(
    fresh: &Fresh,
    start: FeedStart,
    n: usize,
    limit: usize,
) -> (Vec<FeedEntry>, FeedPosition) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut all = Vec::new();
    let mut start = start;
    loop {
        let (entries, next) = page(fresh, start, limit).await;
        all.extend(entries);
        if all.len() >= n {
            return (all, next);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} entries showed: {:?}",
            all.len(),
            pairs(&all)
        );
        start = FeedStart::After(next);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn at(cursor: &str) -> FeedStart {
    FeedStart::After(cursor.parse().expect("a cursor the feed gave"))
}

/// `(receipt_id, outcome)` of each entry.
fn pairs(entries: &[FeedEntry]) -> Vec<(String, String)> {
    entries
        .iter()
        .map(|e| (e.receipt_id.clone(), e.entry.outcome.clone()))
        .collect()
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(r, o)| ((*r).to_owned(), (*o).to_owned()))
        .collect()
}

/// Write one entry for `id` (claimed now): a retryable outcome.
async fn retry(fresh: &Fresh, id: &str, now: u64) {
    let c = claim(fresh, id, "w", now, 1_000).await;
    record(fresh, &c, &rpc("x"), RetryPolicy::default(), now)
        .await
        .expect("retry");
}

/// Settle `id` (claimed now): one `accepted` entry.
async fn settle(fresh: &Fresh, id: &str, now: u64) {
    let c = claim(fresh, id, "w", now, 1_000).await;
    record(fresh, &c, &accepted("tx"), RetryPolicy::default(), now)
        .await
        .expect("settle");
}

async fn every_kind_of_entry_comes_in_commit_order(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("b"), receipt("a"), receipt("c")], T0).await;
    let (entries, next) = page(&fresh, FeedStart::Beginning, 100).await;
    assert!(entries.is_empty(), "enqueues write no history");
    assert_eq!(next, FeedPosition::START);

    let cb = claim(&fresh, "b", "w1", T0, 1_000).await;
    let ca = claim(&fresh, "a", "w2", T0, 1_000).await;
    // a first, although b was claimed first: commit order is what counts.
    record(
        &fresh,
        &ca,
        &accepted("tx-a"),
        RetryPolicy::default(),
        T0 + 1,
    )
    .await
    .unwrap();
    s.release_lease(&cb, ms(T0 + 2)).await.unwrap();
    let cc = claim(&fresh, "c", "w3", T0 + 3, 1_000).await;
    let dead = permanent(SettlementFailureCode::Signature, "no");
    record(&fresh, &cc, &dead, RetryPolicy::default(), T0 + 4)
        .await
        .unwrap();
    s.redrive(&rid("c"), ms(T0 + 5))
        .await
        .unwrap()
        .expect("redriven");
    let cb = claim(&fresh, "b", "w1", T0 + 6, 1_000).await;
    let skip = skipped(SettlementSkipReason::Denied);
    record(&fresh, &cb, &skip, RetryPolicy::default(), T0 + 7)
        .await
        .unwrap();

    let (entries, next) = follow(&fresh, FeedStart::Beginning, 5, 100).await;
    assert_eq!(
        pairs(&entries),
        expect(&[
            ("a", "accepted"),
            ("b", "released"),
            ("c", "permanent"),
            ("c", "redrive"),
            ("b", "skipped"),
        ])
    );
    // Each entry is the receipt's history entry, as the receipt shows it.
    let a = view(&fresh, "a", T0 + 7).await;
    assert_eq!(entries[0].entry, a.history[0]);
    assert_eq!(entries[0].entry.worker_id, "w2");
    let c = view(&fresh, "c", T0 + 7).await;
    assert_eq!(
        (entries[2].entry.clone(), entries[3].entry.clone()),
        (c.history[0].clone(), c.history[1].clone())
    );
    // Positions rise strictly, and `next` is the last one.
    let positions: Vec<FeedPosition> = entries.iter().map(|e| e.cursor.parse().unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert_eq!(Some(&next), positions.last());
    // Nothing new: the same position back, no entries.
    let (more, again) = page(&fresh, FeedStart::After(next), 100).await;
    assert!(more.is_empty());
    assert_eq!(again, next);
}

async fn pages_neither_skip_nor_repeat_while_writes_go_on(fresh: Fresh) {
    let ids: Vec<String> = (0..30).map(|i| format!("r{i:02}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(&fresh, &receipts, T0).await;
    let mut written = Vec::new();
    let mut read = Vec::new();
    let mut start = FeedStart::Beginning;
    for (i, id) in ids.iter().enumerate() {
        settle(&fresh, id, T0 + i as u64).await;
        written.push(id.clone());
        if i % 4 == 3 {
            let (entries, next) = page(&fresh, start, 3).await;
            read.extend(entries.iter().map(|e| e.receipt_id.clone()));
            start = FeedStart::After(next);
        }
    }
    let (rest, next) = follow(&fresh, start, written.len() - read.len(), 7).await;
    read.extend(rest.iter().map(|e| e.receipt_id.clone()));
    assert_eq!(read, written);
    let (more, _) = page(&fresh, FeedStart::After(next), 7).await;
    assert!(more.is_empty());
}

async fn latest_starts_at_the_tip(fresh: Fresh) {
    let (entries, next) = page(&fresh, FeedStart::Latest, 10).await;
    assert_eq!((entries.len(), next), (0, FeedPosition::START));
    enqueue_new(&fresh, &[receipt("a"), receipt("b")], T0).await;
    settle(&fresh, "a", T0).await;
    let (all, end) = follow(&fresh, FeedStart::Beginning, 1, 10).await;
    assert_eq!(pairs(&all), expect(&[("a", "accepted")]));
    let (entries, tip) = page(&fresh, FeedStart::Latest, 10).await;
    assert!(entries.is_empty(), "latest shows only what comes later");
    assert_eq!(tip, end);
    retry(&fresh, "b", T0 + 1).await;
    let (entries, _) = follow(&fresh, FeedStart::After(tip), 1, 10).await;
    assert_eq!(pairs(&entries), expect(&[("b", "retryable")]));
}

async fn a_position_past_the_tip_is_refused(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("a")], T0).await;
    settle(&fresh, "a", T0).await;
    let (_, tip) = follow(&fresh, FeedStart::Beginning, 1, 10).await;
    let past = FeedPosition {
        tx: tip.tx,
        id: tip.id + 1_000,
    };
    let read = store(&fresh)
        .history_feed(FeedStart::After(past), 10)
        .await
        .unwrap();
    assert_eq!(read, FeedRead::Ahead { tip });
}

async fn retention_tells_a_reader_it_fell_behind(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(
        &fresh,
        &[
            receipt("old-1"),
            receipt("old-2"),
            receipt("dead"),
            receipt("new"),
        ],
        T0,
    )
    .await;
    settle(&fresh, "old-1", T0).await;
    let (first, _) = follow(&fresh, FeedStart::Beginning, 1, 1).await;
    assert_eq!(pairs(&first), expect(&[("old-1", "accepted")]));
    settle(&fresh, "old-2", T0 + 1).await;
    let c = claim(&fresh, "dead", "w", T0 + 2, 1_000).await;
    let dead = permanent(SettlementFailureCode::Signature, "no");
    record(&fresh, &c, &dead, RetryPolicy::default(), T0 + 2)
        .await
        .unwrap();
    settle(&fresh, "new", T0 + 5_000).await;

    // A reader that has read old-1 only, and one that read nothing.
    assert_eq!(s.purge_finished(ms(T0 + 100), 100).await.unwrap(), 2);
    let horizon = match s.history_feed(at(&first[0].cursor), 10).await.unwrap() {
        FeedRead::Expired { horizon } => horizon,
        other => panic!("old-2's entry is gone unread: {other:?}"),
    };
    let from_zero = s
        .history_feed(FeedStart::After(FeedPosition::START), 10)
        .await
        .unwrap();
    assert_eq!(from_zero, FeedRead::Expired { horizon });
    // From the beginning: what is left after the horizon, the dead letter's
    // entry included.
    let (rest, _) = follow(&fresh, FeedStart::Beginning, 2, 10).await;
    assert_eq!(
        pairs(&rest),
        expect(&[("dead", "permanent"), ("new", "accepted")])
    );
    // A reader that had read everything purged goes on unaffected.
    let (_, tip) = page(&fresh, FeedStart::Latest, 10).await;
    assert_eq!(s.purge_finished(ms(T0 + 10_000), 100).await.unwrap(), 0);
    let (none, same) = page(&fresh, FeedStart::After(tip), 10).await;
    assert_eq!((none.len(), same), (0, tip));
}

/// The receipt holding the newest entry stays until a newer entry exists:
/// on SQLite its id would otherwise be handed out again, behind positions
/// readers hold.
async fn retention_keeps_the_newest_entry_so_positions_are_never_reused(fresh: Fresh) {
    let s = store(&fresh);
    enqueue_new(&fresh, &[receipt("a"), receipt("b"), receipt("c")], T0).await;
    settle(&fresh, "a", T0).await;
    settle(&fresh, "b", T0).await;
    let (_, tip) = follow(&fresh, FeedStart::Beginning, 2, 10).await;
    assert_eq!(s.purge_finished(ms(T0 + 100), 100).await.unwrap(), 1);
    assert!(s.receipt(&rid("b"), ms(T0)).await.unwrap().is_some());
    retry(&fresh, "c", T0 + 200).await;
    let (entries, _) = follow(&fresh, FeedStart::After(tip), 1, 10).await;
    assert_eq!(pairs(&entries), expect(&[("c", "retryable")]));
    // Now b's entry is not the newest and may go.
    assert_eq!(s.purge_finished(ms(T0 + 100), 100).await.unwrap(), 1);
    retry(&fresh, "c", T0 + 1_200).await;
    let (entries, _) = follow(&fresh, FeedStart::After(tip), 2, 10).await;
    assert_eq!(
        pairs(&entries),
        expect(&[("c", "retryable"), ("c", "retryable")])
    );
}

crate::on_every_backend!(
    every_kind_of_entry_comes_in_commit_order,
    pages_neither_skip_nor_repeat_while_writes_go_on,
    latest_starts_at_the_tip,
    a_position_past_the_tip_is_refused,
    retention_tells_a_reader_it_fell_behind,
    retention_keeps_the_newest_entry_so_positions_are_never_reused,
);

/// PostgreSQL: an entry whose transaction took its id first but committed
/// last is not skipped by a reader that already read the later one's
/// neighbourhood: it is not served before it commits, and then served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_late_commit_is_not_skipped() {
    let Some(fresh) = crate::common::fresh_postgres().await else {
        return;
    };
    enqueue_new(
        &fresh,
        &[receipt("early"), receipt("late"), receipt("later")],
        T0,
    )
    .await;
    settle(&fresh, "late", T0).await;
    let (first, mut position) = follow(&fresh, FeedStart::Beginning, 1, 10).await;
    assert_eq!(pairs(&first), expect(&[("late", "accepted")]));

    // A transaction writes an entry (taking the next id) and stays open…
    let mut held = pg_raw(&fresh.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut held).await.unwrap();
    sqlx::query(
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, worker_id, observed_at_ms) \
         VALUES ('early', 0, 'released', 'held', 1)",
    )
    .execute(&mut held)
    .await
    .unwrap();
    // …while the store commits another entry with a larger id.
    retry(&fresh, "later", T0 + 2_000).await;
    let (during, next) = page(&fresh, FeedStart::After(position), 10).await;
    assert!(
        during.is_empty(),
        "nothing is served past a transaction still running: {:?}",
        pairs(&during)
    );
    position = next;
    sqlx::query("COMMIT").execute(&mut held).await.unwrap();
    let (after, _) = follow(&fresh, FeedStart::After(position), 2, 10).await;
    assert_eq!(
        pairs(&after),
        expect(&[("early", "released"), ("later", "retryable")])
    );
    let ids: Vec<i64> = crate::common::raw_scalars(
        &fresh,
        "SELECT id FROM receipt_history WHERE worker_id = 'held' OR outcome = 'retryable' \
         ORDER BY id",
    )
    .await;
    assert_eq!(ids.len(), 2);
    assert_eq!(
        after[0].cursor.rsplit_once('-').unwrap().1,
        ids[0].to_string(),
        "the held entry took the smaller id, yet is not skipped"
    );
}
