//! Write operations, each run by the group-commit writer inside its own
//! savepoint. Every outcome, extension and release repeats the whole claim
//! compare-and-swap in its `WHERE`.

use sqlx::SqliteConnection;

use super::super::rows::{ReceiptRow, to_i64};
use super::super::rules::{self, Cas, Change, NewHistory};
use super::super::*;
use super::read::{history, row};
use crate::receipt_columns;

const CAS_WHERE: &str = "receipt_id = ?1 AND status = 'active' AND finalized_at = ?2 \
     AND attempts = ?3 AND row_version = ?4 AND lease_owner = ?5 AND lease_token = ?6 \
     AND lease_until_ms = ?7 AND lease_until_ms > ?8";

async fn append_history(
    conn: &mut SqliteConnection,
    receipt_id: &str,
    h: &NewHistory,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO receipt_history (receipt_id, attempt, outcome, code, detail_sha256, \
         transcript_id, reason, worker_id, observed_at_ms, route) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .bind(receipt_id)
    .bind(h.attempt)
    .bind(h.outcome)
    .bind(h.code)
    .bind(&h.detail_sha256)
    .bind(&h.transcript_id)
    .bind(h.reason)
    .bind(&h.worker_id)
    .bind(h.observed_at_ms)
    .bind(h.route)
    .execute(conn)
    .await?;
    Ok(())
}

/// Store receipts; each is judged on its own. Two statements whatever the
/// batch size: one `INSERT … SELECT FROM json_each … ON CONFLICT DO NOTHING`
/// that returns the ids it created, and one read of the rows that already
/// existed, whose identity is then compared in Rust.
pub async fn enqueue(
    conn: &mut SqliteConnection,
    receipts: &[NewReceipt],
    now: i64,
) -> StoreResult<Vec<Enqueued>> {
    let mut rows = Vec::with_capacity(receipts.len());
    for receipt in receipts {
        let finalized_at = to_i64(receipt.finalized_at, "finalized_at")?;
        let visible = receipt
            .visible_at_ms
            .map_or(Ok(now), |v| to_i64(v, "visible_at_ms"))?;
        // The observation travels as its JSON text, stored exactly as before.
        let observation = receipt
            .observation
            .as_ref()
            .map(serde_json::Value::to_string);
        rows.push((
            receipt.receipt_id.as_str(),
            finalized_at,
            observation,
            visible,
        ));
    }
    let rows = serde_json::to_string(&rows)
        .map_err(|e| SettlementRouteError::backend(format!("encoding receipts: {e}")))?;
    // `WHERE true` lets SQLite tell the upsert clause from a join.
    let created: Vec<String> = sqlx::query_scalar(
        "INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, \
         row_version, next_visible_at_ms, created_at_ms) \
         SELECT value ->> 0, value ->> 1, value ->> 2, 'active', 0, 0, value ->> 3, ?2 \
         FROM json_each(?1) WHERE true ON CONFLICT (receipt_id) DO NOTHING RETURNING receipt_id",
    )
    .bind(&rows)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let mut created: std::collections::HashSet<String> = created.into_iter().collect();
    let existing: Vec<ReceiptRow> = sqlx::query_as(concat!(
        "SELECT ",
        receipt_columns!(),
        " FROM receipts WHERE receipt_id IN (SELECT value ->> 0 FROM json_each(?1))"
    ))
    .bind(&rows)
    .fetch_all(&mut *conn)
    .await?;
    let existing: std::collections::HashMap<&str, &ReceiptRow> = existing
        .iter()
        .map(|r| (r.receipt_id.as_str(), r))
        .collect();
    let mut results = Vec::with_capacity(receipts.len());
    for receipt in receipts {
        let id = receipt.receipt_id.as_str();
        // The first occurrence of a new id created it; a repeat in the same
        // batch is compared with what the first one stored.
        let result = if created.remove(id) {
            Enqueued::Created
        } else {
            let stored = existing
                .get(id)
                .ok_or_else(|| SettlementRouteError::backend("receipt vanished during enqueue"))?;
            rules::same_identity(stored, receipt)?
        };
        results.push(result);
    }
    Ok(results)
}

/// Lease one due row that was just read on `conn`.
async fn lease(
    conn: &mut SqliteConnection,
    row: &ReceiptRow,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
) -> StoreResult<SettlementAttemptClaim> {
    let version = rules::next_row_version(row.row_version)?;
    let token = rules::new_lease_token()?;
    let updated: Option<ReceiptRow> = sqlx::query_as(concat!(
        "UPDATE receipts SET row_version = ?3, lease_owner = ?4, lease_token = ?5, \
         lease_until_ms = ?6 WHERE receipt_id = ?1 AND row_version = ?2 AND status = 'active' \
         AND next_visible_at_ms <= ?7 AND (lease_until_ms IS NULL OR lease_until_ms <= ?7) \
         RETURNING ",
        receipt_columns!()
    ))
    .bind(&row.receipt_id)
    .bind(row.row_version)
    .bind(version)
    .bind(worker_id.as_str())
    .bind(&token)
    .bind(until)
    .bind(now)
    .fetch_optional(conn)
    .await?;
    updated
        .ok_or_else(|| SettlementRouteError::conflict("row changed while being claimed"))?
        .claim()
}

/// Claim one receipt by id; also says whether it took over an expired lease.
pub async fn claim_receipt(
    conn: &mut SqliteConnection,
    receipt_id: &ReceiptId,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
) -> StoreResult<(ReceiptClaim, bool)> {
    let Some(row) = row(conn, receipt_id.as_str()).await? else {
        return Ok((ReceiptClaim::NoActiveWork, false));
    };
    Ok(match row.status.as_str() {
        "active" if row.lease_live(now) => (ReceiptClaim::Leased, false),
        "active" if row.next_visible_at_ms.is_some_and(|v| v > now) => {
            (ReceiptClaim::NotYetVisible, false)
        }
        "active" => {
            let claim = lease(conn, &row, worker_id, now, until).await?;
            (ReceiptClaim::Claimed(claim), row.lease_until_ms.is_some())
        }
        _ => (ReceiptClaim::NoActiveWork, false),
    })
}

/// Claim due rows in order, all or nothing; also counts expired leases taken
/// over. Two statements whatever the batch size: pick the rows on the claim
/// index, then lease them all with one `UPDATE … FROM json_each`, each with
/// its own token from the OS CSPRNG.
pub async fn claim_due(
    conn: &mut SqliteConnection,
    worker_id: &WorkerId,
    now: i64,
    until: i64,
    limit: ClaimLimit,
) -> StoreResult<(Vec<SettlementAttemptClaim>, u64)> {
    // INDEXED BY: the planner would otherwise sort every active row.
    let picked: Vec<(String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT receipt_id, row_version, lease_until_ms FROM receipts INDEXED BY receipts_due \
         WHERE status = 'active' AND next_visible_at_ms <= ?1 \
         AND (lease_until_ms IS NULL OR lease_until_ms <= ?1) \
         ORDER BY next_visible_at_ms, receipt_id LIMIT ?2",
    )
    .bind(now)
    .bind(i64::try_from(limit.get()).unwrap_or(i64::MAX))
    .fetch_all(&mut *conn)
    .await?;
    if picked.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let mut leases = Vec::with_capacity(picked.len());
    for (receipt_id, row_version, _) in &picked {
        // Refuse an overflowing version before anything is written.
        leases.push((
            receipt_id,
            rules::next_row_version(*row_version)?,
            rules::new_lease_token()?,
        ));
    }
    let leases = serde_json::to_string(&leases)
        .map_err(|e| SettlementRouteError::backend(format!("encoding leases: {e}")))?;
    // `+status` keeps the planner on the primary key (one lookup per leased
    // row) instead of scanning every active row for each.
    let mut rows: Vec<ReceiptRow> = sqlx::query_as(concat!(
        "UPDATE receipts SET row_version = c.version, lease_owner = ?1, lease_token = c.token, \
         lease_until_ms = ?2 FROM (SELECT value ->> 0 AS id, value ->> 1 AS version, \
         value ->> 2 AS token FROM json_each(?3)) AS c \
         WHERE receipts.receipt_id = c.id AND receipts.row_version + 1 = c.version \
         AND +status = 'active' AND (lease_until_ms IS NULL OR lease_until_ms <= ?4) RETURNING ",
        receipt_columns!()
    ))
    .bind(worker_id.as_str())
    .bind(until)
    .bind(leases)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    if rows.len() != picked.len() {
        return Err(SettlementRouteError::conflict(
            "rows changed while being claimed",
        ));
    }
    rows.sort_by(|a, b| {
        (a.next_visible_at_ms, &a.receipt_id).cmp(&(b.next_visible_at_ms, &b.receipt_id))
    });
    // A corrupt row fails the job, rolling back every lease of the batch.
    let claims = rows
        .iter()
        .map(ReceiptRow::claim)
        .collect::<StoreResult<Vec<_>>>()?;
    let expired = picked
        .iter()
        .filter(|(_, _, lease)| lease.is_some())
        .count() as u64;
    Ok((claims, expired))
}

async fn apply(
    conn: &mut SqliteConnection,
    cas: &Cas<'_>,
    observed: i64,
    change: &Change,
) -> StoreResult<u64> {
    let set = match change {
        Change::Settle { .. } => {
            "UPDATE receipts SET status = 'settled', transcript_id = ?9, next_visible_at_ms = NULL, \
             lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, finished_at_ms = ?8 WHERE "
        }
        Change::Skip { .. } => {
            "UPDATE receipts SET status = 'skipped', skip_reason = ?9, next_visible_at_ms = NULL, \
             lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, finished_at_ms = ?8 WHERE "
        }
        Change::Retry { .. } => {
            "UPDATE receipts SET attempts = ?9, next_visible_at_ms = ?10, failure_code = ?11, \
             failure_sha256 = ?12, lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL WHERE "
        }
        Change::DeadLetter { .. } => {
            "UPDATE receipts SET status = 'dead_lettered', attempts = ?9, failure_code = ?10, \
             failure_sha256 = ?11, next_visible_at_ms = NULL, lease_owner = NULL, lease_token = NULL, \
             lease_until_ms = NULL, finished_at_ms = ?8 WHERE "
        }
    };
    let query = sqlx::query(sqlx::AssertSqlSafe(format!("{set}{CAS_WHERE}")))
        .bind(cas.receipt_id)
        .bind(cas.finalized_at)
        .bind(cas.attempts)
        .bind(cas.row_version)
        .bind(cas.lease_owner)
        .bind(cas.lease_token)
        .bind(cas.lease_until_ms)
        .bind(observed);
    let query = match change {
        Change::Settle { transcript_id } => query.bind(transcript_id.clone()),
        Change::Skip { reason } => query.bind(*reason),
        Change::Retry {
            attempts,
            next_visible_at_ms,
            code,
            sha256,
        } => query
            .bind(*attempts)
            .bind(*next_visible_at_ms)
            .bind(*code)
            .bind(sha256.clone()),
        Change::DeadLetter {
            attempts,
            code,
            sha256,
        } => query.bind(*attempts).bind(*code).bind(sha256.clone()),
    };
    Ok(query.execute(conn).await?.rows_affected())
}

async fn record_one(
    conn: &mut SqliteConnection,
    claim: &SettlementAttemptClaim,
    input: &SettlementRoutingInput,
    policy: RetryPolicy,
    observed_at_ms: u64,
) -> StoreResult<SettlementRoute> {
    let plan = match rules::plan_outcome(claim, input, policy, observed_at_ms) {
        Ok(plan) => plan,
        Err(refusal) => {
            let found = row(conn, &claim.receipt_id).await?;
            return Err(rules::refused_plan(
                found.as_ref(),
                claim,
                refusal,
                policy,
                observed_at_ms,
            ));
        }
    };
    if plan.lease_live {
        let cas = Cas::of(claim)?;
        // A failed statement changes nothing, so a refused change needs no
        // rollback; a refused history entry after an applied change fails
        // the whole job (its savepoint is rolled back), so the two always
        // stand or fall together.
        if apply(conn, &cas, plan.observed_at_ms, &plan.change).await? == 1 {
            append_history(conn, &claim.receipt_id, &plan.history)
                .await
                .map_err(|e| {
                    SettlementRouteError::backend(format!("history entry refused: {e}"))
                })?;
            return Ok(plan.route);
        }
    }
    let row = row(conn, &claim.receipt_id).await?;
    rules::explain_miss(row.as_ref(), claim, Some(input), observed_at_ms)
}

/// Record outcomes, each judged on its own; a backend error fails the whole call.
pub async fn record(
    conn: &mut SqliteConnection,
    outcomes: &[(SettlementAttemptClaim, SettlementRoutingInput)],
    policy: RetryPolicy,
    observed_at_ms: u64,
) -> StoreResult<Vec<StoreResult<SettlementRoute>>> {
    let mut results = Vec::with_capacity(outcomes.len());
    for (claim, input) in outcomes {
        match record_one(conn, claim, input, policy, observed_at_ms).await {
            Err(e @ SettlementRouteError::Backend { .. }) => return Err(e),
            other => results.push(other),
        }
    }
    Ok(results)
}

/// Why a guarded lease write matched nothing.
async fn lease_miss(
    conn: &mut SqliteConnection,
    claim: &SettlementAttemptClaim,
    now_ms: u64,
) -> SettlementRouteError {
    match row(conn, &claim.receipt_id).await {
        Ok(row) => match rules::explain_miss(row.as_ref(), claim, None, now_ms) {
            Err(e) => e,
            Ok(_) => SettlementRouteError::conflict("claim does not match the persisted row"),
        },
        Err(e) => e,
    }
}

/// Move a live lease's deadline.
pub async fn extend(
    conn: &mut SqliteConnection,
    claim: &SettlementAttemptClaim,
    now_ms: u64,
    until: i64,
) -> StoreResult<SettlementAttemptClaim> {
    let cas = Cas::of(claim)?;
    let now = to_i64(now_ms, "now_ms")?;
    let sql = sqlx::AssertSqlSafe(format!(
        "UPDATE receipts SET lease_until_ms = ?9 WHERE {CAS_WHERE} RETURNING {}",
        receipt_columns!()
    ));
    let updated: Option<ReceiptRow> = sqlx::query_as(sql)
        .bind(cas.receipt_id)
        .bind(cas.finalized_at)
        .bind(cas.attempts)
        .bind(cas.row_version)
        .bind(cas.lease_owner)
        .bind(cas.lease_token)
        .bind(cas.lease_until_ms)
        .bind(now)
        .bind(until)
        .fetch_optional(&mut *conn)
        .await?;
    match updated {
        Some(row) => row.claim(),
        None => Err(lease_miss(conn, claim, now_ms).await),
    }
}

/// Give a live lease back; the receipt is due at once.
pub async fn release(
    conn: &mut SqliteConnection,
    claim: &SettlementAttemptClaim,
    now_ms: u64,
) -> StoreResult<()> {
    let cas = Cas::of(claim)?;
    let now = to_i64(now_ms, "now_ms")?;
    let sql = sqlx::AssertSqlSafe(format!(
        "UPDATE receipts SET lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, \
         next_visible_at_ms = ?8 WHERE {CAS_WHERE}"
    ));
    let released = sqlx::query(sql)
        .bind(cas.receipt_id)
        .bind(cas.finalized_at)
        .bind(cas.attempts)
        .bind(cas.row_version)
        .bind(cas.lease_owner)
        .bind(cas.lease_token)
        .bind(cas.lease_until_ms)
        .bind(now)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if released != 1 {
        return Err(lease_miss(conn, claim, now_ms).await);
    }
    append_history(conn, &claim.receipt_id, &rules::release_entry(claim, now)).await
}

/// Put a dead letter back to work; `None` when the receipt is not dead-lettered.
pub async fn redrive(
    conn: &mut SqliteConnection,
    receipt_id: &ReceiptId,
    now: i64,
) -> StoreResult<Option<ReceiptView>> {
    let Some(current) = row(conn, receipt_id.as_str()).await? else {
        return Ok(None);
    };
    let Some(letter) = current.dead_letter()? else {
        return Ok(None);
    };
    sqlx::query(
        "UPDATE receipts SET status = 'active', attempts = 0, next_visible_at_ms = ?2, \
         finished_at_ms = NULL WHERE receipt_id = ?1 AND status = 'dead_lettered'",
    )
    .bind(receipt_id.as_str())
    .bind(now)
    .execute(&mut *conn)
    .await?;
    append_history(
        conn,
        receipt_id.as_str(),
        &rules::redrive_entry(&letter, now),
    )
    .await?;
    let updated = row(conn, receipt_id.as_str())
        .await?
        .ok_or_else(|| SettlementRouteError::backend("receipt vanished during redrive"))?;
    let entries = history(conn, receipt_id.as_str()).await?;
    updated.view(now, entries).map(Some)
}

/// Delete up to `limit` receipts finished before `before` (their history follows by cascade).
pub async fn purge(conn: &mut SqliteConnection, before: i64, limit: usize) -> StoreResult<u64> {
    Ok(sqlx::query(
        "DELETE FROM receipts WHERE receipt_id IN (SELECT receipt_id FROM receipts \
         WHERE status IN ('settled', 'skipped') AND finished_at_ms < ?1 LIMIT ?2)",
    )
    .bind(before)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .execute(conn)
    .await?
    .rows_affected())
}
