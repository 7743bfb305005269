//! Each operator action's SQL does what its Rust replay says, on
//! PostgreSQL: on a row in every state, the `UPDATE` changes the row exactly
//! when `judge` answers `Done`, and into what `apply` makes of it.

use sqlx::PgConnection;

use super::lookup::row;
use super::test_support::{fresh_store, raw};
use crate::store::actions::replay_cases::{NOW, ROWS, actions};
use crate::store::actions::{self, Binds};
use crate::store::{Acted, OperatorAction};

async fn run(conn: &mut PgConnection, action: &OperatorAction, id: &str) -> u64 {
    let sql = actions::update_many_sql(action);
    let query = sqlx::query(sqlx::AssertSqlSafe(sql.as_str())).bind(vec![id]);
    let query = match action.binds() {
        Binds::Id => query,
        Binds::Now => query.bind(NOW),
        Binds::NowReason(reason) => query.bind(NOW).bind(reason),
    };
    query.execute(conn).await.expect("update").rows_affected()
}

#[tokio::test]
async fn each_actions_sql_changes_what_its_replay_changes() {
    let Some((url, store)) = fresh_store().await else {
        return;
    };
    let mut conn = raw(&url).await;
    for (a, action) in actions().iter().enumerate() {
        for (r, insert) in ROWS.iter().enumerate() {
            let id = format!("case-{a}-{r}");
            sqlx::query(sqlx::AssertSqlSafe(insert.replace("{id}", &id)))
                .execute(&mut conn)
                .await
                .expect("insert");
            let stored = row(&mut conn, &id).await.expect("read").expect("row");
            let mut expected = stored.clone();
            let done = actions::judge(action, Some(&stored), NOW) == Ok(Acted::Done);
            if done {
                actions::apply(action, &mut expected, NOW);
            }
            assert_eq!(
                run(&mut conn, action, &id).await,
                u64::from(done),
                "{action:?} on {insert}"
            );
            let after = row(&mut conn, &id).await.expect("read").expect("row");
            assert_eq!(
                format!("{after:?}"),
                format!("{expected:?}"),
                "{action:?} on {insert}"
            );
        }
    }
    drop(store);
}
