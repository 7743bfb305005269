//! A worker's report and its next claim in one store call
//! (`record_and_claim`, `POST /v1/claims` with `outcomes`): the outcomes are
//! recorded as `record_claimed_outcomes` records them, then the claim is
//! made; the outcomes stand whatever becomes of the claim, and a report
//! sent again records nothing twice.

use futures_util::future::join_all;
use settled::domain::{Claimed, RetryPolicy, Route, StoreErrorClass};
use settled::store::{ClaimAsk, DueClaims, ReceiptState, Reported};

use super::support::*;
use crate::common::{Fresh, raw_exec, raw_exec_unchecked};

/// Report `done` (each accepted) and claim up to `n` as `who` at `now`.
async fn report(fresh: &Fresh, who: &str, done: &[Claimed], n: usize, now: u64) -> Reported {
    let outcomes: Vec<_> = done
        .iter()
        .map(|c| {
            (
                c.claim.clone(),
                accepted(&format!("tx-{}", c.claim.receipt_id.as_str())),
            )
        })
        .collect();
    let who = worker(who);
    let ask = ClaimAsk {
        worker_id: &who,
        now_ms: ms(now),
        lease_ms: lease(30_000),
        limit: limit(n),
        only: &[],
    };
    store(fresh)
        .record_and_claim(&outcomes, RetryPolicy::default(), ask)
        .await
        .expect("the report is recorded")
}

/// The ids `due` claimed, each asserted to be leased to `owner`.
fn leased_to(due: &DueClaims<Claimed>, owner: &str) -> Vec<String> {
    assert!(
        due.claims
            .iter()
            .all(|c| c.claim.lease_owner.as_str() == owner),
        "claims of another worker in {owner}'s answer"
    );
    ids_of(due)
}

fn ids_of(due: &DueClaims<Claimed>) -> Vec<String> {
    due.claims
        .iter()
        .map(|c| c.claim.receipt_id.as_str().to_owned())
        .collect()
}

fn claimed_ids(reported: &Reported) -> Vec<String> {
    ids_of(reported.claimed.as_ref().expect("the claim is made"))
}

async fn the_outcomes_are_recorded_then_the_claim_is_made(fresh: Fresh) {
    enqueue_new(&fresh, &["a", "b", "c"].map(receipt), T0).await;
    let a = claim(&fresh, "a", "w", T0, 30_000).await;
    let reported = report(&fresh, "w", std::slice::from_ref(&a), 5, T0 + 1).await;
    assert_eq!(reported.results, [Ok(Route::NoAction)]);
    // The settled receipt is not claimed again: the outcome came first.
    assert_eq!(claimed_ids(&reported), ["b", "c"]);
    let v = view(&fresh, "a", T0 + 1).await;
    assert_eq!(
        (v.state, v.transcript_id.as_deref()),
        (ReceiptState::Settled, Some("tx-a"))
    );
    assert_eq!(state(&fresh, "b", T0 + 1).await, ReceiptState::Leased);
}

async fn a_report_sent_again_records_nothing_twice(fresh: Fresh) {
    enqueue_new(&fresh, &["a", "b"].map(receipt), T0).await;
    let a = claim(&fresh, "a", "w", T0, 30_000).await;
    let first = report(&fresh, "w", std::slice::from_ref(&a), 1, T0 + 1).await;
    assert_eq!(first.results, [Ok(Route::NoAction)]);
    assert_eq!(claimed_ids(&first), ["b"]);
    // Its answer was lost: the same report again.
    let again = report(&fresh, "w", std::slice::from_ref(&a), 1, T0 + 2).await;
    assert_class(&again.results[0], StoreErrorClass::Conflict);
    assert_eq!(claimed_ids(&again), Vec::<String>::new());
    assert_eq!(view(&fresh, "a", T0 + 2).await.history.len(), 1);
    assert_eq!(state(&fresh, "b", T0 + 2).await, ReceiptState::Leased);
}

async fn a_claim_that_fails_after_the_outcomes_keeps_them(fresh: Fresh) {
    enqueue_new(&fresh, &["a", "z"].map(receipt), T0).await;
    let a = claim(&fresh, "a", "w", T0, 30_000).await;
    // A corrupt row (its version cannot advance) makes the claim fail.
    raw_exec_unchecked(
        &fresh,
        "UPDATE receipts SET row_version = 9223372036854775807 WHERE receipt_id = 'z'",
    )
    .await
    .expect("plant a corrupt row");
    let reported = report(&fresh, "w", std::slice::from_ref(&a), 1, T0 + 1).await;
    assert_eq!(reported.results, [Ok(Route::NoAction)]);
    assert_class(&reported.claimed, StoreErrorClass::InvalidRecord);
    assert_eq!(state(&fresh, "a", T0 + 1).await, ReceiptState::Settled);
}

async fn an_outcome_the_database_refuses_fails_alone_and_the_claim_is_made(fresh: Fresh) {
    enqueue_new(&fresh, &["a", "bad", "c"].map(receipt), T0).await;
    let a = claim(&fresh, "a", "w", T0, 30_000).await;
    let bad = claim(&fresh, "bad", "w", T0, 30_000).await;
    plant_refusal(&fresh, "bad").await;
    let reported = report(&fresh, "w", &[a, bad], 1, T0 + 1).await;
    assert_eq!(reported.results[0], Ok(Route::NoAction));
    assert_invalid(&reported.results[1]);
    assert_eq!(claimed_ids(&reported), ["c"]);
    assert_eq!(state(&fresh, "a", T0 + 1).await, ReceiptState::Settled);
    assert_eq!(state(&fresh, "bad", T0 + 1).await, ReceiptState::Leased);
}

/// The server fails any lease for worker "doomed" (as a time limit or a
/// lock it gave up on would fail the claim), not an outcome's write.
async fn plant_doom(fresh: &Fresh) {
    let doom = if fresh.url.starts_with("sqlite:") {
        vec![
            "CREATE TRIGGER doom BEFORE UPDATE ON receipts WHEN NEW.lease_owner = 'doomed' \
             BEGIN SELECT RAISE(ABORT, 'doomed'); END",
        ]
    } else {
        vec![
            "CREATE FUNCTION doom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.lease_owner = 'doomed' THEN RAISE EXCEPTION 'doomed'; END IF; \
             RETURN NEW; END $$",
            "CREATE TRIGGER doom BEFORE UPDATE ON receipts FOR EACH ROW EXECUTE FUNCTION doom()",
        ]
    };
    for sql in doom {
        raw_exec(fresh, sql).await.expect("plant the trigger");
    }
}

async fn a_claim_the_database_fails_after_the_outcomes_keeps_them(fresh: Fresh) {
    enqueue_new(&fresh, &["a", "b"].map(receipt), T0).await;
    let a = claim(&fresh, "a", "doomed", T0, 30_000).await;
    plant_doom(&fresh).await;
    let reported = report(&fresh, "doomed", std::slice::from_ref(&a), 1, T0 + 1).await;
    assert_eq!(reported.results, [Ok(Route::NoAction)]);
    assert_class(&reported.claimed, StoreErrorClass::Backend);
    assert_eq!(state(&fresh, "a", T0 + 1).await, ReceiptState::Settled);
    assert_eq!(state(&fresh, "b", T0 + 1).await, ReceiptState::Pending);
}

/// `total` receipts enqueued (`r00`, `r01`, …), the first sixteen claimed
/// by "w": their ids, and the sixteen claims.
async fn sixteen_held(fresh: &Fresh, total: usize) -> (Vec<String>, Vec<Claimed>) {
    let ids: Vec<String> = (0..total).map(|i| format!("r{i:02}")).collect();
    let receipts: Vec<_> = ids.iter().map(|id| receipt(id)).collect();
    enqueue_new(fresh, &receipts, T0).await;
    let mut held = Vec::new();
    for id in &ids[..16] {
        held.push(claim(fresh, id, "w", T0, 30_000).await);
    }
    (ids, held)
}

async fn many_workers_report_and_claim_at_once(fresh: Fresh) {
    // Concurrent reports and plain claims, as a busy server merges them:
    // every outcome is recorded once and every receipt claimed by one
    // worker, the right one's answer carrying it.
    let (ids, held) = sixteen_held(&fresh, 64).await;
    let names: Vec<String> = (0..held.len()).map(|i| format!("w{i}")).collect();
    let reporting = join_all(
        held.iter()
            .zip(&names)
            .map(|(c, name)| report(&fresh, name, std::slice::from_ref(c), 2, T0 + 1)),
    );
    let plain: Vec<_> = (0..8).map(|i| worker(&format!("p{i}"))).collect();
    let claiming = join_all(
        plain
            .iter()
            .map(|w| store(&fresh).claim_from(w, ms(T0 + 1), lease(30_000), limit(2), &[])),
    );
    let (reports, claims) = tokio::join!(reporting, claiming);
    let mut claimed = Vec::new();
    for (reported, name) in reports.iter().zip(&names) {
        assert_eq!(reported.results, [Ok(Route::NoAction)]);
        let due = reported.claimed.as_ref().expect("the claim is made");
        claimed.extend(leased_to(due, name));
    }
    for (due, w) in claims.iter().zip(&plain) {
        let due = due.as_ref().expect("the plain claim is made");
        claimed.extend(leased_to(due, w.as_str()));
    }
    claimed.sort();
    assert_eq!(claimed, ids[16..]);
    for id in &ids[..16] {
        assert_eq!(state(&fresh, id, T0 + 1).await, ReceiptState::Settled);
    }
}

async fn outcomes_sent_alone_beside_claims_are_judged_alone(fresh: Fresh) {
    // Outcomes sent alone, at the same time as reports and plain claims: an
    // outcome the database refuses fails alone, and every other outcome and
    // claim is made once, the right worker's answer carrying it.
    let (ids, held) = sixteen_held(&fresh, 40).await;
    plant_refusal(&fresh, "r03").await;
    let fresh = &fresh;
    let (alone, reported) = held.split_at(14);
    let recording = join_all(alone.iter().map(|c| async move {
        let outcome = accepted(&format!("tx-{}", c.claim.receipt_id.as_str()));
        record(fresh, &c.claim, &outcome, RetryPolicy::default(), T0 + 1).await
    }));
    let reporters = ["q0", "q1"];
    let reporting = join_all(
        reported
            .iter()
            .zip(reporters)
            .map(|(c, name)| report(fresh, name, std::slice::from_ref(c), 2, T0 + 1)),
    );
    let claimers: Vec<_> = (0..8).map(|i| worker(&format!("p{i}"))).collect();
    let claiming = join_all(
        claimers
            .iter()
            .map(|w| store(fresh).claim_from(w, ms(T0 + 1), lease(30_000), limit(2), &[])),
    );
    let (recorded, reports, claims) = tokio::join!(recording, reporting, claiming);
    for (result, id) in recorded.iter().zip(&ids) {
        if id == "r03" {
            assert_invalid(result);
        } else {
            assert_eq!(result, &Ok(Route::NoAction), "{id}");
        }
    }
    let mut claimed = Vec::new();
    for (reported, name) in reports.iter().zip(reporters) {
        assert_eq!(reported.results, [Ok(Route::NoAction)]);
        let due = reported.claimed.as_ref().expect("the claim is made");
        assert_eq!(due.claims.len(), 2, "{name}");
        claimed.extend(leased_to(due, name));
    }
    for (due, w) in claims.iter().zip(&claimers) {
        let due = due.as_ref().expect("the plain claim is made");
        assert_eq!(due.claims.len(), 2, "{w:?}");
        claimed.extend(leased_to(due, w.as_str()));
    }
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), 20);
    assert!(claimed.iter().all(|id| ids[16..].contains(id)));
    for id in &ids[..16] {
        let expected = if id == "r03" {
            ReceiptState::Leased
        } else {
            ReceiptState::Settled
        };
        assert_eq!(state(fresh, id, T0 + 1).await, expected, "{id}");
    }
}

crate::on_every_backend!(
    the_outcomes_are_recorded_then_the_claim_is_made,
    a_report_sent_again_records_nothing_twice,
    a_claim_that_fails_after_the_outcomes_keeps_them,
    an_outcome_the_database_refuses_fails_alone_and_the_claim_is_made,
    a_claim_the_database_fails_after_the_outcomes_keeps_them,
    many_workers_report_and_claim_at_once,
    outcomes_sent_alone_beside_claims_are_judged_alone,
);
