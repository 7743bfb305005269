//! The plans PostgreSQL picks for the hot statements, read with `EXPLAIN`
//! on tables shaped as a busy server's: the plan decides how many index
//! pages each receipt costs (docs/perf-log/postgres-write-path.md, "With statistics").

use super::claim::CLAIM_DUE;
use super::guarded::WRITE_ROUND;
use super::test_support::{fresh_store, raw, receipt};
use crate::domain::{ClaimLimit, LeaseMs, UnixMs, WorkerId};
use crate::store::SettlementOutcomeStore;

const T0: u64 = 1_000_000;

/// A round of guarded writes (outcomes, releases) finds each row by its key.
/// Every row one claim statement leased shares its lease end and attempts,
/// and a probe of `receipts_leases` on those two columns checks the rest of
/// the key entry by entry over all of them (docs/perf-log/postgres-write-path.md, "An outcome finds
/// its row by its key"). Read as the plan of a round of 256 rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_of_guarded_writes_probes_the_primary_key() {
    // 5 000 rows, 2 000 leased by two claims, and never analyzed, as on a
    // server whose autovacuum is off or has not come by yet (the bench's
    // case): compared on the column itself, the lease end let the plan probe
    // `receipts_leases` on its leading columns (checked).
    guarded_writes_probe_the_primary_key(5_000, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyzed_while_few_were_leased_a_round_still_probes_the_primary_key() {
    // 20 000 rows analyzed while 5 were leased (statistics are a snapshot:
    // autovacuum's ANALYZE comes at any moment), then 2 000 more leased:
    // `receipts_leases` looks tiny to the planner, and with the lease end
    // compared as `+lease_until_ms` the plan scanned that whole index for the
    // round (checked; docs/perf-log/postgres-write-path.md "With statistics").
    guarded_writes_probe_the_primary_key(20_000, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_analyzed_table_a_claim_updates_the_rows_it_locked_by_their_tuple() {
    // The plan a statement keeps after its first executions (generic), on a
    // table analyzed as autovacuum would: with `receipt_id = pick_id` beside
    // `ctid = pick_at` it descended the primary key once per leased row
    // (checked; docs/perf-log/postgres-write-path.md "With statistics").
    let Some((_store, mut conn)) = leased_table(20_000, 5).await else {
        return;
    };
    let plan = plan_of(&mut conn, CLAIM_DUE, "force_generic_plan", &["NULL"; 6]).await;
    assert!(plan.contains("Tid Scan on receipts"), "{plan}");
    assert!(!plan.contains("receipts_pkey"), "{plan}");
    // The claim positions meet their slots in a hash: joined after the
    // tuples, the slots were scanned again for every row leased.
    let lines: Vec<&str> = plan.lines().collect();
    let slots = lines
        .iter()
        .position(|l| l.contains("Function Scan on slots"));
    assert!(
        slots.is_some_and(|i| i > 0 && lines[i - 1].trim_start().starts_with("->  Hash  ")),
        "{plan}"
    );
}

/// Enqueue `rows` receipts; lease `analyzed_at` of them and analyze the
/// table (unless 0); lease 2 000 more. Then the plan of a round of 256
/// guarded writes (planned for its arrays, as a statement is for its first
/// executions) must probe the primary key for each row and read the batch
/// once.
async fn guarded_writes_probe_the_primary_key(rows: usize, analyzed_at: usize) {
    let Some((_store, mut conn)) = leased_table(rows, analyzed_at).await else {
        return;
    };
    // A round of 256: only the arrays' length matters to the plan.
    let mut args = vec!["NULL"; 29];
    args[0] = "array_fill('x'::text, ARRAY[256])";
    let plan = plan_of(&mut conn, WRITE_ROUND, "force_custom_plan", &args).await;
    assert!(
        plan.contains("Index Scan using receipts_pkey on receipts")
            && plan.contains("Index Cond: (receipt_id = (b.b_id)::text)"),
        "{plan}"
    );
    assert!(!plan.contains("receipts_leases"), "{plan}");
    // The batch is read once, by the update, in the plan of the first
    // executions and in the generic one kept after them: the history insert
    // takes its columns from what the update returned. Joined to the batch
    // again, the batch was materialized and read a second time. The generic
    // plan is also the one of outcomes sent with a claim, which run in the
    // claim's transaction (planned once per connection): it probes the key
    // too.
    let generic = plan_of(&mut conn, WRITE_ROUND, "force_generic_plan", &["NULL"; 29]).await;
    assert!(
        generic.contains("Index Scan using receipts_pkey on receipts")
            && !generic.contains("receipts_leases"),
        "{generic}"
    );
    for plan in [plan, generic] {
        assert_eq!(plan.matches("Function Scan on b ").count(), 1, "{plan}");
        assert!(!plan.contains("CTE Scan on batch"), "{plan}");
    }
}

/// A store on a fresh database of `rows` receipts: `analyzed_at` of them
/// leased when the table is analyzed (never, if 0), then 2 000 more leased;
/// and a connection to it, for plans.
async fn leased_table(
    rows: usize,
    analyzed_at: usize,
) -> Option<(super::PostgresStore, sqlx::PgConnection)> {
    let (url, store) = fresh_store().await?;
    let now = UnixMs::saturating(T0);
    let worker = WorkerId::parse("w").unwrap();
    let lease = LeaseMs::try_from(60_000).unwrap();
    for chunk in 0..rows / 1000 {
        let receipts: Vec<_> = (0..1000)
            .map(|i| receipt(&format!("r-{chunk}-{i:04}")))
            .collect();
        store.enqueue(&receipts, now).await.unwrap();
    }
    let mut conn = raw(&url).await;
    if analyzed_at > 0 {
        let limit = ClaimLimit::try_from(analyzed_at).unwrap();
        store
            .claim_from(&worker, now, lease, limit, &[])
            .await
            .unwrap();
        sqlx::raw_sql("ANALYZE receipts")
            .execute(&mut conn)
            .await
            .unwrap();
    }
    for _ in 0..2 {
        let limit = ClaimLimit::try_from(1000).unwrap();
        store
            .claim_from(&worker, now, lease, limit, &[])
            .await
            .unwrap();
    }
    Some((store, conn))
}

/// The plan of `sql` for `args` under `plan_cache_mode = mode`, with
/// sequential and bitmap scans off (a test table is small enough for them).
async fn plan_of(conn: &mut sqlx::PgConnection, sql: &str, mode: &str, args: &[&str]) -> String {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET enable_seqscan = off; SET enable_bitmapscan = off; \
         SET plan_cache_mode = {mode}; PREPARE planned AS {sql}"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN EXECUTE planned({})",
        args.join(", ")
    )))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql("DEALLOCATE planned")
        .execute(&mut *conn)
        .await
        .unwrap();
    plan.join("\n")
}
