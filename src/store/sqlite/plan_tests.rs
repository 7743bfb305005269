//! The writer's batch updates must find each row by its key on a database
//! that has been analyzed. settled never runs `ANALYZE`, but an operator or
//! a tool may (`PRAGMA optimize` is what SQLite advises for long-lived
//! databases), and statistics change SQLite's plans: SQLite 3.40 plans a
//! round of 256 outcomes on this very table (checked) with a Bloom filter
//! that first reads the whole table, 39 ms a round at 400 000 receipts
//! against 0.8 ms without statistics (docs/perf-log/postgres-write-path.md, "With statistics").
//! The bundled SQLite (3.51) keeps the key; its upgrades are checked here.

use super::SqliteStore;
use super::lease::{EXTEND, RELEASE};
use super::outcome::OUTCOMES;
use super::test_support::{open, receipt};
use crate::domain::{ClaimLimit, LeaseMs, UnixMs, WorkerId};
use crate::store::{NewReceipt, SettlementOutcomeStore};

const NOW: u64 = 1_000_000;

/// 5 000 receipts, 2 000 of them leased, analyzed by the writer's own
/// connection (which then plans with the statistics at once).
async fn analyzed_store() -> (tempfile::TempDir, SqliteStore) {
    let (dir, store) = open().await;
    for chunk in 0..5 {
        let receipts: Vec<NewReceipt> = (0..1000)
            .map(|i| receipt(&format!("r-{chunk}-{i:04}")))
            .collect();
        store
            .enqueue(&receipts, UnixMs::saturating(NOW))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        let claimed = store
            .claim_from(
                &WorkerId::parse("w").unwrap(),
                UnixMs::saturating(NOW),
                LeaseMs::try_from(60_000).unwrap(),
                ClaimLimit::try_from(1000).unwrap(),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(claimed.claims.len(), 1000);
    }
    store
        .writer
        .solo(|conn| Ok(conn.execute_batch("ANALYZE")?))
        .await
        .unwrap();
    (dir, store)
}

/// `EXPLAIN QUERY PLAN` of `sql` with every parameter NULL, one line per step.
async fn plan_of(store: &SqliteStore, sql: String) -> String {
    store
        .writer
        .solo(move |conn| {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
            let steps = stmt
                .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(steps.join("\n"))
        })
        .await
        .unwrap()
}

fn assert_probes_the_key(plan: &str) {
    assert!(
        plan.contains("SEARCH receipts USING INDEX sqlite_autoindex_receipts_1 (receipt_id=?)"),
        "{plan}"
    );
    assert!(!plan.contains("BLOOM FILTER"), "{plan}");
    assert!(!plan.contains("SCAN receipts"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_analyzed_database_batch_updates_probe_the_key() {
    let (_dir, store) = analyzed_store().await;
    let stats: i64 = store
        .writer
        .solo(|conn| {
            Ok(conn.query_row(
                "SELECT COUNT(*) FROM sqlite_stat1 WHERE tbl = 'receipts'",
                [],
                |r| r.get(0),
            )?)
        })
        .await
        .unwrap();
    assert!(stats > 0, "ANALYZE left no statistics on receipts");
    for rows in [2, 64, 256] {
        assert_probes_the_key(&plan_of(&store, OUTCOMES.text(rows)).await);
    }
    assert_probes_the_key(&plan_of(&store, EXTEND.to_owned()).await);
    assert_probes_the_key(&plan_of(&store, RELEASE.to_owned()).await);
}
