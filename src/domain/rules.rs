//! The routing rules (docs/concepts.md, "The rules"), pure: what an outcome
//! does to its receipt, and why a claim is refused. Every backend applies
//! [`decide`]'s answer with one guarded write that repeats the whole
//! compare-and-swap, and asks [`refusal`] when that write matched no row.

use std::borrow::Cow;

use super::{
    Claim, ConflictKind, FailureClass, Outcome, RetryPolicy, Route, SettlementFailureReason,
    SettlementSkipReason, TranscriptId, U63,
};

/// What an outcome does to its receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Settled: finished.
    Settle { transcript_id: TranscriptId },
    /// Skipped: finished.
    Skip { reason: SettlementSkipReason },
    /// Due again at `next_visible_at_ms`, as invocation `attempt + 1`.
    Retry {
        attempt: u32,
        next_visible_at_ms: U63,
        failure: SettlementFailureReason,
    },
    /// Dead-lettered after `attempts` invocations.
    DeadLetter {
        attempts: u32,
        failure: SettlementFailureReason,
    },
}

impl Decision {
    /// What the worker is told.
    #[must_use]
    pub const fn route(&self) -> Route {
        match *self {
            Self::Settle { .. } | Self::Skip { .. } => Route::NoAction,
            Self::Retry {
                attempt,
                next_visible_at_ms,
                ..
            } => Route::RetryScheduled {
                attempt,
                next_visible_at_ms: next_visible_at_ms.get(),
            },
            Self::DeadLetter { attempts, .. } => Route::DeadLettered { attempts },
        }
    }
}

/// A count or time that would pass what a backend can store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow(pub &'static str);

/// Decide an outcome reported at `observed_at_ms` under `claim`.
///
/// A retryable failure whose code is retryable is retried while the policy
/// allows, after the longer of the backoff and the rail's `retry_after_ms`;
/// every other failure is dead-lettered. The decision is this invocation's:
/// `claim.attempts + 1`.
pub fn decide(
    claim: &Claim,
    outcome: &Outcome,
    policy: &RetryPolicy,
    observed_at_ms: U63,
) -> Result<Decision, Overflow> {
    let invocation = claim.attempts.checked_add(1).ok_or(Overflow("attempts"))?;
    Ok(match outcome {
        Outcome::Accepted { transcript_id } => Decision::Settle {
            transcript_id: transcript_id.clone(),
        },
        Outcome::Skipped { reason } => Decision::Skip { reason: *reason },
        Outcome::Retryable {
            reason,
            retry_after_ms,
        } if reason.code.effective_class(FailureClass::Retryable) == FailureClass::Retryable
            && policy.allows_retry(claim.attempts) =>
        {
            let wait = policy.retry_wait_ms(claim.attempts, *retry_after_ms);
            Decision::Retry {
                attempt: invocation,
                next_visible_at_ms: observed_at_ms
                    .checked_add(wait)
                    .ok_or(Overflow("next_visible_at_ms"))?,
                failure: reason.clone(),
            }
        }
        Outcome::Retryable { reason, .. } | Outcome::Permanent { reason } => Decision::DeadLetter {
            attempts: invocation,
            failure: reason.clone(),
        },
    })
}

/// A receipt as it stands, as far as a refusal needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// No receipt has this id.
    Unknown,
    /// Settled, skipped or canceled (the status's name).
    Finished(&'static str),
    /// Dead-lettered with `failure` after `attempts` invocations, by the
    /// claim of `row_version` (only a claim changes the version).
    DeadLettered {
        failure: SettlementFailureReason,
        finalized_at: U63,
        attempts: u32,
        row_version: U63,
    },
    /// Still to settle; `lease` is the claim that holds it, live or expired.
    Active { lease: Option<Claim> },
}

/// Why a claim is refused: a conflict kind and words for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: ConflictKind,
    pub detail: Cow<'static, str>,
}

impl Refusal {
    const fn new(kind: ConflictKind, detail: &'static str) -> Self {
        Self {
            kind,
            detail: Cow::Borrowed(detail),
        }
    }
}

/// The compare-and-swap, stated once in Rust (each backend's guarded write
/// states it in SQL): a claim holds a receipt while it equals, field for
/// field, the lease the receipt stands under, and that lease is live.
#[must_use]
pub fn holds(standing: &Standing, claim: &Claim, at: U63) -> bool {
    matches!(standing, Standing::Active { lease: Some(lease) }
        if lease == claim && lease.lease_until_ms > at)
}

/// Why `claim`'s write at `at` matched no row. `replay` is the outcome the
/// write carried, if any: the outcome that dead-lettered the receipt, sent
/// again under the same claim, is answered with the route it got (a worker
/// retrying a lost answer), not refused. The same outcome under an earlier
/// claim is refused like any late commit: its lease was lost.
pub fn refusal(
    standing: &Standing,
    claim: &Claim,
    replay: Option<&Outcome>,
    at: U63,
) -> Result<Route, Refusal> {
    match standing {
        Standing::Unknown => Err(Refusal::new(
            ConflictKind::UnknownReceipt,
            "receipt is unknown",
        )),
        Standing::DeadLettered {
            failure,
            finalized_at,
            attempts,
            row_version,
        } => {
            let same = replay.and_then(Outcome::failure) == Some(failure)
                && claim.row_version == *row_version
                && claim.finalized_at == *finalized_at
                && claim.attempts.checked_add(1) == Some(*attempts);
            if same {
                Ok(Route::DeadLettered {
                    attempts: *attempts,
                })
            } else {
                Err(Refusal::new(
                    ConflictKind::Finished,
                    "receipt is already dead-lettered",
                ))
            }
        }
        Standing::Finished(status) => Err(Refusal {
            kind: ConflictKind::Finished,
            detail: Cow::Owned(format!("receipt is already {status}")),
        }),
        Standing::Active { lease: None } => Err(Refusal::new(
            ConflictKind::NotLeased,
            "receipt is not leased",
        )),
        Standing::Active { lease: Some(lease) }
            if lease.lease_token != claim.lease_token || lease.lease_owner != claim.lease_owner =>
        {
            Err(Refusal::new(
                ConflictKind::LeaseMismatch,
                "lease token does not match the current lease",
            ))
        }
        Standing::Active { lease: Some(lease) } if lease.lease_until_ms <= at => Err(Refusal::new(
            ConflictKind::LeaseExpired,
            "lease has expired",
        )),
        Standing::Active { .. } => Err(Refusal::new(
            ConflictKind::LeaseMismatch,
            "claim does not match the persisted row",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{
        LeaseToken, ReceiptId, SettlementFailureCode, SettlementFailureReason, WorkerId,
    };

    fn ms(value: u64) -> U63 {
        U63::try_from(value).unwrap()
    }

    fn claim(attempts: u32) -> Claim {
        Claim {
            receipt_id: ReceiptId::parse("r1").unwrap(),
            finalized_at: ms(41),
            attempts,
            row_version: ms(3),
            lease_owner: WorkerId::parse("w1").unwrap(),
            lease_token: LeaseToken::parse("t1").unwrap(),
            lease_until_ms: ms(1_000),
        }
    }

    fn failure(code: SettlementFailureCode) -> SettlementFailureReason {
        SettlementFailureReason::new(code, "detail")
    }

    fn retryable(code: SettlementFailureCode, after: Option<u64>) -> Outcome {
        Outcome::Retryable {
            reason: failure(code),
            retry_after_ms: after,
        }
    }

    #[test]
    fn accepted_and_skipped_finish_with_no_further_action() {
        let policy = RetryPolicy::default();
        let accepted = Outcome::Accepted {
            transcript_id: TranscriptId::parse("tx").unwrap(),
        };
        let decided = decide(&claim(0), &accepted, &policy, ms(100)).unwrap();
        assert_eq!(decided.route(), Route::NoAction);
        let skipped = Outcome::Skipped {
            reason: SettlementSkipReason::ZeroCharge,
        };
        let decided = decide(&claim(4), &skipped, &policy, ms(100)).unwrap();
        assert_eq!(
            decided,
            Decision::Skip {
                reason: SettlementSkipReason::ZeroCharge
            }
        );
    }

    #[test]
    fn a_retryable_failure_retries_until_the_policy_says_no() {
        let policy = RetryPolicy::default();
        let rpc = retryable(SettlementFailureCode::Rpc, None);
        let first = decide(&claim(0), &rpc, &policy, ms(100)).unwrap();
        assert_eq!(
            first.route(),
            Route::RetryScheduled {
                attempt: 1,
                next_visible_at_ms: 350
            }
        );
        let rail_waits = retryable(SettlementFailureCode::Rpc, Some(5_000));
        let waited = decide(&claim(0), &rail_waits, &policy, ms(100)).unwrap();
        assert_eq!(
            waited.route(),
            Route::RetryScheduled {
                attempt: 1,
                next_visible_at_ms: 5_100
            }
        );
        let last = decide(&claim(5), &rpc, &policy, ms(100)).unwrap();
        assert_eq!(last.route(), Route::DeadLettered { attempts: 6 });
    }

    #[test]
    fn a_permanent_code_dead_letters_even_when_reported_retryable() {
        let policy = RetryPolicy::default();
        let forged = retryable(SettlementFailureCode::Signature, None);
        let decided = decide(&claim(0), &forged, &policy, ms(100)).unwrap();
        assert_eq!(decided.route(), Route::DeadLettered { attempts: 1 });
    }

    #[test]
    fn counts_and_times_that_would_overflow_are_refused() {
        let policy = RetryPolicy::default();
        let rpc = retryable(SettlementFailureCode::Rpc, None);
        assert_eq!(
            decide(&claim(u32::MAX), &rpc, &policy, ms(100)),
            Err(Overflow("attempts"))
        );
        assert_eq!(
            decide(&claim(0), &rpc, &policy, U63::MAX),
            Err(Overflow("next_visible_at_ms"))
        );
    }

    #[test]
    fn a_claim_holds_only_its_own_live_lease() {
        let held = Standing::Active {
            lease: Some(claim(0)),
        };
        assert!(holds(&held, &claim(0), ms(999)));
        assert!(
            !holds(&held, &claim(0), ms(1_000)),
            "the deadline is exclusive"
        );
        assert!(!holds(&held, &claim(1), ms(0)));
        assert!(!holds(&Standing::Active { lease: None }, &claim(0), ms(0)));
    }

    #[test]
    fn refusals_name_the_first_reason_that_applies() {
        let kind = |standing: &Standing, claim: &Claim| {
            refusal(standing, claim, None, ms(500)).map_err(|r| r.kind)
        };
        assert_eq!(
            kind(&Standing::Unknown, &claim(0)),
            Err(ConflictKind::UnknownReceipt)
        );
        assert_eq!(
            kind(&Standing::Finished("settled"), &claim(0)),
            Err(ConflictKind::Finished)
        );
        assert_eq!(
            kind(&Standing::Active { lease: None }, &claim(0)),
            Err(ConflictKind::NotLeased)
        );
        let mut other = claim(0);
        other.lease_token = LeaseToken::parse("t2").unwrap();
        let leased = Standing::Active { lease: Some(other) };
        assert_eq!(kind(&leased, &claim(0)), Err(ConflictKind::LeaseMismatch));
        let mut late = claim(0);
        late.lease_until_ms = ms(500);
        let expired = Standing::Active {
            lease: Some(late.clone()),
        };
        assert_eq!(kind(&expired, &late), Err(ConflictKind::LeaseExpired));
        let mut older = claim(0);
        older.row_version = ms(2);
        assert_eq!(
            kind(
                &Standing::Active {
                    lease: Some(claim(0))
                },
                &older
            ),
            Err(ConflictKind::LeaseMismatch)
        );
    }

    #[test]
    fn the_dead_lettering_outcome_sent_again_gets_its_route_again() {
        let code = SettlementFailureCode::Signature;
        let letter = Standing::DeadLettered {
            failure: failure(code),
            finalized_at: ms(41),
            attempts: 3,
            row_version: ms(3),
        };
        let again = Outcome::Permanent {
            reason: failure(code),
        };
        assert_eq!(
            refusal(&letter, &claim(2), Some(&again), ms(0)),
            Ok(Route::DeadLettered { attempts: 3 })
        );
        let other = Outcome::Permanent {
            reason: SettlementFailureReason::new(code, "another detail"),
        };
        for (replay, attempts) in [(Some(&other), 2), (Some(&again), 1), (None, 2)] {
            assert_eq!(
                refusal(&letter, &claim(attempts), replay, ms(0)).map_err(|r| r.kind),
                Err(ConflictKind::Finished)
            );
        }
        // The same outcome from an earlier claim whose lease lapsed (another
        // worker then claimed and dead-lettered it) is a late commit.
        let mut earlier = claim(2);
        earlier.row_version = ms(2);
        assert_eq!(
            refusal(&letter, &earlier, Some(&again), ms(0)).map_err(|r| r.kind),
            Err(ConflictKind::Finished)
        );
    }
}
