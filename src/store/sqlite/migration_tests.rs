//! Migrations 0006 and 0007 rebuild `receipts` and `receipt_history` (see
//! their headers): every row, history entry and count must come through,
//! and the rewritten `CHECK`s must refuse what the old ones refused.

use sqlx::{Connection, Row, SqliteConnection};

async fn connect(dir: &tempfile::TempDir) -> SqliteConnection {
    let url = format!("sqlite:{}?mode=rwc", dir.path().join("old.db").display());
    let mut conn = SqliteConnection::connect(&url).await.expect("connect");
    // As on every connection of settled's: the rebuild must not cascade.
    sqlx::query("PRAGMA foreign_keys = ON")
        .execute(&mut conn)
        .await
        .expect("foreign keys");
    conn
}

async fn exec(conn: &mut SqliteConnection, sql: &'static str) {
    sqlx::query(sql).execute(&mut *conn).await.expect(sql);
}

async fn count(conn: &mut SqliteConnection, sql: &'static str) -> i64 {
    sqlx::query(sql)
        .fetch_one(&mut *conn)
        .await
        .expect(sql)
        .get(0)
}

#[tokio::test]
async fn rebuilding_the_tables_keeps_rows_history_counts_and_refusals() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut conn = connect(&dir).await;
    let migrator = sqlx::migrate!("migrations/sqlite");
    migrator.run_to(5, &mut conn).await.expect("up to 0005");
    exec(
        &mut conn,
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
         next_visible_at_ms, created_at_ms) VALUES ('a', 1, 'active', 0, 0, 5, 5), \
         ('b', 2, 'active', 0, 0, 5, 5)",
    )
    .await;
    exec(
        &mut conn,
        "UPDATE receipts SET status = 'dead_lettered', attempts = 1, next_visible_at_ms = NULL, \
         failure_code = 'rpc', failure_sha256 = printf('%064d', 0), finished_at_ms = 9 \
         WHERE receipt_id = 'b'",
    )
    .await;
    exec(
        &mut conn,
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, worker_id, \
         observed_at_ms, route) VALUES ('b', 1, 'permanent', 'rpc', 'w', 9, 'dead_lettered')",
    )
    .await;

    migrator.run(&mut conn).await.expect("0006 and later");

    assert_eq!(count(&mut conn, "SELECT count(*) FROM receipts").await, 2);
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM receipt_history WHERE receipt_id = 'b'"
        )
        .await,
        1,
        "history survives the rebuild of the table it references"
    );
    let counts = sqlx::query("SELECT fresh, dead_lettered, canceled FROM receipt_counts")
        .fetch_one(&mut conn)
        .await
        .expect("counts");
    let counted: (i64, i64, i64) = (counts.get(0), counts.get(1), counts.get(2));
    assert_eq!(counted, (1, 1, 0));
    // The counting triggers were recreated with the table.
    exec(&mut conn, "DELETE FROM receipts WHERE receipt_id = 'a'").await;
    assert_eq!(
        count(&mut conn, "SELECT fresh FROM receipt_counts").await,
        0
    );
    // The rewritten CHECKs refuse what the lists refused.
    for bad in [
        "UPDATE receipts SET status = 'gone' WHERE receipt_id = 'b'",
        "UPDATE receipts SET failure_code = 'nope' WHERE receipt_id = 'b'",
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, worker_id, observed_at_ms) \
         VALUES ('b', 1, 'maybe', 'w', 9)",
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, worker_id, observed_at_ms, \
         route) VALUES ('b', 1, 'accepted', 'w', 9, 'elsewhere')",
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, worker_id, observed_at_ms) \
         VALUES ('missing', 1, 'accepted', 'w', 9)",
    ] {
        assert!(
            sqlx::query(bad).execute(&mut conn).await.is_err(),
            "accepted after the rebuild: {bad}"
        );
    }
    // And a single-row write no longer builds a temporary b-tree per CHECK.
    let plan = sqlx::query(
        "EXPLAIN INSERT INTO receipt_history (receipt_id, attempt, outcome, worker_id, \
         observed_at_ms, route) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .fetch_all(&mut conn)
    .await
    .expect("explain");
    assert!(
        plan.iter()
            .all(|op| op.get::<String, _>("opcode") != "OpenEphemeral"),
        "a history entry still opens a temporary b-tree"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pragma_foreign_key_check").await,
        0
    );
}
