//! The rail the workers settle on: what each receipt's invocations answer,
//! fixed by its index, and the tally of what the workers saw.

use super::*;

/// A small xorshift generator seeded from the OS: enough to spread sleeps.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new() -> Self {
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).expect("rng seed");
        Self(u64::from_le_bytes(seed) | 1)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

pub(super) fn receipt_id(index: usize) -> String {
    format!("r-{index:05}")
}

pub(super) fn index_of(receipt_id: &str) -> usize {
    receipt_id[2..].parse().expect("receipt index")
}

/// What the rail does with a receipt, fixed by its index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Accepted at once.
    Accept,
    /// `rpc` on the first invocation, accepted on the second.
    FlakyThenAccept,
    /// `rpc` every time: dead-lettered after `MAX_RETRIES` retries.
    AlwaysRpc,
    /// A permanent failure: dead-lettered at once.
    Permanent,
}

pub(super) fn kind(index: usize) -> Kind {
    match index % 20 {
        0 => Kind::Permanent,
        3 | 13 => Kind::AlwaysRpc,
        1 | 6 | 11 | 16 => Kind::FlakyThenAccept,
        _ => Kind::Accept,
    }
}

/// Invocations a receipt of this kind takes, and whether it ends settled.
pub(super) const fn expected_end(kind: Kind) -> (u32, bool) {
    match kind {
        Kind::Accept => (1, true),
        Kind::FlakyThenAccept => (2, true),
        Kind::AlwaysRpc => (MAX_RETRIES + 1, false),
        Kind::Permanent => (1, false),
    }
}

/// The outcome a worker reports for `claim`. A failure's detail depends only
/// on the receipt and attempt, so a late identical dead-letter decision is a
/// replay the store answers with the same route (docs/concepts.md: a replayed dead-letter decision).
pub(super) fn outcome_for(claim: &Value) -> Value {
    let id = claim["receipt_id"].as_str().expect("receipt_id");
    let attempts = claim["attempts"].as_u64().expect("attempts");
    let rpc = json!({"kind": "retryable", "code": "rpc",
        "detail": format!("rail timed out on {id} at attempt {attempts}")});
    match kind(index_of(id)) {
        Kind::Permanent => json!({"kind": "permanent", "code": "invalid_receipt_signature",
            "detail": format!("signature of {id} rejected")}),
        Kind::AlwaysRpc => rpc,
        Kind::FlakyThenAccept if attempts == 0 => rpc,
        Kind::Accept | Kind::FlakyThenAccept => json!({"kind": "accepted",
            // Unique per claim: row_version grows with every claim.
            "transcript_id": format!("tx-{id}-v{}-{}", claim["row_version"], claim["lease_owner"].as_str().unwrap_or_default())}),
    }
}

/// What the client side saw for one receipt.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Transcript ids of accepted outcomes answered 200 `no_action`.
    pub(super) accepted: Vec<String>,
    /// 200 `retry_scheduled` answers.
    pub(super) retried: u32,
    /// 200 `dead_lettered` answers for commits made in time.
    pub(super) dead_lettered: u32,
    /// 200 `dead_lettered` answers to late identical dead-letter decisions.
    pub(super) replays: u32,
}

/// Everything one worker (or all of them) saw.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) claim_calls: u64,
    pub(super) empty_claims: u64,
    pub(super) claimed: u64,
    pub(super) commits: u64,
    /// 409 `lease_conflict` answers.
    pub(super) conflicts: u64,
    /// Commits sent after their lease had run out, whatever the replica's
    /// clock error.
    pub(super) late: u64,
    /// Late commits refused with 409 `lease_conflict`.
    pub(super) late_refused: u64,
    /// Late identical dead-letter decisions answered with the same route.
    pub(super) late_replayed: u64,
    /// Commits neither surely in time nor surely late: the deadline fell
    /// while the request was in flight, or within the clock tolerance.
    pub(super) borderline: u64,
    pub(super) violations: Vec<String>,
    pub(super) per_receipt: HashMap<String, Seen>,
}

impl Tally {
    pub(super) fn merge(&mut self, other: Self) {
        self.claim_calls += other.claim_calls;
        self.empty_claims += other.empty_claims;
        self.claimed += other.claimed;
        self.commits += other.commits;
        self.conflicts += other.conflicts;
        self.late += other.late;
        self.late_refused += other.late_refused;
        self.late_replayed += other.late_replayed;
        self.borderline += other.borderline;
        self.violations.extend(other.violations);
        for (id, seen) in other.per_receipt {
            let mine = self.per_receipt.entry(id).or_default();
            mine.accepted.extend(seen.accepted);
            mine.retried += seen.retried;
            mine.dead_lettered += seen.dead_lettered;
            mine.replays += seen.replays;
        }
    }

    /// A claim's deadline is the replica's clock at the claim plus the lease,
    /// and that clock is PostgreSQL's, which is this machine's wall clock: so
    /// it lies between the request's leaving and its answer plus the lease,
    /// give or take a second (the offset at which a replica warns; a step of
    /// the wall clock reaches the replicas only at their next resync).
    pub(super) fn check_deadline(&mut self, claim: &Value, sent_ms: u64, back_ms: u64) {
        const TOLERANCE_MS: u64 = 1_000;
        let until = claim["lease_until_ms"].as_u64().expect("lease_until_ms");
        let earliest = (sent_ms + LEASE_MS).saturating_sub(TOLERANCE_MS);
        let latest = back_ms + LEASE_MS + TOLERANCE_MS;
        if !(earliest..=latest).contains(&until) {
            self.violations.push(format!(
                "{}: lease_until_ms {until} is not within {TOLERANCE_MS} ms of the \
                 claim's time plus {LEASE_MS} ms ({sent_ms}..={back_ms} on this machine)",
                claim["receipt_id"]
            ));
        }
    }

    /// Judge one commit: `answer` is `Ok(route)` or `Err(problem)`.
    pub(super) fn judge(
        &mut self,
        claim: &Value,
        outcome: &Value,
        answer: Result<&Value, (u16, &Value)>,
        timing: Timing,
    ) {
        let id = claim["receipt_id"].as_str().expect("receipt_id").to_owned();
        let attempts = claim["attempts"].as_u64().expect("attempts");
        let (late, in_time) = (timing.late(), timing.in_time());
        self.commits += 1;
        if late {
            self.late += 1;
        } else if !in_time {
            self.borderline += 1;
        }
        let what = outcome["kind"].as_str().unwrap_or_default();
        match answer {
            Ok(route) => {
                let seen = self.per_receipt.entry(id.clone()).or_default();
                match (what, route["kind"].as_str().unwrap_or_default()) {
                    ("accepted", "no_action") if !late => seen.accepted.push(
                        outcome["transcript_id"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    ),
                    ("retryable", "retry_scheduled")
                        if !late && route["attempt"].as_u64() == Some(attempts + 1) =>
                    {
                        seen.retried += 1;
                    }
                    ("retryable" | "permanent", "dead_lettered")
                        if route["attempts"].as_u64() == Some(attempts + 1) =>
                    {
                        if late {
                            self.late_replayed += 1;
                            seen.replays += 1;
                        } else {
                            seen.dead_lettered += 1;
                        }
                    }
                    _ => self.violations.push(format!(
                        "{id}: {what} (attempts {attempts}, late {late}) answered 200 {route}"
                    )),
                }
            }
            Err((409, problem))
                if LEASE_LOST.contains(&problem["code"].as_str().unwrap_or_default()) =>
            {
                self.conflicts += 1;
                if late {
                    self.late_refused += 1;
                }
                if in_time {
                    self.violations.push(format!(
                        "{id}: an in-time {what} commit was refused: {problem}"
                    ));
                }
            }
            Err((status, problem)) => self
                .violations
                .push(format!("{id}: {what} commit answered {status} {problem}")),
        }
    }
}

/// When a claim and the commit of its outcome left and came back, on this
/// machine's monotonic clock. A replica measures a lease on its own steady
/// clock, which runs at this one's rate but for a resync's step, so a commit
/// is judged by the time since its claim rather than by comparing
/// `lease_until_ms` with this machine's wall clock: a replica's constant error
/// cancels out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    claim_sent: Instant,
    claim_back: Instant,
    sent: Instant,
    back: Instant,
}

impl Timing {
    /// The commit's answer has just come back.
    pub(super) fn new(claim_sent: Instant, claim_back: Instant, sent: Instant) -> Self {
        Self {
            claim_sent,
            claim_back,
            sent,
            back: Instant::now(),
        }
    }

    /// Sent when the lease had surely run out: more than the lease (and the
    /// tolerance) after the claim's answer, so after the replica read its clock.
    pub(super) fn late(&self) -> bool {
        self.sent.duration_since(self.claim_back)
            >= Duration::from_millis(LEASE_MS + CLOCK_TOLERANCE_MS)
    }

    /// Answered while the lease surely ran: less than the lease (less the
    /// tolerance) after the claim left, so before the replica's deadline.
    pub(super) fn in_time(&self) -> bool {
        self.back.duration_since(self.claim_sent)
            < Duration::from_millis(LEASE_MS - CLOCK_TOLERANCE_MS)
    }
}
