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
                    // The generic plan, made for any values, names its parameters.
                    assert!(s.binds.is_empty() || plan.contains("$1"), "{what}");
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
    let mut lines = String::new();
    if sqlite {
        let mut conn = sqlx::SqliteConnection::connect(&fresh.url).await.unwrap();
        let text = format!("EXPLAIN QUERY PLAN {sql}");
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
        // As the store reads: index ranges only, and one generic plan made
        // for any values (src/store/postgres/tx.rs), so that this is the
        // plan every call runs. Seq scans only when nothing else can answer:
        // a plan that still holds one has no index to use.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SET enable_seqscan = off; SET enable_bitmapscan = off; \
             SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; \
             PREPARE search_plan AS {sql}"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let values: Vec<String> = binds
            .iter()
            .map(|b| match b {
                Bind::Int(v) => v.to_string(),
                Bind::Text(t) => format!("'{}'", t.replace('\'', "''")),
            })
            .collect();
        let text = if values.is_empty() {
            "EXPLAIN EXECUTE search_plan".to_owned()
        } else {
            format!("EXPLAIN EXECUTE search_plan({})", values.join(", "))
        };
        let q = sqlx::query(sqlx::AssertSqlSafe(text));
        for row in q.fetch_all(&mut conn).await.unwrap() {
            lines.push_str(&row.get::<String, _>(0));
            lines.push('\n');
        }
    }
    lines
}
