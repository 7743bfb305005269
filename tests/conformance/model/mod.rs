//! Model-based property test: random sequences of store operations, driven
//! through a real store and through a small in-memory model of the rules
//! (docs/concepts.md); every answer and every receipt view must agree after
//! every step.

mod ops;
mod reference;

use std::collections::{BTreeMap, HashSet};

use crate::common;
use common::ms;
use proptest::prelude::*;

use settled::domain::*;
use settled::store::{NewReceipt, ReceiptClaim, ReceiptState, SettlementOutcomeStore};

use ops::*;
use reference::*;

fn class<T>(r: Result<T, StoreError>) -> Answer<T> {
    r.map_err(|e| e.class())
}

/// Claims compare on every field but the token, which the model adopts.
fn same_but_token(got: &Claimed, want: &Claimed) -> bool {
    let mut got = got.clone();
    got.claim.lease_token = want.lease_token.clone();
    got == *want
}

async fn run_case(store: &dyn SettlementOutcomeStore, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let mut held: Vec<Claim> = Vec::new();
    let mut tokens = HashSet::new();
    let mut sent: Vec<(Claim, Kind)> = Vec::new();
    let mut now = T0;
    let worker = |w: u8| WorkerId::parse(&format!("worker-{w}")).unwrap();
    for (step, op) in ops.iter().enumerate() {
        let live: Vec<_> = held
            .iter()
            .filter(|c| model.rows[c.receipt_id.as_str()].matches(c, 0))
            .cloned()
            .collect();
        let pick = |p: &Pick| {
            let n = held.len();
            (n > 0).then(|| match p {
                Pick::Live(i) if !live.is_empty() => live[i.index(live.len())].clone(),
                Pick::Live(i) | Pick::Recent(i) => held[n - 1 - i.index(n.min(3))].clone(),
                Pick::Any(i) => held[i.index(n)].clone(),
            })
        };
        match op {
            Op::Enqueue(items) => {
                let receipts: Vec<NewReceipt> = items
                    .iter()
                    .map(|&(id, fin, obs, vis, prio)| NewReceipt {
                        receipt_id: ReceiptId::parse(IDS[usize::from(id)]).unwrap(),
                        finalized_at: FIN[usize::from(fin)],
                        observation: observation(obs),
                        visible_at_ms: vis.map(|d| ms(now.saturating_add_signed(d))),
                        group: settled::domain::GroupName::default_group(),
                        priority: Priority::parse(PRIORITIES[usize::from(prio)]).unwrap(),
                        trace: None,
                    })
                    .collect();
                let got = store.enqueue(&receipts, ms(now)).await.unwrap();
                let want: Vec<_> = receipts.iter().map(|r| model.enqueue(r, now)).collect();
                prop_assert_eq!(got, want, "step {}: {:?}", step, op);
            }
            Op::ClaimDue {
                worker: w,
                lease,
                limit,
            } => {
                let got = store
                    .claim_due(
                        &worker(*w),
                        ms(now),
                        LeaseMs::try_from(*lease).unwrap(),
                        ClaimLimit::try_from(*limit).unwrap(),
                    )
                    .await
                    .unwrap();
                let due = model.due(now, *limit);
                prop_assert_eq!(
                    got.len(),
                    due.len(),
                    "step {}: claimed {:?}, model due {:?}",
                    step,
                    got,
                    due
                );
                for (claim, id) in got.iter().zip(&due) {
                    let want = model.lease(
                        id,
                        worker(*w).as_str(),
                        now,
                        *lease,
                        claim.lease_token.as_str(),
                    );
                    prop_assert!(
                        same_but_token(claim, &want),
                        "step {}: {:?} != {:?}",
                        step,
                        claim,
                        want
                    );
                    prop_assert!(tokens.insert(claim.lease_token.clone()), "token repeated");
                    held.push(claim.claim.clone());
                }
            }
            Op::ClaimReceipt {
                id,
                worker: w,
                lease,
            } => {
                let rid = ReceiptId::parse(IDS[usize::from(*id)]).unwrap();
                let got = store
                    .claim_receipt(
                        &rid,
                        &worker(*w),
                        ms(now),
                        LeaseMs::try_from(*lease).unwrap(),
                    )
                    .await
                    .unwrap();
                let want = match model.rows.get(rid.as_str()) {
                    Some(row) if row.claimable(now) => None,
                    Some(row) if row.state(now) == ReceiptState::Leased => {
                        Some(ReceiptClaim::Leased)
                    }
                    Some(row) if matches!(row.status, Status::Active) => {
                        Some(ReceiptClaim::NotYetVisible)
                    }
                    _ => Some(ReceiptClaim::NoActiveWork),
                };
                match (got, want) {
                    (ReceiptClaim::Claimed(claim), None) => {
                        let want = model.lease(
                            rid.as_str(),
                            worker(*w).as_str(),
                            now,
                            *lease,
                            claim.lease_token.as_str(),
                        );
                        prop_assert!(
                            same_but_token(&claim, &want),
                            "step {}: {:?} != {:?}",
                            step,
                            claim,
                            want
                        );
                        prop_assert!(tokens.insert(claim.lease_token.clone()), "token repeated");
                        held.push(claim.claim);
                    }
                    (got, want) => prop_assert_eq!(Some(got), want, "step {}: {:?}", step, op),
                }
            }
            Op::Record { items, policy: p } => {
                let chosen: Vec<_> = items
                    .iter()
                    .filter_map(|(i, t, k)| pick(i).map(|c| (c, *t, *k)))
                    .collect();
                sent.extend(chosen.iter().map(|(c, _, k)| (c.clone(), *k)));
                let batch: Vec<_> = chosen
                    .iter()
                    .map(|(c, t, k)| (tampered(c, *t), k.input()))
                    .collect();
                let got = store
                    .record_claimed_outcomes(&batch, policy(*p), ms(now))
                    .await
                    .unwrap();
                let got: Vec<_> = got.into_iter().map(class).collect();
                let want: Vec<_> = batch
                    .iter()
                    .map(|(c, input)| model.record(c, input, policy(*p), now))
                    .collect();
                prop_assert_eq!(got, want, "step {}: {:?} with {:?}", step, op, batch);
            }
            Op::Replay {
                which,
                tamper: t,
                other,
                policy: p,
            } => {
                if sent.is_empty() {
                    continue;
                }
                let (claim, kind) = &sent[which.index(sent.len())];
                let (c, input) = (tampered(claim, *t), other.unwrap_or(*kind).input());
                let got = store
                    .record_claimed_outcomes(&[(c.clone(), input.clone())], policy(*p), ms(now))
                    .await;
                let got: Vec<_> = got.unwrap().into_iter().map(class).collect();
                prop_assert_eq!(
                    got,
                    [model.record(&c, &input, policy(*p), now)],
                    "step {}: {:?}",
                    step,
                    op
                );
            }
            Op::Extend {
                claim,
                tamper: t,
                extend,
            } => {
                let Some(c) = pick(claim).map(|c| tampered(&c, *t)) else {
                    continue;
                };
                let got = class(
                    store
                        .extend_lease(&c, LeaseMs::try_from(*extend).unwrap(), ms(now))
                        .await,
                );
                let want = model.extend(&c, *extend, now);
                prop_assert_eq!(&got, &want, "step {}: {:?}", step, op);
                if let Ok(extended) = got {
                    held.push(extended.claim);
                }
            }
            Op::Release { claim, tamper: t } => {
                let Some(c) = pick(claim).map(|c| tampered(&c, *t)) else {
                    continue;
                };
                let got = class(store.release_lease(&c, ms(now)).await);
                prop_assert_eq!(got, model.release(&c, now), "step {}: {:?}", step, op);
            }
            Op::Redrive { id } => {
                let rid = ReceiptId::parse(IDS[usize::from(*id)]).unwrap();
                let got = store.redrive(&rid, ms(now)).await.unwrap();
                prop_assert_eq!(
                    got,
                    model.redrive(rid.as_str(), now),
                    "step {}: {:?}",
                    step,
                    op
                );
            }
            Op::Advance(ms) => now += ms,
            Op::ToDeadline { claim, minus } => {
                if let Some(c) = pick(claim) {
                    now = now.max(c.lease_until_ms.get() - minus);
                }
            }
            Op::ToVisible { id } => {
                if let Some(v) = model
                    .rows
                    .get(IDS[usize::from(*id)])
                    .and_then(|r| r.next_visible)
                {
                    now = now.max(v);
                }
            }
        }
        check_views(store, &model, now, step).await?;
    }
    Ok(())
}

/// Every receipt view, the dead-letter list and the status agree with the model.
async fn check_views(
    store: &dyn SettlementOutcomeStore,
    model: &Model,
    now: u64,
    step: usize,
) -> Result<(), TestCaseError> {
    for id in IDS {
        let got = store
            .receipt(&ReceiptId::parse(id).unwrap(), ms(now))
            .await
            .unwrap();
        let want = model.rows.get(id).map(|r| r.view(id, now));
        prop_assert_eq!(got, want, "step {}: view of {} at {}", step, id, now);
    }
    let mut letters: Vec<_> = model
        .rows
        .iter()
        .filter_map(|(id, r)| r.dead_letter(id))
        .collect();
    letters.sort_by_key(|d| (d.finalized_at, d.receipt_id.clone()));
    prop_assert_eq!(
        store.dead_letters(100, None).await.unwrap(),
        letters,
        "step {}: dead letters",
        step
    );

    let status = store.status(ms(now), SAMPLE).await.unwrap();
    let mut by_state: BTreeMap<ReceiptState, Vec<(u64, String, u32)>> = BTreeMap::new();
    for (id, row) in &model.rows {
        by_state.entry(row.state(now)).or_default().push((
            row.finalized_at,
            id.clone(),
            row.attempts,
        ));
    }
    for state in ReceiptState::ALL {
        let mut rows = by_state.remove(&state).unwrap_or_default();
        rows.sort();
        let sample = &status.samples[&state];
        prop_assert_eq!(
            status.counts.get(state),
            rows.len() as u64,
            "step {}: count of {:?}",
            step,
            state
        );
        prop_assert_eq!(sample.truncated, rows.len() > SAMPLE);
        let ids: Vec<_> = sample
            .receipts
            .iter()
            .map(|r| (r.finalized_at, r.receipt_id.clone(), r.attempts))
            .collect();
        prop_assert_eq!(
            ids,
            rows.into_iter().take(SAMPLE).collect::<Vec<_>>(),
            "step {}: sample {:?}",
            step,
            state
        );
    }
    let oldest = model
        .rows
        .values()
        .filter(|r| r.claimable(now))
        .filter_map(|r| r.next_visible)
        .min();
    prop_assert_eq!(
        status.oldest_due_age_ms,
        oldest.map_or(0, |t| now - t),
        "step {}: oldest due",
        step
    );
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    // Failing seeds are kept beside this file (main.proptest-regressions):
    // proptest's default puts a `main.rs`'s under `tests/proptest-regressions/`.
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn sqlite_store_agrees_with_the_model(ops in case()) {
        runtime().block_on(async {
            let fresh = common::fresh_sqlite().await;
            run_case(fresh.store.as_ref(), &ops).await
        })?;
    }
}

/// Fresh database per case, so fewer cases: set `SETTLED_TEST_POSTGRES_URL` to run it.
#[test]
fn postgres_store_agrees_with_the_model() {
    if std::env::var(common::POSTGRES_ENV).is_err() {
        eprintln!(
            "SKIPPED: {} is not set, so the PostgreSQL model test did not run",
            common::POSTGRES_ENV
        );
        return;
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(12));
    let result = runner.run(&case(), |ops| {
        runtime().block_on(async {
            let fresh = common::fresh_postgres().await.expect("postgres");
            run_case(fresh.store.as_ref(), &ops).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
