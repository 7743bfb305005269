//! Group names are ordered by their bytes on every server, as receipt ids
//! are and as SQLite orders them, whatever the database's default collation
//! (migrations/postgres/0020_group_names_by_bytes.sql).

use sqlx::Connection;

use super::test_support::receipt;
use super::{PostgresOptions, PostgresStore};
use crate::domain::{ClaimLimit, GroupName, LeaseMs, UnixMs, WorkerId};
use crate::store::{GroupQuery, SettlementOutcomeStore};

/// Names whose order by bytes (`B`, `_x`, `a`) is not the order of English
/// (`_x`, `a`, `B`).
const NAMES: [&str; 3] = ["B", "_x", "a"];

/// On a database whose default collation is ICU's English, the claims of
/// one receipt each take the groups in turn by bytes, and the group list
/// pages in the same order.
#[tokio::test]
async fn groups_take_turns_by_bytes_under_an_english_collation() {
    let Ok(base) = std::env::var("SETTLED_TEST_POSTGRES_URL") else {
        eprintln!(
            "SKIPPED: SETTLED_TEST_POSTGRES_URL is not set, so this PostgreSQL test did not run"
        );
        return;
    };
    let name = settled_test_support::postgres::test_database_name();
    let mut admin = sqlx::PgConnection::connect(&base).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' \
         LOCALE 'C.UTF-8'"
    )))
    .execute(&mut admin)
    .await
    .expect("create an English-collated database");
    let url = settled_test_support::postgres::database_url(&base, &name).expect("url");
    let store = PostgresStore::connect(&url, &PostgresOptions::default())
        .await
        .expect("open postgres");
    let now = UnixMs::saturating(1_000_000);
    let receipts: Vec<_> = NAMES
        .iter()
        .map(|group| {
            let mut r = receipt(&format!("r-{group}"));
            r.group = GroupName::parse(group).expect("group");
            r
        })
        .collect();
    store.enqueue(&receipts, now).await.expect("enqueue");
    let worker = WorkerId::parse("w").expect("worker");
    let lease = LeaseMs::try_from(60_000).expect("lease");
    let mut taken = Vec::new();
    for _ in NAMES {
        let due = store
            .claim_from(
                &worker,
                now,
                lease,
                ClaimLimit::try_from(1).expect("limit"),
                &[],
            )
            .await
            .expect("claim");
        taken.extend(due.claims.iter().map(|c| c.group.as_str().to_owned()));
    }
    assert_eq!(taken, NAMES, "turns by bytes");
    let query = GroupQuery {
        limit: 10,
        after: String::new(),
        exact: false,
        depth: false,
    };
    let listed: Vec<String> = store
        .groups(now, &query)
        .await
        .expect("groups")
        .into_iter()
        .map(|g| g.group)
        .collect();
    assert_eq!(listed, ["B", "_x", "a", "default"], "the list by bytes");
}
