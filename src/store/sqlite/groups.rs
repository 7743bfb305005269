//! Groups on SQLite (docs/groups.md): the writer's cached copy of the group
//! table, the limits a claim meets (live leases, rate tokens), and the
//! operator's limits.

use std::collections::HashMap;

use rusqlite::Connection;
use sqlx::SqlitePool;

use super::super::group_list::{self, GroupListRow};
use super::lookup::json;
use crate::domain::{GroupLimits, GroupName};
use crate::store::fair::{FairClaim, GroupRow, limits};
use crate::store::{GroupQuery, GroupView, StoreResult};

const GROUP_COLUMNS: &str = "name, paused, max_leased, rate_per_s, burst, tokens, tokens_at_ms";

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

/// Every group (or the named ones), by name.
pub fn read_groups(conn: &Connection, only: &[GroupName]) -> StoreResult<Vec<GroupRow>> {
    let all = GROUPS.with(|cached| cached.borrow().clone());
    let all = match all {
        Some(all) => all,
        None => {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {GROUP_COLUMNS} FROM receipt_groups ORDER BY name"
            ))?;
            let rows = stmt
                .query_map([], group_row)?
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .collect::<StoreResult<Vec<_>>>()?;
            let rows = std::sync::Arc::new(rows);
            GROUPS.with(|cached| *cached.borrow_mut() = Some(rows.clone()));
            rows
        }
    };
    Ok(all
        .iter()
        .filter(|g| only.is_empty() || only.iter().any(|o| o.as_str() == g.name))
        .cloned()
        .collect())
}

thread_local! {
    /// The writer thread's copy of `receipt_groups`, so that a claim does
    /// not read every group row again (one writer, so one thread, per
    /// database). Every write to the table forgets it, before its commit:
    /// a write that rolls back only costs a read.
    static GROUPS: std::cell::RefCell<Option<std::sync::Arc<Vec<GroupRow>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Forget the writer's copy of the group table: called by every write to it.
pub fn forget_groups() {
    GROUPS.with(|cached| *cached.borrow_mut() = None);
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
    forget_groups();
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
    let groups = read_groups(conn, std::slice::from_ref(&group))?;
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
    forget_groups();
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
