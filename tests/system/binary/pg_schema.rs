//! PostgreSQL: settled keeps everything in a schema of its own, says on
//! start-up what it created, leaves a shared database's `public` alone, and
//! names a missing database. Skipped without `SETTLED_TEST_POSTGRES_URL`.

use serde_json::Value;
use sqlx::{Connection, PgConnection};

use super::common::fresh_postgres_url;
use super::common::process::Server;
use super::launch;
use super::start_errors::refused;

/// A running binary (killed when the test ends, or fails) and what it
/// logged up to the line saying where it listens.
struct Running {
    _server: Server,
    base: String,
    log: String,
}

fn run(url: &str, extra: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let args = [&["--database-url", url][..], extra].concat();
    let server = launch(dir.path(), "127.0.0.1:0", &args);
    Running {
        base: server.base.clone(),
        log: server.log_text(),
        _server: server,
    }
}

async fn names(conn: &mut PgConnection, sql: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(conn)
        .await
        .unwrap()
}

async fn get(url: String) -> (u16, Value) {
    let response = reqwest::get(url).await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn enqueue(base: &str, id: &str) {
    let created = reqwest::Client::new()
        .post(format!("{base}/v1/receipts"))
        .json(&serde_json::json!({"receipt_id": id, "finalized_at": 1_764_460_800}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
}

const TABLES: &str = "SELECT relname::text FROM pg_class c JOIN pg_namespace n \
    ON n.oid = c.relnamespace WHERE nspname = $$S$$ AND relkind = 'r' ORDER BY 1";

fn tables_in(schema: &str) -> String {
    TABLES.replace("$$S$$", &format!("'{schema}'"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_database_keeps_its_public_schema_untouched() {
    let _turn = crate::turn(module_path!());
    let Some(url) = fresh_postgres_url().await else {
        return;
    };
    let mut db = PgConnection::connect(&url).await.unwrap();
    // Another application's table in the shared database's public schema.
    sqlx::query("CREATE TABLE public.app_orders (id INTEGER)")
        .execute(&mut db)
        .await
        .unwrap();

    let first = run(&url, &[]);
    for said in [
        "created PostgreSQL schema settled",
        "applied migrations 0001",
        "0005 scheduled",
        "using PostgreSQL schema settled",
    ] {
        assert!(
            first.log.contains(said),
            "start-up log lacks {said:?}: {}",
            first.log
        );
    }
    enqueue(&first.base, "r-1").await;
    let (_, info) = get(format!("{}/v1/info", first.base)).await;
    drop(first);

    let public: Vec<String> = names(
        &mut db,
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE nspname = 'public' ORDER BY 1",
    )
    .await;
    assert_eq!(public, ["app_orders"], "nothing of settled's in public");
    let functions: Vec<String> = names(
        &mut db,
        "SELECT proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
         WHERE nspname = 'public'",
    )
    .await;
    assert!(functions.is_empty(), "functions in public: {functions:?}");
    assert_eq!(
        names(&mut db, &tables_in("settled")).await,
        [
            "_sqlx_migrations",
            "history_horizon",
            "receipt_counts",
            "receipt_groups",
            "receipt_history",
            "receipts",
            "stats_minutes",
            "store_identity",
            "upkeep_holder"
        ]
    );
    let stored: Vec<String> = names(&mut db, "SELECT receipt_id FROM settled.receipts").await;
    assert_eq!(stored, ["r-1"]);

    // A second start creates nothing and says which schema it uses.
    let again = run(&url, &[]);
    assert!(
        again.log.contains("using PostgreSQL schema settled"),
        "{}",
        again.log
    );
    assert!(
        !again.log.contains("created PostgreSQL schema"),
        "{}",
        again.log
    );
    assert!(!again.log.contains("applied migrations"), "{}", again.log);
    let (_, same) = get(format!("{}/v1/info", again.base)).await;
    assert_eq!(same["store_binding"], info["store_binding"]);
    drop(again);

    // Another deployment in a schema of its own on the same database: its
    // own ledger, not the first one's receipts.
    let other = run(&url, &["--pg-schema", "billing_queue"]);
    assert!(
        other
            .log
            .contains("created PostgreSQL schema billing_queue"),
        "{}",
        other.log
    );
    let (_, other_info) = get(format!("{}/v1/info", other.base)).await;
    assert_ne!(other_info["store_binding"], info["store_binding"]);
    let (status, _) = get(format!("{}/v1/receipts/r-1", other.base)).await;
    assert_eq!(status, 404);
    drop(other);
    assert_eq!(
        names(&mut db, &tables_in("billing_queue")).await,
        names(&mut db, &tables_in("settled")).await
    );
    assert_eq!(names(&mut db, &tables_in("public")).await, ["app_orders"]);
}

/// The SQL block of docs/deployment.md that moves an earlier version's
/// tables out of `public`.
fn documented_move() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deployment.md"))
        .unwrap();
    let section = doc
        .split("### Upgrading to a schema of its own")
        .nth(1)
        .expect("the upgrade section");
    let block = section.split("```sql").nth(1).expect("its SQL block");
    block.split("```").next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_left_in_public_are_refused_then_moved_as_documented() {
    let _turn = crate::turn(module_path!());
    let Some(url) = fresh_postgres_url().await else {
        return;
    };
    // As an earlier version left them: everything in public.
    let earlier = run(&url, &["--pg-schema", "public"]);
    enqueue(&earlier.base, "r-1").await;
    let (_, info) = get(format!("{}/v1/info", earlier.base)).await;
    drop(earlier);

    refused(&["--listen", "127.0.0.1:0", "--database-url", &url]).says(&[
        "holds settled's tables in schema public",
        "--pg-schema public",
        "docs/deployment.md",
    ]);
    let mut db = PgConnection::connect(&url).await.unwrap();
    let created: Vec<String> = names(
        &mut db,
        "SELECT nspname::text FROM pg_namespace WHERE nspname = 'settled'",
    )
    .await;
    assert!(created.is_empty(), "the refused start created no schema");

    sqlx::raw_sql(sqlx::AssertSqlSafe(documented_move()))
        .execute(&mut db)
        .await
        .expect("the documented move runs");
    let moved = run(&url, &[]);
    let (_, same) = get(format!("{}/v1/info", moved.base)).await;
    assert_eq!(
        same["store_binding"], info["store_binding"],
        "the same ledger"
    );
    let (status, receipt) = get(format!("{}/v1/receipts/r-1", moved.base)).await;
    assert_eq!(status, 200, "{receipt}");
    enqueue(&moved.base, "r-2").await;
    drop(moved);
    assert!(names(&mut db, &tables_in("public")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_is_named_with_how_to_create_it() {
    let _turn = crate::turn(module_path!());
    let Some(url) = fresh_postgres_url().await else {
        return;
    };
    let (server, _) = url.rsplit_once('/').unwrap();
    let missing = format!("{server}/settled_missing_db");
    let answer = refused(&["--listen", "127.0.0.1:0", "--database-url", &missing]);
    assert_eq!(answer.code, Some(1));
    answer.says(&[
        "has no database \"settled_missing_db\"",
        "createdb",
        "CREATE DATABASE \"settled_missing_db\"",
    ]);
    // `refused` also checks that no internal prefix ("settlement routing") is shown.
    assert!(!answer.stderr.contains(" at line "), "{}", answer.stderr);
}
