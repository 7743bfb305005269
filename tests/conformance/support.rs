//! Small helpers shared by the conformance suite: typed values, canned
//! outcomes, and direct reads of the database under the store.

pub use crate::common::ms;
use serde_json::Value;
use settled::domain::{
    Claim, ClaimLimit, LeaseMs, Outcome, ReceiptId, RetryPolicy, Route, SettlementFailureCode,
    SettlementFailureReason, SettlementSkipReason, StoreError, StoreErrorClass, TranscriptId,
    WorkerId,
};
use settled::store::{
    NewReceipt, ReceiptClaim, ReceiptState, ReceiptView, SettlementOutcomeStore, StoreResult,
};

use crate::common::{Fresh, raw_exec, raw_exec_unchecked};

/// A finalization time used by most tests (Unix seconds).
pub const FIN: u64 = 1_700_000_000;
/// The server clock most tests start at (ms).
pub const T0: u64 = 1_000_000;

pub fn rid(id: &str) -> ReceiptId {
    ReceiptId::parse(id).expect("valid receipt id")
}

pub fn worker(id: &str) -> WorkerId {
    WorkerId::parse(id).expect("valid worker id")
}

pub fn lease(ms: u64) -> LeaseMs {
    LeaseMs::try_from(ms).expect("valid lease")
}

pub fn limit(n: usize) -> ClaimLimit {
    ClaimLimit::try_from(n).expect("valid limit")
}

/// A receipt due now, with no observation.
pub fn receipt(id: &str) -> NewReceipt {
    NewReceipt {
        priority: settled::domain::Priority::default(),
        trace: None,
        receipt_id: rid(id),
        finalized_at: FIN,
        observation: None,
        visible_at_ms: None,
        group: settled::domain::GroupName::default_group(),
    }
}

pub fn receipt_with(
    id: &str,
    finalized_at: u64,
    observation: Option<Value>,
    visible: Option<u64>,
) -> NewReceipt {
    NewReceipt {
        priority: settled::domain::Priority::default(),
        trace: None,
        receipt_id: rid(id),
        finalized_at,
        observation,
        visible_at_ms: (visible).map(ms),
        group: settled::domain::GroupName::default_group(),
    }
}

pub fn accepted(transcript: &str) -> Outcome {
    Outcome::Accepted {
        transcript_id: TranscriptId::parse(transcript).unwrap(),
    }
}

pub fn skipped(reason: SettlementSkipReason) -> Outcome {
    Outcome::Skipped { reason }
}

pub fn retryable(code: SettlementFailureCode, detail: &str) -> Outcome {
    Outcome::Retryable {
        reason: SettlementFailureReason::new(code, detail),
        retry_after_ms: None,
    }
}

pub fn permanent(code: SettlementFailureCode, detail: &str) -> Outcome {
    Outcome::Permanent {
        reason: SettlementFailureReason::new(code, detail),
    }
}

pub fn rpc(detail: &str) -> Outcome {
    retryable(SettlementFailureCode::Rpc, detail)
}

pub fn sha256_hex(text: &str) -> String {
    SettlementFailureReason::new(SettlementFailureCode::Rpc, text).detail_sha256
}

pub fn store(fresh: &Fresh) -> &(dyn SettlementOutcomeStore + 'static) {
    fresh.store.as_ref()
}

/// Enqueue receipts that must all be new.
pub async fn enqueue_new(fresh: &Fresh, receipts: &[NewReceipt], now: u64) {
    let results = store(fresh)
        .enqueue(receipts, ms(now))
        .await
        .expect("enqueue");
    assert!(
        results
            .iter()
            .all(|r| *r == settled::store::Enqueued::Created),
        "expected every receipt to be created: {results:?}"
    );
}

/// Claim one receipt by id; it must be claimable.
pub async fn claim(
    fresh: &Fresh,
    id: &str,
    who: &str,
    now: u64,
    lease_ms: u64,
) -> settled::domain::Claimed {
    match store(fresh)
        .claim_receipt(&rid(id), &worker(who), ms(now), lease(lease_ms))
        .await
    {
        Ok(ReceiptClaim::Claimed(claim)) => *claim,
        other => panic!("expected {id} to be claimable at {now}, got {other:?}"),
    }
}

/// A batch of outcomes under claims as handed out, as the store takes them.
pub fn leases(items: Vec<(settled::domain::Claimed, Outcome)>) -> Vec<(Claim, Outcome)> {
    items.into_iter().map(|(c, o)| (c.claim, o)).collect()
}

/// Record one outcome through the `dyn` convenience wrapper.
pub async fn record(
    fresh: &Fresh,
    claim: &Claim,
    outcome: &Outcome,
    policy: RetryPolicy,
    at: u64,
) -> StoreResult<Route> {
    store(fresh)
        .record_claimed_outcome(claim, outcome, policy, ms(at))
        .await
}

/// The receipt's view; it must exist.
pub async fn view(fresh: &Fresh, id: &str, now: u64) -> ReceiptView {
    store(fresh)
        .receipt(&rid(id), ms(now))
        .await
        .expect("receipt")
        .expect("known receipt")
}

pub async fn state(fresh: &Fresh, id: &str, now: u64) -> ReceiptState {
    view(fresh, id, now).await.state
}

#[track_caller]
pub fn assert_class<T: std::fmt::Debug>(result: &Result<T, StoreError>, class: StoreErrorClass) {
    match result {
        Err(e) => assert_eq!(e.class(), class, "wrong error class: {e}"),
        Ok(v) => panic!("expected a {class:?} error, got Ok({v:?})"),
    }
}

#[track_caller]
pub fn assert_conflict<T: std::fmt::Debug>(result: &Result<T, StoreError>) {
    assert_class(result, StoreErrorClass::Conflict);
}

#[track_caller]
pub fn assert_invalid<T: std::fmt::Debug>(result: &Result<T, StoreError>) {
    assert_class(result, StoreErrorClass::InvalidRecord);
}

/// Every text the store keeps about receipts and their history, in one string.
pub async fn everything_stored(fresh: &Fresh) -> String {
    let mut all = String::new();
    for sql in [
        "SELECT CAST(receipt_id AS TEXT) || '|' || COALESCE(CAST(observation AS TEXT), '') || '|' \
         || COALESCE(lease_owner, '') || '|' || COALESCE(lease_token, '') || '|' \
         || COALESCE(CAST(failure_code AS TEXT), '') || '|' || COALESCE(failure_sha256, '') || '|' \
         || COALESCE(transcript_id, '') || '|' || COALESCE(CAST(skip_reason AS TEXT), '') FROM receipts",
        "SELECT CAST(receipt_id AS TEXT) || '|' || CAST(outcome AS TEXT) || '|' \
         || COALESCE(CAST(code AS TEXT), '') || '|' || COALESCE(detail_sha256, '') || '|' \
         || COALESCE(transcript_id, '') || '|' || COALESCE(CAST(reason AS TEXT), '') || '|' || worker_id \
         || '|' || COALESCE(CAST(route AS TEXT), '') FROM receipt_history",
    ] {
        for row in crate::common::raw_scalars::<Option<String>>(fresh, sql)
            .await
            .into_iter()
            .flatten()
        {
            all.push_str(&row);
            all.push('\n');
        }
    }
    all
}

/// An i64 column of one receipt, straight from the database.
pub async fn raw_i64(fresh: &Fresh, column: &str, id: &str) -> Option<i64> {
    let sql = format!("SELECT CAST({column} AS BIGINT) FROM receipts WHERE receipt_id = '{id}'");
    let mut rows = crate::common::raw_scalars::<Option<i64>>(fresh, &sql).await;
    assert_eq!(rows.len(), 1, "one row for {id}");
    rows.pop().flatten()
}

/// Claim one receipt by id and return whatever the store answered.
pub async fn try_claim(
    fresh: &Fresh,
    id: &str,
    who: &str,
    now: u64,
    lease_ms: u64,
) -> StoreResult<ReceiptClaim> {
    store(fresh)
        .claim_receipt(&rid(id), &worker(who), ms(now), lease(lease_ms))
        .await
}

/// Make the database refuse to finish receipt `id` (a CHECK, as a corrupt
/// row meets it), on either backend.
pub async fn plant_refusal(fresh: &Fresh, id: &str) {
    if fresh.url.starts_with("sqlite:") {
        // A cancel reason on an active row: a write that finishes it breaks a CHECK.
        let sql =
            format!("UPDATE receipts SET cancel_reason = 'planted' WHERE receipt_id = '{id}'");
        raw_exec_unchecked(fresh, &sql).await.unwrap();
    } else {
        let sql = format!(
            "ALTER TABLE receipts ADD CONSTRAINT planted \
             CHECK (receipt_id <> '{id}' OR status = 'active') NOT VALID"
        );
        raw_exec(fresh, &sql).await.unwrap();
    }
}
