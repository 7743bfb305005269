//! Each operator action's SQL does what its Rust replay says: on a row in
//! every state, the `UPDATE` changes the row exactly when `judge` answers
//! `Done`, and into what `apply` makes of it.

use rusqlite::Connection;

use super::lookup::row;
use super::test_support::open;
use crate::store::actions::replay_cases::{NOW, ROWS, actions};
use crate::store::actions::{self, Binds};
use crate::store::{Acted, OperatorAction};

fn run(conn: &Connection, action: &OperatorAction, id: &str) -> usize {
    let mut stmt = conn.prepare(&actions::update_sql(action)).expect("prepare");
    match action.binds() {
        Binds::Id => stmt.execute([id]),
        Binds::Now => stmt.execute(rusqlite::params![id, NOW]),
        Binds::NowReason(reason) => stmt.execute(rusqlite::params![id, NOW, reason]),
    }
    .expect("update")
}

#[tokio::test]
async fn each_actions_sql_changes_what_its_replay_changes() {
    let (dir, store) = open().await;
    let conn = Connection::open(dir.path().join("settled.db")).expect("open");
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    for (a, action) in actions().iter().enumerate() {
        for (r, insert) in ROWS.iter().enumerate() {
            let id = format!("case-{a}-{r}");
            conn.execute(&insert.replace("{id}", &id), [])
                .expect("insert");
            let stored = row(&conn, &id).expect("read").expect("row");
            let mut expected = stored.clone();
            let done = actions::judge(action, Some(&stored), NOW) == Ok(Acted::Done);
            if done {
                actions::apply(action, &mut expected, NOW);
            }
            assert_eq!(
                run(&conn, action, &id),
                usize::from(done),
                "{action:?} on {insert}"
            );
            let after = row(&conn, &id).expect("read").expect("row");
            assert_eq!(
                format!("{after:?}"),
                format!("{expected:?}"),
                "{action:?} on {insert}"
            );
        }
    }
    drop(store);
}
