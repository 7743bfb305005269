//! An upgrade from the release before the claim index held only rows
//! without a lease (migrations up to 0013 on both backends; 0014 changed the
//! index on both, later numbers differ per backend until 0020): what
//! that release wrote comes through, live and lapsed leases keep their
//! meaning, and retention still takes a receipt's history with it.

use settled::store::{GroupQuery, ReceiptState};

use super::support::*;
use crate::common::{Fresh, raw_scalars, upgraded};

/// The last migration of the release upgraded from, per backend (the two
/// were numbered apart until 0020; see migrations/README.md).
const SQLITE_RELEASE: i64 = 13;
const POSTGRES_RELEASE: i64 = 13;

/// From this number on, one number is one change on both backends.
const NUMBERED_ALIKE_FROM: u32 = 20;

/// Rows as that release stored them at `T0`: one due, one whose lease
/// lapsed at `T0 - 1` (due before it), one leased for another minute, one
/// held, two settled with their history entries (the later one after the
/// retention horizon of the test, and the newest entry, which retention
/// keeps).
fn release_rows() -> String {
    let t = i64::try_from(T0).expect("clock");
    let token = "a".repeat(32);
    format!(
        "INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms) VALUES ('due', 1, 'active', 0, 0, {due}, {due}); \
         INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms, lease_owner, lease_token, lease_until_ms) \
           VALUES ('lapsed', 1, 'active', 0, 1, {lapsed}, {lapsed}, 'w0', '{token}', {gone}); \
         INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms, lease_owner, lease_token, lease_until_ms) \
           VALUES ('leased', 1, 'active', 0, 1, {leased}, {leased}, 'w0', '{token}', {live}); \
         INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           next_visible_at_ms, created_at_ms, held_at_ms) \
           VALUES ('held', 1, 'active', 0, 0, {held}, {held}, {held}); \
         INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           created_at_ms, transcript_id, finished_at_ms) \
           VALUES ('done', 1, 'settled', 0, 1, {done}, 'tx-1', {finished}); \
         INSERT INTO receipt_history (receipt_id, attempt, outcome, transcript_id, worker_id, \
           observed_at_ms, route) VALUES ('done', 1, 'accepted', 'tx-1', 'w0', {finished}, \
           'no_action'); \
         INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, \
           created_at_ms, transcript_id, finished_at_ms) \
           VALUES ('done-later', 1, 'settled', 0, 1, {done}, 'tx-2', {now}); \
         INSERT INTO receipt_history (receipt_id, attempt, outcome, transcript_id, worker_id, \
           observed_at_ms, route) VALUES ('done-later', 1, 'accepted', 'tx-2', 'w0', {now}, \
           'no_action')",
        due = t - 100,
        lapsed = t - 200,
        gone = t - 1,
        leased = t - 300,
        live = t + 60_000,
        held = t - 400,
        done = t - 500,
        finished = t - 50,
        now = t,
    )
}

async fn what_the_release_stored_comes_through(fresh: Fresh) {
    let s = store(&fresh);
    let done = view(&fresh, "done", T0).await;
    assert_eq!(done.state, ReceiptState::Settled);
    assert_eq!(done.history.len(), 1);
    assert_eq!(state(&fresh, "leased", T0).await, ReceiptState::Leased);
    assert_eq!(state(&fresh, "lapsed", T0).await, ReceiptState::Pending);
    let before = s.status(ms(T0), 10).await.expect("status");
    assert_eq!(
        (before.counts.leased, before.counts.settled),
        (1, 2),
        "{before:?}"
    );
    // A claim takes the lapsed lease and the due row, oldest due first, and
    // neither the live lease nor the held row.
    let claimed: Vec<String> = s
        .claim_due(&worker("w1"), ms(T0), lease(1_000), limit(10))
        .await
        .expect("claim")
        .into_iter()
        .map(|c| c.receipt_id.as_str().to_owned())
        .collect();
    assert_eq!(claimed, ["lapsed", "due"]);
    let after = s.status(ms(T0), 10).await.expect("status");
    assert_eq!(after.counts.leased, 3, "{after:?}");
    let groups = s
        .groups(
            ms(T0),
            &GroupQuery {
                limit: 10,
                after: String::new(),
                exact: false,
                depth: true,
            },
        )
        .await
        .expect("groups");
    assert_eq!(
        groups[0].depth,
        Some(3),
        "every active receipt but the held one"
    );
    // Retention still removes a receipt with its history.
    assert_eq!(s.purge_finished(ms(T0), 10).await.expect("purge"), 1);
    let left: Vec<i64> = raw_scalars(
        &fresh,
        "SELECT COUNT(*) FROM receipt_history WHERE receipt_id = 'done'",
    )
    .await;
    assert_eq!(left, [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_database_of_the_release_upgrades() {
    let fresh = upgraded("sqlite", SQLITE_RELEASE, &release_rows())
        .await
        .expect("sqlite");
    what_the_release_stored_comes_through(fresh).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_database_of_the_release_upgrades() {
    if let Some(fresh) = upgraded("postgres", POSTGRES_RELEASE, &release_rows()).await {
        what_the_release_stored_comes_through(fresh).await;
    }
}

/// The migration files of one backend from [`NUMBERED_ALIKE_FROM`] on, as
/// (number, name) pairs.
fn numbered_alike(backend: &str) -> Vec<(u32, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    let mut files: Vec<(u32, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter_map(|name| {
            let (number, rest) = name.split_once('_')?;
            let number: u32 = number.parse().ok()?;
            (number >= NUMBERED_ALIKE_FROM).then(|| (number, rest.to_owned()))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn later_migrations_are_one_change_under_one_number_on_both_backends() {
    let (sqlite, postgres) = (numbered_alike("sqlite"), numbered_alike("postgres"));
    assert_eq!(
        sqlite, postgres,
        "from {NUMBERED_ALIKE_FROM:04} on, each migration has the same number and name on both \
         backends (a file that does nothing where a backend needs nothing): migrations/README.md"
    );
    let numbers: Vec<u32> = sqlite.iter().map(|(n, _)| *n).collect();
    let mut unique = numbers.clone();
    unique.dedup();
    assert_eq!(numbers, unique, "one file per number");
}
