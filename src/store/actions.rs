//! Operators' actions on receipts (docs/operators.md, "Act on many
//! receipts"): what each may change, decided from the stored row alone, so
//! that both backends judge every receipt the same way.

use super::Status;
use super::rows::ReceiptRow;
use super::rules::NewHistory;

/// Longest reason an operator may give, in bytes.
pub const MAX_REASON_BYTES: usize = 512;

/// What an operator does to a receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorAction {
    /// A dead letter back to work: due now, attempts 0.
    Redrive,
    /// No claim takes it until unheld; its state and times are kept.
    Hold { reason: Option<String> },
    /// Claimable again (when due).
    Unhold,
    /// Finished for good, never to be settled.
    Cancel { reason: String },
}

impl OperatorAction {
    /// The action's name, as in paths and history entries' `outcome`.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Redrive => "redrive",
            Self::Hold { .. } => "hold",
            Self::Unhold => "unhold",
            Self::Cancel { .. } => "cancel",
        }
    }

    /// Whether doing it may make work due (workers waiting should look).
    #[must_use]
    pub const fn may_make_due(&self) -> bool {
        matches!(self, Self::Redrive | Self::Unhold)
    }

    fn note(&self) -> Option<String> {
        match self {
            Self::Hold { reason } => reason.clone(),
            Self::Cancel { reason } => Some(reason.clone()),
            Self::Redrive | Self::Unhold => None,
        }
    }
}

/// What an action did to one receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acted {
    /// Changed, with a history entry (or, in a dry run, would be).
    Done,
    /// Already so (holding a held receipt, unholding one not held): nothing written.
    Unchanged,
}

/// Why an action was refused for one receipt; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionRefusal {
    /// No such receipt.
    NotFound,
    /// Redrive of a receipt that is not dead-lettered.
    NotDeadLettered,
    /// Hold or unhold of a receipt with no active work (finished or dead-lettered).
    NotActive,
    /// Cancel of a receipt already settled, skipped or canceled.
    Finished,
    /// Cancel of a receipt a live lease holds: its worker may be settling it
    /// right now. Hold it, and cancel once the lease has ended.
    Leased,
}

/// The answer for one receipt.
pub type ActionResult = Result<Acted, ActionRefusal>;

/// Judge `action` on `row` (`None`: no such receipt) at `now`.
pub fn judge(action: &OperatorAction, row: Option<&ReceiptRow>, now: i64) -> ActionResult {
    let Some(row) = row else {
        return Err(ActionRefusal::NotFound);
    };
    let active = row.status == Status::Active;
    match action {
        OperatorAction::Redrive if row.status == Status::DeadLettered => Ok(Acted::Done),
        OperatorAction::Redrive => Err(ActionRefusal::NotDeadLettered),
        OperatorAction::Hold { .. } | OperatorAction::Unhold if !active => {
            Err(ActionRefusal::NotActive)
        }
        OperatorAction::Hold { .. } if row.held_at_ms.is_some() => Ok(Acted::Unchanged),
        OperatorAction::Unhold if row.held_at_ms.is_none() => Ok(Acted::Unchanged),
        OperatorAction::Hold { .. } | OperatorAction::Unhold => Ok(Acted::Done),
        OperatorAction::Cancel { .. } if active && row.lease_live(now) => {
            Err(ActionRefusal::Leased)
        }
        OperatorAction::Cancel { .. } if active || row.status == Status::DeadLettered => {
            Ok(Acted::Done)
        }
        OperatorAction::Cancel { .. } => Err(ActionRefusal::Finished),
    }
}

/// The history entry of an action done to `row`.
pub fn entry(
    action: &OperatorAction,
    row: &ReceiptRow,
    actor: Option<&str>,
    now: i64,
) -> NewHistory {
    NewHistory {
        attempt: row.attempts,
        outcome: action.name(),
        code: None,
        detail_sha256: None,
        transcript_id: None,
        reason: None,
        retry_after_ms: None,
        rail_code: None,
        worker_id: "operator".to_owned(),
        observed_at_ms: now,
        route: None,
        actor: actor.map(str::to_owned),
        note: action.note(),
    }
}

/// What `action` sets, and the condition under which it may (the same as
/// [`judge`]'s): `?2` is now, `?3` the cancel reason.
const fn change(action: &OperatorAction) -> (&'static str, &'static str) {
    match action {
        OperatorAction::Redrive => (
            "status = 'active', attempts = 0, next_visible_at_ms = ?2, finished_at_ms = NULL, \
             held_at_ms = NULL",
            "status = 'dead_lettered'",
        ),
        OperatorAction::Hold { .. } => (
            "held_at_ms = ?2",
            "status = 'active' AND held_at_ms IS NULL",
        ),
        OperatorAction::Unhold => (
            "held_at_ms = NULL",
            "status = 'active' AND held_at_ms IS NOT NULL",
        ),
        OperatorAction::Cancel { .. } => (
            "status = 'canceled', cancel_reason = ?3, next_visible_at_ms = NULL, \
             lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, held_at_ms = NULL, \
             finished_at_ms = ?2",
            "(status = 'dead_lettered' OR (status = 'active' \
             AND (lease_until_ms IS NULL OR lease_until_ms <= ?2)))",
        ),
    }
}

/// The `UPDATE` that does `action` to the receipt `?1`, in SQLite's
/// placeholders, guarded by the same conditions as [`judge`]: it changes
/// nothing if the row moved since it was judged. It takes the parameters
/// [`Binds`] lists, in that order.
#[must_use]
pub fn update_sql(action: &OperatorAction) -> String {
    let (set, guard) = change(action);
    format!("UPDATE receipts SET {set} WHERE receipt_id = ?1 AND {guard}")
}

/// [`update_sql`] for every receipt in the PostgreSQL array `$1`, in
/// PostgreSQL's placeholders.
#[must_use]
pub fn update_many_sql(action: &OperatorAction) -> String {
    let (set, guard) = change(action);
    format!("UPDATE receipts SET {set} WHERE receipt_id = ANY(?1::text[]) AND {guard}")
        .replace('?', "$")
}

/// What [`update_sql`] does to `row` at `now`, on a copy: so that a receipt
/// named twice in one action is judged the second time as the first left it.
pub fn apply(action: &OperatorAction, row: &mut ReceiptRow, now: i64) {
    match action {
        OperatorAction::Redrive => {
            row.status = Status::Active;
            row.attempts = 0;
            row.next_visible_at_ms = Some(now);
            row.finished_at_ms = None;
            row.held_at_ms = None;
        }
        OperatorAction::Hold { .. } => row.held_at_ms = Some(now),
        OperatorAction::Unhold => row.held_at_ms = None,
        OperatorAction::Cancel { reason } => {
            row.status = Status::Canceled;
            row.cancel_reason = Some(reason.clone());
            row.next_visible_at_ms = None;
            row.lease_owner = None;
            row.lease_token = None;
            row.lease_until_ms = None;
            row.held_at_ms = None;
            row.finished_at_ms = Some(now);
        }
    }
}

/// The parameters of [`update_sql`] after the receipt id.
pub enum Binds<'a> {
    /// Only the id (unhold).
    Id,
    /// The id and now.
    Now,
    /// The id, now and the cancel reason.
    NowReason(&'a str),
}

impl OperatorAction {
    /// What [`update_sql`] binds.
    #[must_use]
    pub fn binds(&self) -> Binds<'_> {
        match self {
            Self::Unhold => Binds::Id,
            Self::Redrive | Self::Hold { .. } => Binds::Now,
            Self::Cancel { reason } => Binds::NowReason(reason),
        }
    }
}

/// Rows in every state an action is judged on, and the actions, for the
/// backends' tests that run each action's SQL against [`judge`] and
/// [`apply`] (`sqlite/act_tests.rs`, `postgres/act_tests.rs`).
#[cfg(test)]
pub mod replay_cases {
    use super::OperatorAction;

    /// The clock of the cases: one lease ends after it, one before.
    pub const NOW: i64 = 100;

    /// Every action.
    pub fn actions() -> Vec<OperatorAction> {
        vec![
            OperatorAction::Redrive,
            OperatorAction::Hold {
                reason: Some("audit".into()),
            },
            OperatorAction::Unhold,
            OperatorAction::Cancel {
                reason: "refunded".into(),
            },
        ]
    }

    /// `INSERT` statements (plain SQL both backends take) of one receipt
    /// per state, with `{id}` to fill in.
    pub const ROWS: [&str; 7] = [
        // Active and due, no lease.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms) VALUES ('{id}', 1, 'active', 2, 3, 5, 1)",
        // Active and held.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms, held_at_ms) \
           VALUES ('{id}', 1, 'active', 1, 2, 5, 1, 7)",
        // Under a live lease.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms, lease_owner, lease_token, lease_until_ms) \
           VALUES ('{id}', 1, 'active', 0, 1, 5, 1, 'w', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 200)",
        // Under a lease that ended.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms, lease_owner, lease_token, lease_until_ms) \
           VALUES ('{id}', 1, 'active', 0, 1, 5, 1, 'w', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 50)",
        // Dead-lettered.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           created_at_ms, finished_at_ms, failure_code, failure_sha256) \
           VALUES ('{id}', 1, 'dead_lettered', 3, 4, 1, 60, 'rpc', \
           'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb')",
        // Settled.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           created_at_ms, finished_at_ms, transcript_id) \
           VALUES ('{id}', 1, 'settled', 0, 1, 1, 60, 'tx-1')",
        // Canceled.
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           created_at_ms, finished_at_ms, cancel_reason) \
           VALUES ('{id}', 1, 'canceled', 0, 1, 1, 60, 'earlier')",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, held: bool, lease_until: Option<i64>) -> ReceiptRow {
        ReceiptRow {
            receipt_id: "r".into(),
            finalized_at: 1,
            observation: None,
            status: Status::try_from(status.to_owned()).unwrap(),
            attempts: 2,
            row_version: 1,
            next_visible_at_ms: (status == "active").then_some(5),
            lease_owner: lease_until.map(|_| "w".into()),
            lease_token: lease_until.map(|_| "t".repeat(32)),
            lease_until_ms: lease_until,
            failure_code: None,
            failure_sha256: None,
            failure_rail_code: None,
            transcript_id: None,
            skip_reason: None,
            finished_at_ms: None,
            held_at_ms: held.then_some(3),
            cancel_reason: None,
            receipt_group: "default".into(),
            priority: 0,
            traceparent: None,
            tracestate: None,
        }
    }

    /// A receipt named twice in one action is changed once: after
    /// [`apply`], [`judge`] never answers `Done` again.
    #[test]
    fn an_action_applied_is_not_done_twice() {
        let actions = [
            OperatorAction::Redrive,
            OperatorAction::Hold { reason: None },
            OperatorAction::Unhold,
            OperatorAction::Cancel { reason: "r".into() },
        ];
        let rows = [
            row("active", false, None),
            row("active", true, None),
            row("active", false, Some(50)),
            row("dead_lettered", false, None),
        ];
        for action in &actions {
            for stored in &rows {
                let mut copy = stored.clone();
                if judge(action, Some(&copy), 100) == Ok(Acted::Done) {
                    apply(action, &mut copy, 100);
                    assert_ne!(
                        judge(action, Some(&copy), 101),
                        Ok(Acted::Done),
                        "{action:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn each_action_is_judged_on_the_stored_row() {
        let cancel = OperatorAction::Cancel { reason: "r".into() };
        let hold = OperatorAction::Hold { reason: None };
        let now = 100;
        assert_eq!(judge(&hold, None, now), Err(ActionRefusal::NotFound));
        assert_eq!(
            judge(&hold, Some(&row("active", false, None)), now),
            Ok(Acted::Done)
        );
        assert_eq!(
            judge(&hold, Some(&row("active", true, None)), now),
            Ok(Acted::Unchanged)
        );
        assert_eq!(
            judge(&hold, Some(&row("settled", false, None)), now),
            Err(ActionRefusal::NotActive)
        );
        assert_eq!(
            judge(
                &OperatorAction::Unhold,
                Some(&row("active", false, None)),
                now
            ),
            Ok(Acted::Unchanged)
        );
        // A live lease may finish its work: cancel waits, an expired one does not.
        assert_eq!(
            judge(&cancel, Some(&row("active", false, Some(101))), now),
            Err(ActionRefusal::Leased)
        );
        assert_eq!(
            judge(&cancel, Some(&row("active", true, Some(100))), now),
            Ok(Acted::Done)
        );
        assert_eq!(
            judge(&cancel, Some(&row("dead_lettered", false, None)), now),
            Ok(Acted::Done)
        );
        assert_eq!(
            judge(&cancel, Some(&row("canceled", false, None)), now),
            Err(ActionRefusal::Finished)
        );
        assert_eq!(
            judge(
                &OperatorAction::Redrive,
                Some(&row("active", false, None)),
                now
            ),
            Err(ActionRefusal::NotDeadLettered)
        );
    }
}
