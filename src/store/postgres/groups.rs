//! Groups (docs/groups.md): the list and the operator's limits, and the
//! limits a claim meets: the groups it may take from, the limited ones
//! locked until commit so that the limits hold across every replica, their
//! live leases, and the rate tokens it spends.

use std::collections::HashMap;

use super::super::group_list::{self, GroupListRow};
use sqlx::PgConnection;

use super::{PostgresStore, Tx};
use crate::domain::{GroupLimits, GroupName, UnixMs};
use crate::store::fair::{FairClaim, GroupRow, in_turn, limits};
use crate::store::rules::{claim_groups_sql, lapsed_sql, next_group_sql, unleased_sql};
use crate::store::walk::walked_groups;
use crate::store::{GroupQuery, GroupView, StoreResult};

/// The groups a claim may take from when it names none: those with active
/// work, not every group ever named (docs/groups.md).
const GROUPS: &str = claim_groups_sql!("receipts", "receipts", "$1", "$2::text", "$3::int8");

/// The groups a claim names (`$1`), each once, by name, with their limits
/// when they have any.
const NAMED_GROUPS: &str = "SELECT n.name, COALESCE(g.paused, false) AS paused, g.max_leased, \
     g.rate_per_s, g.burst, g.tokens, g.tokens_at_ms \
     FROM (SELECT DISTINCT name FROM unnest($1::text[]) AS u (name)) AS n \
     LEFT JOIN receipt_groups AS g ON g.name = n.name ORDER BY n.name";

/// The limited groups' rows again, locked in name order (no deadlock)
/// until commit: the limits hold across every replica.
const LOCK_GROUPS: &str = "SELECT name, paused, max_leased, rate_per_s, burst, tokens, tokens_at_ms \
     FROM receipt_groups WHERE name = ANY($1::text[]) ORDER BY name FOR UPDATE";

/// Live leases of the named groups, from `receipts_leases`.
const LIVE_LEASED: &str = "SELECT receipt_group, COUNT(*) FROM receipts \
     WHERE lease_until_ms > $1 AND receipt_group = ANY($2::text[]) GROUP BY receipt_group";

const SPEND: &str = "UPDATE receipt_groups SET tokens = b.tokens, tokens_at_ms = b.at \
     FROM unnest($1::text[], $2::float8[], $3::int8[]) AS b (name, tokens, at) \
     WHERE receipt_groups.name = b.name";

/// A `receipt_groups` row.
#[derive(sqlx::FromRow)]
struct StoredGroup {
    name: String,
    paused: bool,
    max_leased: Option<i64>,
    rate_per_s: Option<f64>,
    burst: Option<i64>,
    tokens: Option<f64>,
    tokens_at_ms: Option<i64>,
}

/// A row of [`GROUPS`]: the group, and whether the walk found it.
#[derive(sqlx::FromRow)]
struct WalkedGroup {
    #[sqlx(flatten)]
    group: StoredGroup,
    walked: i32,
}

impl StoredGroup {
    fn row(self) -> StoreResult<GroupRow> {
        Ok(GroupRow {
            limits: limits(self.paused, self.max_leased, self.rate_per_s, self.burst)?,
            bucket: self.tokens.zip(self.tokens_at_ms),
            name: self.name,
        })
    }
}

/// What a claim's read of its groups covered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Covered {
    /// Every group the claim may take from.
    All,
    /// The groups of a walk that stopped at its bound. `saved`: the limited
    /// ones among them were locked after [`BOUNDED_WALK`], which a claim
    /// that goes on to walk every group rolls back to first ([`retake`]).
    Walked { saved: bool },
}

/// The savepoint before a bounded walk's locks. A walk of every group
/// locks its limited groups in one statement, in name order; had the
/// bounded walk's locks (a window in turn order, which differs between
/// replicas) been kept, two claims could each hold a group the other then
/// waits for: a deadlock, one of them failed.
const BOUNDED_WALK: &str = "SAVEPOINT bounded_walk";

/// Give up the locks of a bounded walk before a walk of every group.
pub(super) async fn retake(conn: &mut PgConnection, covered: Covered) -> StoreResult<()> {
    if covered == (Covered::Walked { saved: true }) {
        sqlx::query("ROLLBACK TO SAVEPOINT bounded_walk")
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The groups a claim may take from, the limited ones locked, and their
/// live leases; with no groups named, those of a walk of at most `bound`
/// groups with work (`None`: every one), and what they cover.
pub(super) async fn groups_for_claim(
    conn: &mut PgConnection,
    only: &[GroupName],
    after: &str,
    now: i64,
    wanted: u64,
    bound: Option<u64>,
) -> StoreResult<(FairClaim, Covered)> {
    let names: Vec<&str> = only.iter().map(GroupName::as_str).collect();
    let (mut groups, complete) = if names.is_empty() {
        let bound = bound.unwrap_or(u64::MAX);
        let rows: Vec<WalkedGroup> = sqlx::query_as(GROUPS)
            .bind(now)
            .bind(after)
            .bind(i64::try_from(bound).unwrap_or(i64::MAX))
            .fetch_all(&mut *conn)
            .await?;
        let rows = rows
            .into_iter()
            .map(|r| Ok((r.group.row()?, r.walked != 0)))
            .collect::<StoreResult<Vec<_>>>()?;
        walked_groups(rows, after, bound)
    } else {
        let stored: Vec<StoredGroup> = sqlx::query_as(NAMED_GROUPS)
            .bind(&names)
            .fetch_all(&mut *conn)
            .await?;
        let mut groups = stored
            .into_iter()
            .map(StoredGroup::row)
            .collect::<StoreResult<Vec<_>>>()?;
        // Read by name; the walk gives its groups in turn order already.
        in_turn(&mut groups, after);
        (groups, true)
    };
    let limited: Vec<&str> = groups
        .iter()
        .filter(|g| !g.limits.paused && (g.limits.max_leased.is_some() || g.limits.rate.is_some()))
        .map(|g| g.name.as_str())
        .collect();
    let mut live = HashMap::new();
    let covered = if complete {
        Covered::All
    } else {
        Covered::Walked {
            saved: !limited.is_empty(),
        }
    };
    if !limited.is_empty() {
        if !complete {
            sqlx::query(BOUNDED_WALK).execute(&mut *conn).await?;
        }
        let locked: Vec<StoredGroup> = sqlx::query_as(LOCK_GROUPS)
            .bind(&limited)
            .fetch_all(&mut *conn)
            .await?;
        let counts: Vec<(String, i64)> = sqlx::query_as(LIVE_LEASED)
            .bind(now)
            .bind(&limited)
            .fetch_all(&mut *conn)
            .await?;
        live = counts
            .into_iter()
            .map(|(g, n)| (g, u64::try_from(n).unwrap_or(0)))
            .collect();
        // The locked rows are the limits as of now (an operator may have
        // changed them since the first read).
        let mut fresh: HashMap<String, GroupRow> = locked
            .into_iter()
            .map(|g| g.row().map(|r| (r.name.clone(), r)))
            .collect::<StoreResult<_>>()?;
        for g in &mut groups {
            if let Some(row) = fresh.remove(&g.name) {
                *g = row;
            }
        }
    }
    Ok((FairClaim::new(groups, &live, now, wanted), covered))
}

/// Whether group `name`'s limits let a claim by id take one receipt now
/// (the group's row locked when it is limited); spends a token when they do
/// and it has a rate. `Err(paused)` when not.
pub(super) async fn admit_one(tx: &mut Tx, name: &str, now: i64) -> StoreResult<Result<(), bool>> {
    let group = GroupName::from_stored(name.to_owned());
    let (fair, _) = groups_for_claim(tx, std::slice::from_ref(&group), "", now, 1, None).await?;
    match fair.admit_one() {
        Ok(spent) => spend(tx, spent).await.map(Ok),
        Err(paused) => Ok(Err(paused)),
    }
}

/// Store the buckets a claim spent from, in one statement.
pub(super) async fn spend(
    conn: &mut PgConnection,
    spent: Vec<(String, f64, i64)>,
) -> StoreResult<()> {
    if spent.is_empty() {
        return Ok(());
    }
    let (names, (tokens, ats)): (Vec<String>, (Vec<f64>, Vec<i64>)) =
        spent.into_iter().map(|(n, t, at)| (n, (t, at))).unzip();
    sqlx::query(SPEND)
        .bind(names)
        .bind(tokens)
        .bind(ats)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Set a group's limits (creating the group), keeping its bucket when the
/// rate is unchanged; announced, so that waiting claims of every replica
/// look again.
const SET_LIMITS: &str = "INSERT INTO receipt_groups AS g (name, paused, max_leased, rate_per_s, \
     burst, updated_at_ms) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, \
     max_leased = excluded.max_leased, rate_per_s = excluded.rate_per_s, burst = excluded.burst, \
     tokens = CASE WHEN g.rate_per_s IS NOT DISTINCT FROM excluded.rate_per_s \
       AND g.burst IS NOT DISTINCT FROM excluded.burst THEN g.tokens END, \
     tokens_at_ms = CASE WHEN g.rate_per_s IS NOT DISTINCT FROM excluded.rate_per_s \
       AND g.burst IS NOT DISTINCT FROM excluded.burst THEN g.tokens_at_ms END, \
     updated_at_ms = excluded.updated_at_ms";

impl PostgresStore {
    pub(super) async fn set_group_limits(
        &self,
        group: &GroupName,
        limits: &GroupLimits,
        now_ms: UnixMs,
    ) -> StoreResult<()> {
        let now = now_ms.as_i64();
        let mut tx = self.begin().await?;
        sqlx::query(SET_LIMITS)
            .bind(group.as_str())
            .bind(limits.paused)
            .bind(
                limits
                    .max_leased
                    .map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
            )
            .bind(limits.rate.map(|r| r.per_second))
            .bind(
                limits
                    .rate
                    .map(|r| i64::try_from(r.burst).unwrap_or(i64::MAX)),
            )
            .bind(now)
            .execute(&mut *tx)
            .await?;
        super::announce(&mut tx).await?;
        super::commit(tx).await?;
        self.notify.notify_waiters();
        Ok(())
    }
}

impl PostgresStore {
    pub(super) async fn group_views(
        &self,
        now_ms: UnixMs,
        query: &GroupQuery,
    ) -> StoreResult<Vec<GroupView>> {
        let now = now_ms.as_i64();
        let rows: Vec<GroupListRow> = self
            .bounded(
                self.read_all(
                    sqlx::query_as(query.text(&group_list::PG))
                        .bind(now)
                        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
                        .bind(&query.after),
                ),
            )
            .await?;
        rows.into_iter().map(|r| r.view(now)).collect()
    }
}
