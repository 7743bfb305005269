//! Tests of the store's views and their labels (`views`).

use super::*;
use crate::domain::{Outcome, Route, TranscriptId};

fn label<T: Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

/// History rows hold these labels as text: the enums must name them all.
#[test]
fn history_labels_are_the_documented_enums() {
    let outcome = Outcome::Accepted {
        transcript_id: TranscriptId::parse("tx").unwrap(),
    };
    let failure = crate::domain::SettlementFailureReason::new(SettlementFailureCode::Rpc, "");
    let outcomes = [
        outcome.kind(),
        Outcome::Skipped {
            reason: SettlementSkipReason::Denied,
        }
        .kind(),
        Outcome::Retryable {
            reason: failure.clone(),
            retry_after_ms: None,
        }
        .kind(),
        Outcome::Permanent { reason: failure }.kind(),
    ];
    let one = crate::domain::U63::from(1_u32);
    let claim = crate::domain::Claim {
        receipt_id: crate::domain::ReceiptId::parse("r").unwrap(),
        finalized_at: one,
        attempts: 0,
        row_version: one,
        lease_owner: crate::domain::WorkerId::parse("w").unwrap(),
        lease_token: crate::domain::LeaseToken::parse("t").unwrap(),
        lease_until_ms: one,
    };
    use super::super::actions::OperatorAction;
    let operator = [
        OperatorAction::Redrive,
        OperatorAction::Hold { reason: None },
        OperatorAction::Unhold,
        OperatorAction::Cancel { reason: "r".into() },
    ]
    .map(|a| a.name());
    let others = [super::super::rules::release_entry(&claim, 1).outcome]
        .into_iter()
        .chain(operator);
    let documented = HistoryOutcome::ALL.map(label);
    assert_eq!(
        outcomes.into_iter().chain(others).collect::<Vec<_>>(),
        documented
    );

    let routes = [
        Route::NoAction,
        Route::RetryScheduled {
            attempt: 1,
            next_visible_at_ms: 1,
        },
        Route::DeadLettered { attempts: 1 },
    ]
    .map(|r| r.kind());
    let documented = RouteKind::ALL.map(label);
    assert_eq!(routes.to_vec(), documented);
}
