//! The routing rules (docs/concepts.md, "The rules"), shared by every backend. A backend
//! asks for a [`Plan`], applies it with one guarded write that repeats the
//! whole claim compare-and-swap, and falls back to [`explain_miss`] when the
//! guard matched no row.

use super::rows::{ReceiptRow, to_i64, to_u32, to_u64};
use super::{
    Enqueued, NewReceipt, ReceiptState, ReceiptSummary, StateCounts, StateSample, StatusView,
    StoreResult,
};
use crate::domain::{
    ConflictKind, DEFAULT_GROUP, FailureClass, RetryPolicy, SettlementAttemptClaim,
    SettlementFailureReason, SettlementRoute, SettlementRouteError, SettlementRoutingInput,
};

/// The six claim fields of the compare-and-swap, as database integers.
#[derive(Debug, Clone)]
pub struct Cas<'a> {
    pub receipt_id: &'a str,
    pub finalized_at: i64,
    pub attempts: i64,
    pub row_version: i64,
    pub lease_owner: &'a str,
    pub lease_token: &'a str,
    pub lease_until_ms: i64,
}

impl<'a> Cas<'a> {
    /// Convert a claim; a value that does not fit the database is an invalid record.
    pub fn of(claim: &'a SettlementAttemptClaim) -> StoreResult<Self> {
        Ok(Self {
            receipt_id: &claim.receipt_id,
            finalized_at: to_i64(claim.finalized_at, "finalized_at")?,
            attempts: i64::from(claim.attempts),
            row_version: to_i64(claim.row_version, "row_version")?,
            lease_owner: &claim.lease_owner,
            lease_token: &claim.lease_token,
            lease_until_ms: to_i64(claim.lease_until_ms, "lease_until_ms")?,
        })
    }
}

/// The row change an outcome asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Settle {
        transcript_id: String,
    },
    Skip {
        reason: &'static str,
    },
    Retry {
        attempts: i64,
        next_visible_at_ms: i64,
        code: &'static str,
        sha256: String,
    },
    DeadLetter {
        attempts: i64,
        code: &'static str,
        sha256: String,
    },
}

/// A history entry to append with the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHistory {
    pub attempt: i64,
    pub outcome: &'static str,
    pub code: Option<&'static str>,
    pub detail_sha256: Option<String>,
    pub transcript_id: Option<String>,
    pub reason: Option<&'static str>,
    /// The rail's wait a retryable outcome carried.
    pub retry_after_ms: Option<i64>,
    pub worker_id: String,
    pub observed_at_ms: i64,
    pub route: Option<&'static str>,
    /// Operators' entries only (see `actions`): the batched inserts of
    /// workers' entries do not write these columns.
    pub actor: Option<String>,
    pub note: Option<String>,
}

/// What recording one outcome will do if the guard matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub change: Change,
    pub route: SettlementRoute,
    pub history: NewHistory,
    /// `observed_at_ms` as a database integer.
    pub observed_at_ms: i64,
    /// Whether the lease was still live when the outcome was observed.
    pub lease_live: bool,
}

fn overflow(what: &str) -> SettlementRouteError {
    SettlementRouteError::invalid_record(format!("{what} overflows"))
}

/// Decide the route from the claim alone; the guarded write then proves the
/// claim matches the persisted row, so its `attempts` are the persisted ones.
pub fn plan_outcome(
    claim: &SettlementAttemptClaim,
    input: &SettlementRoutingInput,
    policy: RetryPolicy,
    observed_at_ms: u64,
) -> StoreResult<Plan> {
    policy
        .validate()
        .map_err(|e| SettlementRouteError::invalid_record(format!("retry policy: {e}")))?;
    let observed = to_i64(observed_at_ms, "observed_at_ms")?;
    Cas::of(claim)?;
    let invocation = claim
        .attempts
        .checked_add(1)
        .ok_or_else(|| overflow("attempts"))?;
    let (change, route) = match input {
        SettlementRoutingInput::Accepted { transcript_id } => (
            Change::Settle {
                transcript_id: transcript_id.as_str().to_owned(),
            },
            SettlementRoute::NoAction,
        ),
        SettlementRoutingInput::Skipped { reason } => (
            Change::Skip {
                reason: reason.as_str(),
            },
            SettlementRoute::NoAction,
        ),
        SettlementRoutingInput::Retryable {
            reason,
            retry_after_ms,
        } if reason.code.effective_class(FailureClass::Retryable) == FailureClass::Retryable
            && policy.allows_retry(claim.attempts) =>
        {
            let next = observed_at_ms
                .checked_add(policy.retry_wait_ms(claim.attempts, *retry_after_ms))
                .ok_or_else(|| overflow("next_visible_at_ms"))?;
            let change = Change::Retry {
                attempts: i64::from(invocation),
                next_visible_at_ms: to_i64(next, "next_visible_at_ms")?,
                code: reason.code.as_str(),
                sha256: reason.detail_sha256.clone(),
            };
            (
                change,
                SettlementRoute::RetryScheduled {
                    attempt: invocation,
                    next_visible_at_ms: next,
                },
            )
        }
        SettlementRoutingInput::Retryable { reason, .. }
        | SettlementRoutingInput::Permanent { reason } => (
            Change::DeadLetter {
                attempts: i64::from(invocation),
                code: reason.code.as_str(),
                sha256: reason.detail_sha256.clone(),
            },
            SettlementRoute::DeadLettered {
                attempts: invocation,
            },
        ),
    };
    let failure = input.failure();
    let history = NewHistory {
        attempt: i64::from(invocation),
        outcome: input.kind(),
        code: failure.map(|f| f.code.as_str()),
        detail_sha256: failure.map(|f| f.detail_sha256.clone()),
        transcript_id: match input {
            SettlementRoutingInput::Accepted { transcript_id } => {
                Some(transcript_id.as_str().to_owned())
            }
            _ => None,
        },
        reason: match input {
            SettlementRoutingInput::Skipped { reason } => Some(reason.as_str()),
            _ => None,
        },
        retry_after_ms: input
            .retry_after_ms()
            .map(|ms| to_i64(ms, "retry_after_ms"))
            .transpose()?,
        worker_id: claim.lease_owner.clone(),
        observed_at_ms: observed,
        route: Some(route.kind()),
        actor: None,
        note: None,
    };
    Ok(Plan {
        change,
        route,
        history,
        observed_at_ms: observed,
        lease_live: claim.lease_until_ms > observed_at_ms,
    })
}

/// The guarded write matched nothing: either this is an identical replay of a
/// dead-letter decision (answered as before, nothing changes), or a conflict.
pub fn explain_miss(
    row: Option<&ReceiptRow>,
    claim: &SettlementAttemptClaim,
    replay: Option<&SettlementRoutingInput>,
    observed_at_ms: u64,
) -> StoreResult<SettlementRoute> {
    let Some(row) = row else {
        return Err(SettlementRouteError::conflict(
            ConflictKind::UnknownReceipt,
            "receipt is unknown",
        ));
    };
    match row.status.as_str() {
        "dead_lettered" => {
            let letter = row
                .dead_letter()?
                .ok_or_else(|| SettlementRouteError::invalid_record("dead letter"))?;
            let same = replay
                .and_then(SettlementRoutingInput::failure)
                .is_some_and(|f: &SettlementFailureReason| {
                    f.code == letter.code && f.detail_sha256 == letter.detail_sha256
                })
                && claim.finalized_at == letter.finalized_at
                && claim.attempts.checked_add(1) == Some(letter.attempts);
            if same {
                Ok(SettlementRoute::DeadLettered {
                    attempts: letter.attempts,
                })
            } else {
                Err(SettlementRouteError::conflict(
                    ConflictKind::Finished,
                    "receipt is already dead-lettered",
                ))
            }
        }
        "settled" | "skipped" | "canceled" => Err(SettlementRouteError::conflict(
            ConflictKind::Finished,
            format!("receipt is already {}", row.status),
        )),
        _ if row.lease_token.is_none() => Err(SettlementRouteError::conflict(
            ConflictKind::NotLeased,
            "receipt is not leased",
        )),
        _ if row.lease_token.as_deref() != Some(claim.lease_token.as_str())
            || row.lease_owner.as_deref() != Some(claim.lease_owner.as_str()) =>
        {
            Err(SettlementRouteError::conflict(
                ConflictKind::LeaseMismatch,
                "lease token does not match the current lease",
            ))
        }
        _ if row
            .lease_until_ms
            .is_some_and(|u| u64::try_from(u).is_ok_and(|u| u <= observed_at_ms)) =>
        {
            Err(SettlementRouteError::conflict(
                ConflictKind::LeaseExpired,
                "lease has expired",
            ))
        }
        _ => Err(mismatch()),
    }
}

/// The claim names the current lease's receipt, but not the lease itself
/// (its version, attempts or deadline differ): someone altered it, or the
/// row moved on between the guarded write and this look.
pub fn mismatch() -> SettlementRouteError {
    SettlementRouteError::conflict(
        ConflictKind::LeaseMismatch,
        "claim does not match the persisted row",
    )
}

/// The row a claim by id picked changed before its lease was written (a
/// racing claim took it): the caller's claim lost the race.
pub fn changed_while_claimed() -> SettlementRouteError {
    SettlementRouteError::conflict(
        ConflictKind::LeaseMismatch,
        "row changed while being claimed",
    )
}

/// [`plan_outcome`] refused an outcome. When the refusal is the claim's
/// `attempts + 1` overflowing, that is the record's problem only if the claim
/// is the live one: a forged claim with `attempts = u32::MAX` is answered as
/// the conflict it is. Every other refusal (an invalid policy, a value that
/// does not fit the database, a clock overflow) stands.
pub fn refused_plan(
    row: Option<&ReceiptRow>,
    claim: &SettlementAttemptClaim,
    refusal: SettlementRouteError,
    policy: RetryPolicy,
    observed_at_ms: u64,
) -> SettlementRouteError {
    if claim.attempts != u32::MAX || policy.validate().is_err() || Cas::of(claim).is_err() {
        return refusal;
    }
    let live = row.is_some_and(|r| {
        r.status == "active"
            && r.lease_owner.as_deref() == Some(claim.lease_owner.as_str())
            && r.lease_token.as_deref() == Some(claim.lease_token.as_str())
            && r.lease_until_ms.and_then(|u| u64::try_from(u).ok()) == Some(claim.lease_until_ms)
            && u64::try_from(r.row_version).ok() == Some(claim.row_version)
            && u64::try_from(r.finalized_at).ok() == Some(claim.finalized_at)
            && i64::from(claim.attempts) == r.attempts
    });
    if live {
        return refusal;
    }
    match explain_miss(row, claim, None, observed_at_ms) {
        Err(conflict) => conflict,
        Ok(_) => refusal,
    }
}

/// Positions of a batch split into rounds in which every receipt id appears
/// once: an `UPDATE … FROM` with a repeated key applies an arbitrary one of
/// the repeats, while the serial answer is "first come, first served". Round
/// `n` holds each id's `n`-th occurrence, so repeats keep their order.
pub fn rounds<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (position, id) in ids.enumerate() {
        let n = seen.entry(id).or_insert(0);
        if rounds.len() <= *n {
            rounds.push(Vec::new());
        }
        rounds[*n].push(position);
        *n += 1;
    }
    rounds
}

/// A fresh lease token: 128 bits from the OS CSPRNG, as 32 hex characters.
pub fn new_lease_token() -> StoreResult<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| SettlementRouteError::backend(format!("os rng: {e}")))?;
    Ok(hex::encode(bytes))
}

/// A fresh store binding: 256 bits from the OS CSPRNG.
pub fn new_binding() -> StoreResult<[u8; 32]> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| SettlementRouteError::backend(format!("os rng: {e}")))?;
    Ok(bytes)
}

/// `now + lease`, checked and bounded by the database integer range.
pub fn lease_deadline(now_ms: u64, lease_ms: u64) -> StoreResult<i64> {
    let until = now_ms
        .checked_add(lease_ms)
        .ok_or_else(|| overflow("lease_until_ms"))?;
    to_i64(until, "lease_until_ms")
}

/// The next row version of a claim, checked.
pub fn next_row_version(row_version: i64) -> StoreResult<i64> {
    if row_version < 0 {
        return Err(SettlementRouteError::invalid_record(
            "stored row_version is out of range",
        ));
    }
    row_version
        .checked_add(1)
        .ok_or_else(|| overflow("row_version"))
}

/// Enqueueing an id that exists: identical (`finalized_at` and observation)
/// is a no-op, anything else a conflict. Observations compare as JSON values,
/// so key order does not matter.
pub fn same_identity(existing: &ReceiptRow, new: &NewReceipt) -> StoreResult<Enqueued> {
    let stored: Option<serde_json::Value> = existing
        .observation
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|_| SettlementRouteError::invalid_record("stored observation is not JSON"))?;
    // An absent observation and an explicit JSON null are the same identity.
    let stored = stored.filter(|v| !v.is_null());
    let offered = new.observation.as_ref().filter(|v| !v.is_null());
    let same = to_u64(existing.finalized_at, "finalized_at")? == new.finalized_at
        && stored.as_ref() == offered
        && existing.receipt_group == new.group.as_str();
    Ok(if same {
        Enqueued::Existing
    } else {
        Enqueued::Conflict
    })
}

/// The groups a batch of receipts names, other than the default group
/// (which always exists), each once: the rows `receipt_groups` must have.
pub fn named_groups<'a>(receipts: impl IntoIterator<Item = &'a NewReceipt>) -> Vec<&'a str> {
    let mut names: Vec<&str> = receipts
        .into_iter()
        .map(|r| r.group.as_str())
        .filter(|g| *g != DEFAULT_GROUP)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The history entry of a lease release.
pub fn release_entry(claim: &SettlementAttemptClaim, now: i64) -> NewHistory {
    NewHistory {
        attempt: i64::from(claim.attempts),
        outcome: "released",
        code: None,
        detail_sha256: None,
        transcript_id: None,
        reason: None,
        retry_after_ms: None,
        worker_id: claim.lease_owner.clone(),
        observed_at_ms: now,
        route: None,
        actor: None,
        note: None,
    }
}

/// One sampled receipt: `(receipt_id, finalized_at, attempts)`.
pub type SampleRow = (String, i64, i64);

/// The committed buckets kept by the counting triggers: `(fresh, retried,
/// settled, skipped, dead_lettered, canceled)`, where fresh and retried are
/// the active rows with no attempt yet and with some.
pub type Buckets = (i64, i64, i64, i64, i64, i64);

/// Per-state counts from the buckets and the leases live at the moment
/// asked, `(all, those on fresh rows)`: a leased row stays in its bucket, so
/// pending and retry_scheduled are their bucket less its live leases.
pub fn state_counts(buckets: Buckets, live: (i64, i64)) -> StoreResult<Vec<(String, i64)>> {
    let (fresh, retried, settled, skipped, dead_lettered, canceled) = buckets;
    let (live_all, live_fresh) = live;
    let counts = [
        ("pending", fresh - live_fresh),
        ("leased", live_all),
        ("retry_scheduled", retried - (live_all - live_fresh)),
        ("settled", settled),
        ("skipped", skipped),
        ("dead_lettered", dead_lettered),
        ("canceled", canceled),
    ];
    // A negative count means the counters disagree with the rows.
    if counts.iter().any(|(_, n)| *n < 0) {
        return Err(SettlementRouteError::invalid_record(
            "stored receipt counters",
        ));
    }
    Ok(counts
        .into_iter()
        .map(|(state, n)| (state.to_owned(), n))
        .collect())
}

/// Assemble `/v1/status` from per-state counts, the pending receipts not
/// yet visible, the oldest due time and per-state samples (each already
/// limited to `limit` rows).
pub fn build_status(
    now: i64,
    counted: Vec<(String, i64)>,
    scheduled: i64,
    oldest_due_ms: Option<i64>,
    samples: Vec<(ReceiptState, Vec<SampleRow>)>,
) -> StoreResult<StatusView> {
    let mut counts = StateCounts::default();
    for (label, n) in counted {
        let state = ReceiptState::ALL
            .into_iter()
            .find(|s| s.as_str() == label)
            .ok_or_else(|| SettlementRouteError::invalid_record("stored status"))?;
        counts.add(state, to_u64(n, "count")?);
    }
    counts.scheduled = to_u64(scheduled, "scheduled")?;
    let oldest_due_age_ms =
        oldest_due_ms.map_or(Ok(0), |t| to_u64(now.saturating_sub(t).max(0), "age"))?;
    let mut out = std::collections::BTreeMap::new();
    for (state, rows) in samples {
        let receipts = rows
            .into_iter()
            .map(|(receipt_id, finalized_at, attempts)| {
                Ok(ReceiptSummary {
                    receipt_id,
                    finalized_at: to_u64(finalized_at, "finalized_at")?,
                    attempts: to_u32(attempts, "attempts")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        let total = counts.get(state);
        let returned = receipts.len() as u64;
        out.insert(
            state,
            StateSample {
                total,
                returned,
                truncated: total > returned,
                receipts,
            },
        );
    }
    Ok(StatusView {
        counts,
        oldest_due_age_ms,
        samples: out,
        groups: Vec::new(),
    })
}
