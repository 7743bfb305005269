//! Tests of the search plan (`search`).

use super::*;

#[test]
fn each_state_reads_only_the_indexes_that_can_hold_it() {
    let with = |state| ReceiptFilter {
        state,
        ..ReceiptFilter::default()
    };
    // Two active indexes, and one status range per finished state.
    assert_eq!(with(None).sources().len(), 6);
    let held = ReceiptFilter {
        held: Some(true),
        ..ReceiptFilter::default()
    };
    assert_eq!(held.sources(), [Source::Fresh, Source::Retried]);
    assert_eq!(
        with(Some(StateFilter::Scheduled)).sources(),
        [Source::Fresh]
    );
    let owner = ReceiptFilter {
        owner: Some(WorkerId::parse("w").unwrap()),
        state: Some(StateFilter::Pending),
        ..ReceiptFilter::default()
    };
    assert!(owner.sources().is_empty());
    let finished = ReceiptFilter {
        finished_ms: Range {
            from: Some(1),
            to: None,
        },
        ..ReceiptFilter::default()
    };
    assert_eq!(finished.sources().len(), 4);
    let finished_pending = ReceiptFilter {
        state: Some(StateFilter::Pending),
        ..finished
    };
    assert!(finished_pending.sources().is_empty());
    let code = ReceiptFilter {
        code: Some(SettlementFailureCode::Rpc),
        ..ReceiptFilter::default()
    };
    assert_eq!(code.sources(), [Source::Failed(SettlementFailureCode::Rpc)]);
    assert!(!code.checks_rows());
    let code_and_owner_pending = ReceiptFilter {
        owner: Some(WorkerId::parse("w").unwrap()),
        state: Some(StateFilter::Pending),
        ..code
    };
    assert!(code_and_owner_pending.sources().is_empty());
}

#[test]
fn the_cursor_bounds_the_range_instead_of_the_filter() {
    let filter = ReceiptFilter {
        finalized: Range {
            from: Some(10),
            to: Some(20),
        },
        ..ReceiptFilter::default()
    };
    let page = SearchPage {
        order: SearchOrder::Newest,
        limit: 5,
        after: Some(SearchKey {
            finalized_at: 15,
            receipt_id: "r".into(),
        }),
    };
    let s = statement(Dialect::Sqlite, &filter, &page, 0, 6)
        .unwrap()
        .unwrap();
    assert!(
        s.sql.contains("(finalized_at, receipt_id) < (?1, ?2)"),
        "{}",
        s.sql
    );
    assert!(s.sql.contains("finalized_at >= ?3"), "{}", s.sql);
    assert!(!s.sql.contains("finalized_at < ?"), "{}", s.sql);
    assert_eq!(s.sql.matches(" UNION ALL ").count(), 5, "{}", s.sql);
}
