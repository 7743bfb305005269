//! Finding receipts: every filter, both orders and several page sizes must
//! page through exactly the receipts a plain reading of each receipt's view
//! selects; pages examine a bounded number of rows; and every statement a
//! search runs is an index range, never a scan of `receipts`.

use settled::domain::{RetryPolicy, SettlementFailureCode, SettlementSkipReason};
use settled::store::search::{
    Bind, Dialect, Range, SCAN_BUDGET, SearchKey, Source, StateFilter, statement,
};
use settled::store::{ReceiptFilter, ReceiptState, ReceiptView, SearchOrder, SearchPage};
use sqlx::{Connection, Row};

use super::support::*;
use crate::common::Fresh;

mod plans;

use plans::*;

/// The server clock the searches run at: after every write below.
const NOW: u64 = T0 + 100;

/// Receipts in every state, with ties on `finalized_at`.
async fn populate(fresh: &Fresh) -> Vec<&'static str> {
    let ids: [(&str, u64, Option<u64>); 10] = [
        ("p-a", 10, None),
        ("p-b", 20, None),
        ("s-a", 15, Some(T0 + 1_000_000)),
        ("l-a", 30, None),
        ("l-b", 30, None),
        ("r-a", 12, None),
        ("set-a", 40, None),
        ("sk-a", 5, None),
        ("d-a", 25, None),
        ("x-exp", 22, None),
    ];
    let receipts: Vec<_> = ids
        .iter()
        .map(|(id, fin, visible)| receipt_with(id, *fin, None, *visible))
        .collect();
    enqueue_new(fresh, &receipts, T0).await;
    let policy = RetryPolicy::default();
    claim(fresh, "l-a", "w1", T0, 60_000).await;
    claim(fresh, "l-b", "w2", T0, 60_000).await;
    // Leased by w1, expired by NOW: pending again, with no owner.
    claim(fresh, "x-exp", "w1", T0, 10).await;
    let c = claim(fresh, "r-a", "w1", T0, 1_000).await;
    record(fresh, &c, &rpc("down"), policy, T0 + 5)
        .await
        .unwrap();
    let c = claim(fresh, "set-a", "w1", T0, 1_000).await;
    record(fresh, &c, &accepted("tx"), policy, T0 + 1)
        .await
        .unwrap();
    let c = claim(fresh, "sk-a", "w1", T0, 1_000).await;
    let skip = skipped(SettlementSkipReason::Denied);
    record(fresh, &c, &skip, policy, T0 + 2).await.unwrap();
    let c = claim(fresh, "d-a", "w1", T0, 1_000).await;
    let code = SettlementFailureCode::InvalidActionHash;
    record(fresh, &c, &permanent(code, "bad"), policy, T0 + 3)
        .await
        .unwrap();
    ids.iter().map(|(id, _, _)| *id).collect()
}

/// Each receipt's view at NOW and its `finished_at_ms`, read once.
async fn snapshot(fresh: &Fresh, ids: &[&str]) -> Vec<(ReceiptView, Option<i64>)> {
    let mut all = Vec::new();
    for id in ids {
        let finished = raw_i64(fresh, "finished_at_ms", id).await;
        all.push((view(fresh, id, NOW).await, finished));
    }
    all
}

/// What `filter` selects, read from each receipt's own view, in `order`.
fn expected(
    snapshot: &[(ReceiptView, Option<i64>)],
    filter: &ReceiptFilter,
    order: SearchOrder,
) -> Vec<String> {
    let mut picked = Vec::new();
    for (v, finished) in snapshot {
        let finished = *finished;
        let state_ok = match filter.state {
            None => true,
            Some(StateFilter::Scheduled) => {
                v.state == ReceiptState::Pending && v.next_visible_at_ms.unwrap() > NOW
            }
            Some(s) => v.state.as_str() == s.as_str(),
        };
        let ok = state_ok
            && filter
                .code
                .is_none_or(|c| v.last_failure.as_ref().is_some_and(|f| f.code == c))
            && filter
                .owner
                .as_ref()
                .is_none_or(|o| v.lease.as_ref().is_some_and(|l| *o == l.owner.as_str()))
            && filter
                .prefix
                .as_deref()
                .is_none_or(|p| v.receipt_id.starts_with(p))
            && filter.finalized.contains(v.finalized_at)
            && (!filter.finished_ms.is_bounded()
                || finished.is_some_and(|f| filter.finished_ms.contains(f as u64)));
        if ok {
            picked.push((v.finalized_at, v.receipt_id.clone()));
        }
    }
    picked.sort();
    if order == SearchOrder::Newest {
        picked.reverse();
    }
    picked.into_iter().map(|(_, id)| id).collect()
}

/// Every receipt a search returns, following the cursor to the end; and
/// how many pages that took.
async fn collect(
    fresh: &Fresh,
    filter: &ReceiptFilter,
    order: SearchOrder,
    limit: usize,
) -> (Vec<String>, usize) {
    let mut after = None;
    let mut seen = Vec::new();
    for pages in 1..=10_000 {
        let page = SearchPage {
            order,
            limit,
            after: after.take(),
        };
        let found = store(fresh)
            .find_receipts(filter, &page, ms(NOW))
            .await
            .expect("search");
        assert!(found.receipts.len() <= limit, "{filter:?}: page over limit");
        seen.extend(found.receipts.into_iter().map(|r| r.receipt_id));
        match found.next {
            Some(next) => after = Some(next),
            None => return (seen, pages),
        }
    }
    panic!("{filter:?}: the cursor never reached the end");
}

fn filters() -> Vec<ReceiptFilter> {
    let mut all = vec![ReceiptFilter::default()];
    for state in StateFilter::ALL {
        all.push(ReceiptFilter {
            state: Some(state),
            ..ReceiptFilter::default()
        });
    }
    let range = |from, to| Range { from, to };
    let base = ReceiptFilter::default;
    all.extend([
        ReceiptFilter {
            code: Some(SettlementFailureCode::Rpc),
            ..base()
        },
        ReceiptFilter {
            code: Some(SettlementFailureCode::InvalidActionHash),
            ..base()
        },
        ReceiptFilter {
            code: Some(SettlementFailureCode::Rpc),
            state: Some(StateFilter::RetryScheduled),
            ..base()
        },
        ReceiptFilter {
            code: Some(SettlementFailureCode::Rpc),
            state: Some(StateFilter::Settled),
            ..base()
        },
        ReceiptFilter {
            code: Some(SettlementFailureCode::InvalidActionHash),
            finished_ms: range(Some(T0 + 3), Some(T0 + 4)),
            prefix: Some("d".into()),
            ..base()
        },
        ReceiptFilter {
            owner: Some(worker("w1")),
            ..base()
        },
        ReceiptFilter {
            owner: Some(worker("w1")),
            state: Some(StateFilter::Pending),
            ..base()
        },
        ReceiptFilter {
            owner: Some(worker("w2")),
            state: Some(StateFilter::Leased),
            ..base()
        },
        ReceiptFilter {
            prefix: Some("l-".into()),
            ..base()
        },
        ReceiptFilter {
            prefix: Some("p".into()),
            state: Some(StateFilter::Pending),
            finalized: range(Some(15), None),
            ..base()
        },
        ReceiptFilter {
            finalized: range(Some(12), Some(30)),
            ..base()
        },
        ReceiptFilter {
            finalized: range(None, Some(15)),
            ..base()
        },
        ReceiptFilter {
            finished_ms: range(Some(T0 + 2), Some(T0 + 4)),
            ..base()
        },
        ReceiptFilter {
            finished_ms: range(Some(T0), None),
            state: Some(StateFilter::Settled),
            ..base()
        },
        ReceiptFilter {
            finished_ms: range(Some(T0), None),
            state: Some(StateFilter::Leased),
            ..base()
        },
    ]);
    all
}

async fn every_filter_pages_through_exactly_what_it_selects(fresh: Fresh) {
    let ids = populate(&fresh).await;
    let snap = snapshot(&fresh, &ids).await;
    for filter in filters() {
        for order in [SearchOrder::Newest, SearchOrder::Oldest] {
            let want = expected(&snap, &filter, order);
            for limit in [1, 2, 50] {
                let (got, _) = collect(&fresh, &filter, order, limit).await;
                assert_eq!(got, want, "{filter:?} {order:?} limit {limit}");
            }
        }
    }
    // Sanity of the expectations themselves.
    let state = |s| ReceiptFilter {
        state: Some(s),
        ..ReceiptFilter::default()
    };
    let oldest = SearchOrder::Oldest;
    assert_eq!(
        expected(&snap, &state(StateFilter::Pending), oldest),
        ["p-a", "s-a", "p-b", "x-exp"]
    );
    assert_eq!(
        expected(&snap, &state(StateFilter::Scheduled), oldest),
        ["s-a"]
    );
    assert_eq!(
        expected(&snap, &state(StateFilter::Leased), SearchOrder::Newest),
        ["l-b", "l-a"]
    );
}

async fn a_found_receipt_shows_its_lease_failure_and_finish(fresh: Fresh) {
    populate(&fresh).await;
    let page = SearchPage {
        order: SearchOrder::Oldest,
        limit: 50,
        after: None,
    };
    let found = store(&fresh)
        .find_receipts(&ReceiptFilter::default(), &page, ms(NOW))
        .await
        .unwrap();
    assert_eq!(found.receipts.len(), 10);
    assert_eq!(found.next, None, "a page holding every receipt is the last");
    let by_id = |id: &str| {
        found
            .receipts
            .iter()
            .find(|r| r.receipt_id == id)
            .unwrap()
            .clone()
    };
    let leased = by_id("l-a");
    assert_eq!(leased.state, ReceiptState::Leased);
    let lease = leased.lease.unwrap();
    assert_eq!((lease.owner.as_str(), lease.until_ms), ("w1", T0 + 60_000));
    let expired = by_id("x-exp");
    assert_eq!(
        (expired.state, expired.lease),
        (ReceiptState::Pending, None)
    );
    let dead = by_id("d-a");
    assert_eq!(dead.state, ReceiptState::DeadLettered);
    assert_eq!(
        dead.last_failure.unwrap().code,
        SettlementFailureCode::InvalidActionHash
    );
    assert_eq!(dead.finished_at_ms, Some(T0 + 3));
    assert_eq!(dead.next_visible_at_ms, None);
    let retried = by_id("r-a");
    assert_eq!(
        (retried.state, retried.attempts),
        (ReceiptState::RetryScheduled, 1)
    );
    assert_eq!(by_id("s-a").next_visible_at_ms, Some(T0 + 1_000_000));
    assert_eq!(by_id("set-a").finished_at_ms, Some(T0 + 1));
    // The lease token appears nowhere in what a search returns.
    let token = claim(&fresh, "p-a", "w9", NOW, 60_000)
        .await
        .claim
        .lease_token;
    let found = store(&fresh)
        .find_receipts(&ReceiptFilter::default(), &page, ms(NOW))
        .await
        .unwrap();
    assert!(!format!("{found:?}").contains(token.as_str()));
}

/// A filter checked row by row examines at most SCAN_BUDGET rows per page:
/// a rare match deep in the range takes several pages, the first ones
/// empty but with a cursor.
async fn a_page_examines_a_bounded_number_of_rows(fresh: Fresh) {
    let n = SCAN_BUDGET * 2 + 100;
    let bulk: Vec<_> = (0..n)
        .map(|i| receipt_with(&format!("bulk-{i:05}"), FIN, None, None))
        .chain([receipt_with("zz-last", FIN + 1, None, None)])
        .collect();
    enqueue_new(&fresh, &bulk, T0).await;
    let filter = ReceiptFilter {
        prefix: Some("zz".into()),
        ..ReceiptFilter::default()
    };
    let first = store(&fresh)
        .find_receipts(
            &filter,
            &SearchPage {
                order: SearchOrder::Oldest,
                limit: 10,
                after: None,
            },
            ms(NOW),
        )
        .await
        .unwrap();
    assert!(first.receipts.is_empty());
    assert_eq!(
        first.next,
        Some(SearchKey {
            finalized_at: FIN,
            receipt_id: format!("bulk-{:05}", SCAN_BUDGET - 1),
        }),
        "an empty page continues after the last row it examined"
    );
    let (got, pages) = collect(&fresh, &filter, SearchOrder::Oldest, 10).await;
    assert_eq!((got, pages), (vec!["zz-last".to_owned()], 3));
    // Newest first finds it on the first page, and the page after is the end.
    let (got, pages) = collect(&fresh, &filter, SearchOrder::Newest, 10).await;
    assert_eq!((got, pages), (vec!["zz-last".to_owned()], 3));
    // Without a row-by-row filter a page reads only what it returns.
    let (got, pages) = collect(&fresh, &ReceiptFilter::default(), SearchOrder::Oldest, 500).await;
    assert_eq!((got.len(), pages), (n + 1, n.div_ceil(500)));
}

/// A receipt keeps its last failure after it settles and after a redrive,
/// so a search by code still finds it, in its new state.
async fn a_search_by_code_finds_receipts_that_failed_once(fresh: Fresh) {
    enqueue_new(&fresh, &[receipt("ok-later"), receipt("redriven")], T0).await;
    let policy = RetryPolicy::default();
    let c = claim(&fresh, "ok-later", "w", T0, 1_000).await;
    record(&fresh, &c, &rpc("flaky"), policy, T0).await.unwrap();
    let c = claim(&fresh, "ok-later", "w", T0 + 10_000, 1_000).await;
    record(&fresh, &c, &accepted("tx"), policy, T0 + 10_000)
        .await
        .unwrap();
    let c = claim(&fresh, "redriven", "w", T0, 1_000).await;
    let code = SettlementFailureCode::InvalidActionHash;
    record(&fresh, &c, &permanent(code, "x"), policy, T0)
        .await
        .unwrap();
    store(&fresh)
        .redrive(&rid("redriven"), ms(T0 + 20_000))
        .await
        .unwrap()
        .expect("dead-lettered");
    let now = T0 + 30_000;
    let find = |code| ReceiptFilter {
        code: Some(code),
        ..ReceiptFilter::default()
    };
    let page = SearchPage {
        order: SearchOrder::Oldest,
        limit: 10,
        after: None,
    };
    let settled = store(&fresh)
        .find_receipts(&find(SettlementFailureCode::Rpc), &page, ms(now))
        .await
        .unwrap();
    let states: Vec<_> = settled
        .receipts
        .iter()
        .map(|r| (r.receipt_id.as_str(), r.state))
        .collect();
    assert_eq!(states, [("ok-later", ReceiptState::Settled)]);
    let pending = ReceiptFilter {
        state: Some(StateFilter::Pending),
        ..find(code)
    };
    let found = store(&fresh)
        .find_receipts(&pending, &page, ms(now))
        .await
        .unwrap();
    let states: Vec<_> = found
        .receipts
        .iter()
        .map(|r| (r.receipt_id.as_str(), r.state, r.attempts))
        .collect();
    assert_eq!(states, [("redriven", ReceiptState::Pending, 0)]);
    assert_eq!(found.next, None);
}

crate::on_every_backend!(
    every_filter_pages_through_exactly_what_it_selects,
    a_found_receipt_shows_its_lease_failure_and_finish,
    a_search_by_code_finds_receipts_that_failed_once,
    a_page_examines_a_bounded_number_of_rows,
    every_search_statement_reads_an_index_range,
);
