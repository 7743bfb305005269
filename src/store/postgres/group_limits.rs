//! The group limits a claim meets (docs/groups.md): the groups it may take
//! from, the limited ones locked until commit so that the limits hold across
//! every replica, their live leases, and the rate tokens it spends.

use std::collections::HashMap;

use super::Tx;
use crate::domain::GroupName;
use crate::store::StoreResult;
use crate::store::fair::{FairClaim, GroupRow, in_turn, limits};

/// The groups a claim may take from: `$1` (all when empty), by name.
const GROUPS: &str = "SELECT name, paused, max_leased, rate_per_s, burst, tokens, tokens_at_ms \
     FROM receipt_groups WHERE cardinality($1::text[]) = 0 OR name = ANY($1::text[]) ORDER BY name";

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

impl StoredGroup {
    fn row(self) -> StoreResult<GroupRow> {
        Ok(GroupRow {
            limits: limits(self.paused, self.max_leased, self.rate_per_s, self.burst)?,
            bucket: self.tokens.zip(self.tokens_at_ms),
            name: self.name,
        })
    }
}

/// The groups a claim may take from, the limited ones locked, and their
/// live leases.
pub(super) async fn groups_for_claim(
    tx: &mut Tx,
    only: &[GroupName],
    after: &str,
    now: i64,
    wanted: u64,
) -> StoreResult<FairClaim> {
    let names: Vec<&str> = only.iter().map(GroupName::as_str).collect();
    let stored: Vec<StoredGroup> = sqlx::query_as(GROUPS)
        .bind(&names)
        .fetch_all(&mut **tx)
        .await?;
    let mut groups = stored
        .into_iter()
        .map(StoredGroup::row)
        .collect::<StoreResult<Vec<_>>>()?;
    in_turn(&mut groups, after);
    let limited: Vec<&str> = groups
        .iter()
        .filter(|g| !g.limits.paused && (g.limits.max_leased.is_some() || g.limits.rate.is_some()))
        .map(|g| g.name.as_str())
        .collect();
    let mut live = HashMap::new();
    if !limited.is_empty() {
        let locked: Vec<StoredGroup> = sqlx::query_as(LOCK_GROUPS)
            .bind(&limited)
            .fetch_all(&mut **tx)
            .await?;
        let counts: Vec<(String, i64)> = sqlx::query_as(LIVE_LEASED)
            .bind(now)
            .bind(&limited)
            .fetch_all(&mut **tx)
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
    Ok(FairClaim::new(groups, &live, now, wanted))
}

/// Whether group `name`'s limits let a claim by id take one receipt now
/// (the group's row locked when it is limited); spends a token when they do
/// and it has a rate. `Err(paused)` when not.
pub(super) async fn admit_one(tx: &mut Tx, name: &str, now: i64) -> StoreResult<Result<(), bool>> {
    let group = GroupName::from_stored(name.to_owned());
    let fair = groups_for_claim(tx, std::slice::from_ref(&group), "", now, 1).await?;
    match fair.admit_one() {
        Ok(spent) => spend(tx, spent).await.map(Ok),
        Err(paused) => Ok(Err(paused)),
    }
}

/// Store the buckets a claim spent from, in one statement.
pub(super) async fn spend(tx: &mut Tx, spent: Vec<(String, f64, i64)>) -> StoreResult<()> {
    if spent.is_empty() {
        return Ok(());
    }
    let (names, (tokens, ats)): (Vec<String>, (Vec<f64>, Vec<i64>)) =
        spent.into_iter().map(|(n, t, at)| (n, (t, at))).unzip();
    sqlx::query(SPEND)
        .bind(names)
        .bind(tokens)
        .bind(ats)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
