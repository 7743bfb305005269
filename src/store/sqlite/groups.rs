//! Groups on SQLite (docs/groups.md): the groups a claim looks at, the
//! limits it meets (live leases, rate tokens), and the operator's limits.

use std::collections::HashMap;

use rusqlite::Connection;
use sqlx::SqlitePool;

use super::super::group_list::{self, GroupListRow};
use super::lookup::json;
use crate::domain::{GroupLimits, GroupName};
use crate::store::fair::{FairClaim, GroupRow, in_turn, limits};
use crate::store::idle_groups::{
    SweptGroups, forget_groups_sql, idle_groups_sql, idle_names, swept,
};
use crate::store::rules::{claim_groups_sql, lapsed_sql, next_group_sql, unleased_sql};
use crate::store::walk::walked_groups;
use crate::store::{GroupQuery, GroupView, StoreResult};

fn group_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoreResult<GroupRow>> {
    let name: String = r.get(0)?;
    let paused: bool = r.get(1)?;
    let max_leased: Option<i64> = r.get(2)?;
    let rate: Option<f64> = r.get(3)?;
    let burst: Option<i64> = r.get(4)?;
    let tokens: Option<f64> = r.get(5)?;
    let at: Option<i64> = r.get(6)?;
    Ok(
        limits(paused, max_leased, rate, burst).map(|limits| GroupRow {
            name,
            limits,
            bucket: tokens.zip(at),
        }),
    )
}

/// The groups a claim looks at when it names none (see
/// `claim_groups_sql`): `?1` now, `?2` the turn, `?3` the bound.
const CLAIM_GROUPS: &str = claim_groups_sql!(
    "receipts INDEXED BY receipts_due",
    "receipts INDEXED BY receipts_leases",
    "?1",
    "?2",
    "?3"
);

/// The groups a claim names (`?1`, a JSON array), each once, by name.
const NAMED_GROUPS: &str = "SELECT n.name, COALESCE(g.paused, false), g.max_leased, g.rate_per_s, \
     g.burst, g.tokens, g.tokens_at_ms \
     FROM (SELECT DISTINCT value AS name FROM json_each(?1)) AS n \
     LEFT JOIN receipt_groups AS g ON g.name = n.name ORDER BY n.name";

/// The groups a claim at `now` may take from, with their limits: `only`,
/// or those of a walk of at most `bound` groups with work in turn after
/// `after` (`None`: every one). The second value says whether these are
/// all the groups the claim may take from.
pub fn read_groups(
    conn: &Connection,
    only: &[GroupName],
    now: i64,
    after: &str,
    bound: Option<u64>,
) -> StoreResult<(Vec<GroupRow>, bool)> {
    if only.is_empty() {
        let bound = bound.unwrap_or(u64::MAX);
        let mut stmt = conn.prepare_cached(CLAIM_GROUPS)?;
        let rows = stmt
            .query_map(
                rusqlite::params![now, after, i64::try_from(bound).unwrap_or(i64::MAX)],
                |r| Ok(group_row(r)?.map(|g| (g, r.get::<_, i64>(7).is_ok_and(|w| w != 0)))),
            )?
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .collect::<StoreResult<Vec<_>>>()?;
        return Ok(walked_groups(rows, after, bound));
    }
    let names: Vec<&str> = only.iter().map(GroupName::as_str).collect();
    let mut stmt = conn.prepare_cached(NAMED_GROUPS)?;
    let mut groups = stmt
        .query_map([json(&names)?], group_row)?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .collect::<StoreResult<Vec<_>>>()?;
    // Read by name; the walk gives its groups in turn order already.
    in_turn(&mut groups, after);
    Ok((groups, true))
}

/// Live leases per group, for the groups with a `max_leased`: read from
/// `receipts_leases`, so the cost is the live leases, not the receipts.
pub fn live_leased(
    conn: &Connection,
    groups: &[GroupRow],
    now: i64,
) -> StoreResult<HashMap<String, u64>> {
    let capped: Vec<&str> = groups
        .iter()
        .filter(|g| g.limits.max_leased.is_some() && !g.limits.paused)
        .map(|g| g.name.as_str())
        .collect();
    if capped.is_empty() {
        return Ok(HashMap::new());
    }
    let mut stmt = conn.prepare_cached(
        "SELECT receipt_group, COUNT(*) FROM receipts INDEXED BY receipts_leases \
         WHERE lease_until_ms > ?1 AND receipt_group IN (SELECT value FROM json_each(?2)) \
         GROUP BY receipt_group",
    )?;
    let counts = stmt
        .query_map(rusqlite::params![now, json(&capped)?], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(counts
        .into_iter()
        .map(|(g, n)| (g, u64::try_from(n).unwrap_or(0)))
        .collect())
}

/// Store the buckets a claim spent from.
pub fn spend(conn: &Connection, spent: &[(String, f64, i64)]) -> StoreResult<()> {
    if spent.is_empty() {
        return Ok(());
    }
    let mut stmt = conn.prepare_cached(
        "UPDATE receipt_groups SET tokens = ?2, tokens_at_ms = ?3 WHERE name = ?1",
    )?;
    for (name, tokens, at) in spent {
        stmt.execute(rusqlite::params![name, tokens, at])?;
    }
    Ok(())
}

/// Whether group `name`'s limits let a claim by id take one receipt now;
/// spends a token when they do and it has a rate. `Err(paused)` when not.
pub fn admit_one(conn: &Connection, name: &str, now: i64) -> StoreResult<Result<(), bool>> {
    let group = GroupName::from_stored(name.to_owned());
    let (groups, _) = read_groups(conn, std::slice::from_ref(&group), now, "", None)?;
    let Some(row) = groups.first() else {
        return Ok(Ok(()));
    };
    if !row.limits.limited() {
        return Ok(Ok(()));
    }
    let live = live_leased(conn, &groups, now)?;
    match FairClaim::new(groups, &live, now, 1).admit_one() {
        Ok(spent) => spend(conn, &spent).map(Ok),
        Err(paused) => Ok(Err(paused)),
    }
}

/// Set a group's limits (creating the group), keeping its bucket when the
/// rate is unchanged (`IS`: equal, nulls included), as PostgreSQL does.
pub fn set_limits(
    conn: &Connection,
    name: &GroupName,
    limits: &GroupLimits,
    now: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO receipt_groups AS g (name, paused, max_leased, rate_per_s, burst, \
         updated_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
         ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, \
         max_leased = excluded.max_leased, rate_per_s = excluded.rate_per_s, \
         burst = excluded.burst, \
         tokens = CASE WHEN g.rate_per_s IS excluded.rate_per_s AND g.burst IS excluded.burst \
           THEN g.tokens END, \
         tokens_at_ms = CASE WHEN g.rate_per_s IS excluded.rate_per_s \
           AND g.burst IS excluded.burst THEN g.tokens_at_ms END, \
         updated_at_ms = excluded.updated_at_ms",
    )?
    .execute(rusqlite::params![
        name.as_str(),
        limits.paused,
        limits
            .max_leased
            .map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
        limits.rate.map(|r| r.per_second),
        limits
            .rate
            .map(|r| i64::try_from(r.burst).unwrap_or(i64::MAX)),
        now
    ])?;
    Ok(())
}

/// A page of the group list, from a reader.
pub async fn list(pool: &SqlitePool, now: i64, query: &GroupQuery) -> StoreResult<Vec<GroupView>> {
    let rows: Vec<GroupListRow> = sqlx::query_as(query.text(&group_list::SQLITE))
        .bind(now)
        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
        .bind(&query.after)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(|r| r.view(now)).collect()
}

/// The page of group rows after `?1` (at most `?2`), each with whether it is
/// idle (src/store/idle_groups.rs).
const IDLE_GROUPS: &str = idle_groups_sql!(
    "receipts INDEXED BY receipts_due",
    "receipts INDEXED BY receipts_leases",
    "?1",
    "?2"
);
const FORGET: &str = forget_groups_sql!("json_each(?1)");

/// One page of a sweep, on the single writer: nothing can enqueue into a
/// group between the read and the delete.
pub fn forget_idle(conn: &Connection, after: &str, limit: usize) -> StoreResult<SweptGroups> {
    let page = conn
        .prepare_cached(IDLE_GROUPS)?
        .query_map(
            rusqlite::params![after, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?)),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let idle = idle_names(&page);
    let forgotten = if idle.is_empty() {
        0
    } else {
        conn.prepare_cached(FORGET)?.execute([json(&idle)?])? as u64
    };
    Ok(swept(&page, forgotten, limit))
}
