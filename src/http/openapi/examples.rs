//! The request bodies `/docs` fills in for "Try it out": realistic, and
//! each one a request the server accepts (the tests parse them).

use serde_json::{Value, json};

/// A claim as a worker got it from `POST /v1/claims`.
fn claim_example(receipt_id: &str, amount_cents: u64) -> Value {
    json!({
        "receipt_id": receipt_id,
        "finalized_at": 1_764_460_800,
        "attempts": 0,
        "row_version": 1,
        "lease_owner": "worker-a",
        "lease_token": "3f9c2a7e5b1d4c8a9e0f6b2d7a1c5e3b",
        "lease_until_ms": 1_764_460_830_000_u64,
        "observation": {"amount_cents": amount_cents, "currency": "EUR"},
        "group": "rail:ach"
    })
}

fn receipt_example(receipt_id: &str, amount_cents: u64) -> Value {
    json!({
        "receipt_id": receipt_id,
        "finalized_at": 1_764_460_800,
        "observation": {"amount_cents": amount_cents, "currency": "EUR"},
        "group": "rail:ach"
    })
}

/// The request body `/docs` fills in for "Try it out", by operation id.
pub fn request_example(operation_id: &str) -> Option<Value> {
    let accepted = json!({"kind": "accepted", "transcript_id": "tx-9"});
    Some(match operation_id {
        "v1.receipts.create" => receipt_example("r-1", 1250),
        "v1.receipts.batch" => json!({
            "receipts": [receipt_example("r-1", 1250), receipt_example("r-2", 990)]
        }),
        "v1.claims.create" => {
            json!({"worker_id": "worker-a", "lease_ms": 30_000, "limit": 10, "wait_ms": 5000})
        }
        "v1.receipts.claim" => json!({"worker_id": "worker-a", "lease_ms": 30_000}),
        "v1.receipts.outcome" => json!({"claim": claim_example("r-1", 1250), "outcome": accepted}),
        "v1.outcomes.batch" => json!({"outcomes": [
            {"claim": claim_example("r-1", 1250), "outcome": accepted},
            {"claim": claim_example("r-2", 990),
             "outcome": {"kind": "retryable", "code": "rpc", "detail": "timeout talking to rail"}}
        ]}),
        "v1.receipts.lease.extend" => {
            json!({"claim": claim_example("r-1", 1250), "extend_ms": 30_000})
        }
        "v1.leases.extend" => json!({"leases": [
            {"claim": claim_example("r-1", 1250), "extend_ms": 30_000},
            {"claim": claim_example("r-2", 990), "extend_ms": 30_000},
        ]}),
        "v1.receipts.lease.release" => json!({"claim": claim_example("r-1", 1250)}),
        "v1.dead_letters.redrive" | "v1.receipts.unhold" => json!({}),
        "v1.receipts.hold" => json!({"reason": "merchant dispute #81"}),
        "v1.receipts.cancel" => json!({"reason": "duplicate of r-7"}),
        "v1.groups.put" => {
            json!({"paused": false, "max_leased": 50, "rate": {"per_second": 20, "burst": 40}})
        }
        "v1.bulk.act" => json!({"receipt_ids": ["r-1", "r-2"], "dry_run": true, "expect_count": 2}),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::routes::actions::ReasonIn;
    use crate::http::routes::actions::bulk::BulkIn;
    use crate::http::routes::claims::{ClaimOneIn, ClaimsIn};
    use crate::http::routes::outcomes::{
        LeaseExtendBatchIn, LeaseExtendIn, LeaseReleaseIn, OutcomeBatchIn,
    };
    use crate::http::routes::receipts::ReceiptBatchIn;
    use crate::http::wire::{self, OutcomeRequest, ReceiptIn};

    fn parse<T: serde::de::DeserializeOwned>(id: &str) -> T {
        let example = request_example(id).unwrap_or_else(|| panic!("{id} has no example"));
        serde_json::from_value(example).unwrap_or_else(|e| panic!("{id}: {e}"))
    }

    /// What "Try it out" sends must be a request the server accepts.
    #[test]
    fn every_request_example_is_a_valid_request() {
        parse::<ReceiptIn>("v1.receipts.create")
            .parse(None)
            .unwrap();
        for item in parse::<ReceiptBatchIn>("v1.receipts.batch").receipts {
            wire::parse_item::<ReceiptIn>(&item)
                .and_then(|r| r.parse(None))
                .unwrap();
        }
        parse::<ClaimsIn>("v1.claims.create");
        parse::<ClaimOneIn>("v1.receipts.claim");
        parse::<OutcomeRequest>("v1.receipts.outcome")
            .parse(Some("r-1"))
            .unwrap();
        for item in parse::<OutcomeBatchIn>("v1.outcomes.batch").outcomes {
            wire::parse_item::<OutcomeRequest>(&item)
                .and_then(|r| r.parse(None))
                .unwrap();
        }
        let extend = parse::<LeaseExtendIn>("v1.receipts.lease.extend");
        wire::parse_claim(extend.claim, Some("r-1")).unwrap();
        for item in parse::<LeaseExtendBatchIn>("v1.leases.extend").leases {
            let extend = wire::parse_item::<LeaseExtendIn>(&item).unwrap();
            wire::parse_claim(extend.claim, None).unwrap();
        }
        let release = parse::<LeaseReleaseIn>("v1.receipts.lease.release");
        wire::parse_claim(release.claim, Some("r-1")).unwrap();
        parse::<ReasonIn>("v1.receipts.hold");
        parse::<ReasonIn>("v1.receipts.cancel");
        parse::<BulkIn>("v1.bulk.act");
        parse::<crate::http::routes::groups::GroupLimitsIn>("v1.groups.put")
            .parse()
            .unwrap();
    }
}
