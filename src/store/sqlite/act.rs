//! Operator actions on the writer's synchronous connection: each receipt
//! judged on its row as the single writer reads it, then changed with its
//! history entry.

use rusqlite::Connection;

use super::super::actions::{self, Binds};
use super::lookup::{append_history, row};
use crate::domain::{ReceiptId, StoreError};
use crate::store::{Acted, ActionResult, OperatorAction, StoreResult};

/// Do an operator's action to each receipt, each judged on its own; in a dry
/// run, judge only.
pub fn act(
    conn: &Connection,
    action: &OperatorAction,
    ids: &[ReceiptId],
    actor: Option<&str>,
    now: i64,
    dry_run: bool,
) -> StoreResult<Vec<ActionResult>> {
    let mut results = Vec::with_capacity(ids.len());
    for id in ids {
        let id = id.as_str();
        let found = row(conn, id)?;
        let result = actions::judge(action, found.as_ref(), now);
        if let (Ok(Acted::Done), Some(found), false) = (result, &found, dry_run) {
            let mut stmt = conn.prepare_cached(&actions::update_sql(action))?;
            let changed = match action.binds() {
                Binds::Id => stmt.execute([id])?,
                Binds::Now => stmt.execute(rusqlite::params![id, now])?,
                Binds::NowReason(reason) => stmt.execute(rusqlite::params![id, now, reason])?,
            };
            // The single writer read the row just now: nothing can have moved it.
            if changed != 1 {
                return Err(StoreError::backend("operator action changed no row"));
            }
            append_history(conn, &[(id, &actions::entry(action, found, actor, now))])?;
            if action.may_make_due() {
                // Its group may have been forgotten while it had nothing active.
                conn.prepare_cached(
                    "INSERT INTO receipt_groups (name) SELECT receipt_group FROM receipts \
                     WHERE receipt_id = ?1 AND receipt_group <> 'default' \
                     ON CONFLICT (name) DO NOTHING",
                )?
                .execute([id])?;
            }
        }
        results.push(result);
    }
    Ok(results)
}
