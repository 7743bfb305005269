//! Every statement a search runs reads index ranges, never a scan of the
//! table, on both backends (their query plans, read back).

use super::*;

/// The statement of every kind of filter, with and without a cursor, in
/// both orders, reads index ranges only, and each source from its own
/// index; SQLite merges them without a sort except over live leases.
pub(super) async fn every_search_statement_reads_an_index_range(fresh: Fresh) {
    let sqlite = fresh.url.starts_with("sqlite:");
    let mut filters = filters();
    filters.push(ReceiptFilter {
        code: Some(SettlementFailureCode::Rpc),
        finalized: Range {
            from: Some(1),
            to: Some(99),
        },
        ..ReceiptFilter::default()
    });
    let mut checked = 0;
    for filter in &filters {
        for order in [SearchOrder::Newest, SearchOrder::Oldest] {
            for after in [
                None,
                Some(SearchKey {
                    finalized_at: 50,
                    receipt_id: "m".into(),
                }),
            ] {
                let cursor = after.is_some();
                let page = SearchPage {
                    order,
                    limit: 10,
                    after,
                };
                let dialect = if sqlite {
                    Dialect::Sqlite
                } else {
                    Dialect::Postgres
                };
                let Some(s) = statement(dialect, filter, &page, NOW as i64, 11).unwrap() else {
                    assert!(filter.sources().is_empty());
                    continue;
                };
                let plan = explain(&fresh, &s.sql, &s.binds, sqlite).await;
                let what = format!("{filter:?} {order:?} cursor={cursor}:\n{plan}");
                let sources = filter.sources();
                for source in &sources {
                    for index in indexes(*source, sqlite) {
                        // PostgreSQL: `using <index>`, or `on <index>` in a bitmap scan.
                        let named = if sqlite {
                            format!("INDEX {index}")
                        } else {
                            format!(" {index} ")
                        };
                        assert!(plan.contains(&named), "{index}: {what}");
                    }
                }
                if sqlite {
                    assert!(!plan.contains("SCAN receipts\n"), "{what}");
                    if !sources.contains(&Source::Leases) {
                        assert!(!plan.contains("TEMP B-TREE"), "{what}");
                    }
                    if cursor {
                        assert!(!plan.contains("SCAN receipts"), "{what}");
                    }
                } else {
                    assert!(!plan.contains("Seq Scan"), "{what}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 60, "{checked}");
}

/// The indexes a source is read from. PostgreSQL's fresh and retried
/// indexes hold no leased row, so their leased rows come from the leases.
fn indexes(source: Source, sqlite: bool) -> Vec<&'static str> {
    match source {
        Source::Fresh if sqlite => vec!["receipts_fresh"],
        Source::Retried if sqlite => vec!["receipts_retried"],
        Source::Fresh => vec!["receipts_fresh", "receipts_leases"],
        Source::Retried => vec!["receipts_retried", "receipts_leases"],
        Source::Leases => vec!["receipts_leases"],
        Source::Finished(_) => vec!["receipts_by_status"],
        Source::Failed(_) => vec!["receipts_failed"],
    }
}

/// The plan of `sql`, one line per node (SQLite: one line per detail).
pub(super) async fn explain(fresh: &Fresh, sql: &str, binds: &[Bind], sqlite: bool) -> String {
    let text = if sqlite {
        format!("EXPLAIN QUERY PLAN {sql}")
    } else {
        format!("EXPLAIN {sql}")
    };
    let mut lines = String::new();
    if sqlite {
        let mut conn = sqlx::SqliteConnection::connect(&fresh.url).await.unwrap();
        let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
        for b in binds {
            q = match b {
                Bind::Int(v) => q.bind(*v),
                Bind::Text(t) => q.bind(t.clone()),
            };
        }
        for row in q.fetch_all(&mut conn).await.unwrap() {
            lines.push_str(&row.get::<String, _>(3));
            lines.push('\n');
        }
    } else {
        let mut conn = crate::common::pg_raw(&fresh.url).await.unwrap();
        // Seq scans only when nothing else can answer: a plan that still
        // holds one has no index to use.
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut conn)
            .await
            .unwrap();
        // The values inline (a utility statement takes no parameters),
        // last first so that `$1` does not eat the start of `$10`.
        let mut text = text;
        for (i, b) in binds.iter().enumerate().rev() {
            let value = match b {
                Bind::Int(v) => v.to_string(),
                Bind::Text(t) => format!("'{}'", t.replace('\'', "''")),
            };
            text = text.replace(&format!("${}", i + 1), &value);
        }
        let q = sqlx::query(sqlx::AssertSqlSafe(text));
        for row in q.fetch_all(&mut conn).await.unwrap() {
            lines.push_str(&row.get::<String, _>(0));
            lines.push('\n');
        }
    }
    lines
}
