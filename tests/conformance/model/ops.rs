//! What the model test does: the operations, how they are generated, and
//! the few fixed values they choose from.

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};
use settled::domain::*;
pub const T0: u64 = 1_000_000;
pub const FIN: [u64; 2] = [1_700_000_000, 1_700_000_001];
pub const IDS: [&str; 4] = ["r0", "r1", "r2", "r3"];
/// The priorities an enqueue chooses from (mostly the default).
pub const PRIORITIES: [i64; 4] = [0, 0, 7, -3];
pub const CODES: [SettlementFailureCode; 4] = [
    SettlementFailureCode::Rpc,
    SettlementFailureCode::Backend,
    SettlementFailureCode::Signature,
    SettlementFailureCode::InvalidInput,
];
pub const SAMPLE: usize = 2;

pub fn observation(variant: u8) -> Option<Value> {
    match variant {
        0 => None,
        1 => Some(Value::Null),
        2 => Some(json!({"a": 1, "b": [1, 2]})),
        3 => Some(json!({"b": [1, 2], "a": 1})),
        _ => Some(json!({"a": 2})),
    }
}

pub fn policy(variant: u8) -> RetryPolicy {
    let default = RetryPolicy::default();
    match variant {
        0 => default,
        1 => RetryPolicy::new(1, 100, 3, 500).unwrap(),
        2 => RetryPolicy::new(0, 250, 2, 60_000).unwrap(),
        // The most retries a policy may have (an invalid one cannot be made).
        _ => RetryPolicy::new(32, 1, 2, 86_400_000).unwrap(),
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Tamper {
    None,
    Token,
    Owner,
    RowVersion,
    Attempts,
    FinalizedAt,
    Until,
}

/// The rail's waits a retryable outcome may carry: none, shorter than every
/// backoff, between two backoffs, and beyond the model policy's cap.
pub const RETRY_AFTER: [Option<u64>; 5] = [None, Some(0), Some(50), Some(250), Some(10_000)];

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Accepted(u8),
    Skipped(u8),
    /// Code, detail, and the rail's wait (an index into [`RETRY_AFTER`]).
    Retryable(u8, u8, u8),
    Permanent(u8, u8),
}

impl Kind {
    pub fn input(self) -> Outcome {
        let failure = |c: u8, d: u8| {
            SettlementFailureReason::new(CODES[usize::from(c)], &format!("detail {d}"))
        };
        match self {
            Kind::Accepted(t) => Outcome::Accepted {
                transcript_id: TranscriptId::parse(&format!("tx-{t}")).unwrap(),
            },
            Kind::Skipped(r) => Outcome::Skipped {
                reason: SettlementSkipReason::ALL[usize::from(r)],
            },
            Kind::Retryable(c, d, r) => Outcome::Retryable {
                reason: failure(c, d),
                retry_after_ms: RETRY_AFTER[usize::from(r)],
            },
            Kind::Permanent(c, d) => Outcome::Permanent {
                reason: failure(c, d),
            },
        }
    }
}

#[derive(Debug, Clone)]
pub enum Op {
    Enqueue(Vec<(u8, u8, u8, Option<i64>, u8)>),
    ClaimDue {
        worker: u8,
        lease: u64,
        limit: usize,
    },
    ClaimReceipt {
        id: u8,
        worker: u8,
        lease: u64,
    },
    Record {
        items: Vec<(Pick, Tamper, Kind)>,
        policy: u8,
    },
    Extend {
        claim: Pick,
        tamper: Tamper,
        extend: u64,
    },
    Release {
        claim: Pick,
        tamper: Tamper,
    },
    /// Send an item recorded before again, as a worker retrying its request would.
    /// Sometimes with another outcome or a changed claim.
    Replay {
        which: Index,
        tamper: Tamper,
        other: Option<Kind>,
        policy: u8,
    },
    Redrive {
        id: u8,
    },
    Advance(u64),
    ToDeadline {
        claim: Pick,
        minus: u64,
    },
    ToVisible {
        id: u8,
    },
}

/// Which held claim an operation uses: mostly one that is the receipt's
/// current lease (live or just expired), else one of the newest three,
/// sometimes any (likely stale).
#[derive(Debug, Clone, Copy)]
pub enum Pick {
    Live(Index),
    Recent(Index),
    Any(Index),
}

pub fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        4 => any::<Index>().prop_map(Pick::Live),
        2 => any::<Index>().prop_map(Pick::Recent),
        1 => any::<Index>().prop_map(Pick::Any),
    ]
}

pub fn tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        12 => Just(Tamper::None),
        1 => Just(Tamper::Token),
        1 => Just(Tamper::Owner),
        1 => Just(Tamper::RowVersion),
        1 => Just(Tamper::Attempts),
        1 => Just(Tamper::FinalizedAt),
        1 => Just(Tamper::Until),
    ]
}

pub fn replay_tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        3 => Just(Tamper::None),
        2 => Just(Tamper::Attempts),
        1 => Just(Tamper::Token),
        1 => Just(Tamper::RowVersion),
        1 => Just(Tamper::FinalizedAt),
    ]
}

pub fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        1 => (0..3u8).prop_map(Kind::Accepted),
        1 => (0..3u8).prop_map(Kind::Skipped),
        2 => (0..4u8, 0..2u8, 0..5u8).prop_map(|(c, d, r)| Kind::Retryable(c, d, r)),
        1 => (0..4u8, 0..2u8).prop_map(|(c, d)| Kind::Permanent(c, d)),
    ]
}

pub fn enqueue_item() -> impl Strategy<Value = (u8, u8, u8, Option<i64>, u8)> {
    let fin = prop_oneof![6 => Just(0u8), 1 => Just(1u8)];
    let obs = prop_oneof![4 => Just(0u8), 1 => 1..5u8];
    (
        0..4u8,
        fin,
        obs,
        prop::option::of(-500i64..1500),
        0..PRIORITIES.len() as u8,
    )
}

/// A case: a first enqueue (so that there is work), then random operations.
pub fn case() -> impl Strategy<Value = Vec<Op>> {
    let first = prop::collection::vec(enqueue_item(), 2..6).prop_map(Op::Enqueue);
    (first, prop::collection::vec(op(), 1..40)).prop_map(|(first, mut ops)| {
        ops.insert(0, first);
        ops
    })
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop::collection::vec(enqueue_item(), 1..4).prop_map(Op::Enqueue),
        4 => (0..3u8, 1..5000u64, 1..5usize).prop_map(|(worker, lease, limit)| Op::ClaimDue { worker, lease, limit }),
        2 => (0..4u8, 0..3u8, 1..5000u64).prop_map(|(id, worker, lease)| Op::ClaimReceipt { id, worker, lease }),
        6 => (prop::collection::vec((pick(), tamper(), kind()), 1..3), prop_oneof![12 => 0..3u8, 1 => Just(3u8)])
            .prop_map(|(items, policy)| Op::Record { items, policy }),
        1 => (pick(), tamper(), 1..3000u64).prop_map(|(claim, tamper, extend)| Op::Extend { claim, tamper, extend }),
        1 => (pick(), tamper()).prop_map(|(claim, tamper)| Op::Release { claim, tamper }),
        2 => (any::<Index>(), replay_tamper(), prop::option::weighted(0.3, kind()), 0..3u8)
            .prop_map(|(which, tamper, other, policy)| Op::Replay { which, tamper, other, policy }),
        1 => (0..4u8).prop_map(|id| Op::Redrive { id }),
        2 => (0..2000u64).prop_map(Op::Advance),
        1 => (pick(), 0..2u64).prop_map(|(claim, minus)| Op::ToDeadline { claim, minus }),
        1 => (0..4u8).prop_map(|id| Op::ToVisible { id }),
    ]
}

fn plus_one(value: U63) -> U63 {
    value.checked_add(1).unwrap()
}

pub fn tampered(claim: &Claim, how: Tamper) -> Claim {
    let mut c = claim.clone();
    match how {
        Tamper::None => {}
        Tamper::Token => c.lease_token = LeaseToken::parse(&"0".repeat(32)).unwrap(),
        Tamper::Owner => {
            c.lease_owner = WorkerId::parse(&format!("{}x", c.lease_owner.as_str())).unwrap();
        }
        Tamper::RowVersion => c.row_version = plus_one(c.row_version),
        Tamper::Attempts => c.attempts += 1,
        Tamper::FinalizedAt => c.finalized_at = plus_one(c.finalized_at),
        Tamper::Until => c.lease_until_ms = plus_one(c.lease_until_ms),
    }
    c
}
