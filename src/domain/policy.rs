//! Retry policy: how many retries, and how long to wait before each.

use serde::Serialize;
use thiserror::Error;
use utoipa::ToSchema;

/// Largest accepted `max_retries`.
pub const MAX_RETRIES_LIMIT: u32 = 32;
/// Largest accepted `backoff_multiplier`.
pub const MAX_BACKOFF_MULTIPLIER: u32 = 16;
/// Largest accepted `backoff_cap_ms` (one day).
pub const MAX_BACKOFF_CAP_MS: u64 = 86_400_000;

/// Decides whether a retryable failure is retried and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct RetryPolicy {
    /// Retries allowed before a retryable failure is dead-lettered (0..=32).
    max_retries: u32,
    /// Wait before the first retry, in ms (1..=backoff_cap_ms).
    initial_backoff_ms: u64,
    /// Growth factor per retry (1..=16).
    backoff_multiplier: u32,
    /// Upper bound of any wait, in ms (1..=86400000).
    backoff_cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 5,
            initial_backoff_ms: 250,
            backoff_multiplier: 2,
            backoff_cap_ms: 60_000,
        }
    }
}

/// The rule an invalid policy breaks.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicyError {
    #[error("max_retries must be 0..=32")]
    MaxRetries,
    #[error("backoff_cap_ms must be 1..=86400000")]
    BackoffCap,
    #[error("initial_backoff_ms must be 1..=backoff_cap_ms")]
    InitialBackoff,
    #[error("backoff_multiplier must be 1..=16")]
    BackoffMultiplier,
}

impl RetryPolicy {
    /// A policy, checked: one out of bounds cannot be made, so no store
    /// checks it again.
    pub const fn new(
        max_retries: u32,
        initial_backoff_ms: u64,
        backoff_multiplier: u32,
        backoff_cap_ms: u64,
    ) -> Result<Self, RetryPolicyError> {
        let policy = Self {
            max_retries,
            initial_backoff_ms,
            backoff_multiplier,
            backoff_cap_ms,
        };
        match policy.validate() {
            Ok(()) => Ok(policy),
            Err(e) => Err(e),
        }
    }

    /// Retries after the first invocation.
    #[must_use]
    pub const fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// Wait before the first retry, in ms.
    #[must_use]
    pub const fn initial_backoff_ms(&self) -> u64 {
        self.initial_backoff_ms
    }

    /// Each further wait is this many times longer.
    #[must_use]
    pub const fn backoff_multiplier(&self) -> u32 {
        self.backoff_multiplier
    }

    /// No wait is longer, in ms.
    #[must_use]
    pub const fn backoff_cap_ms(&self) -> u64 {
        self.backoff_cap_ms
    }

    /// Check every bound, in the order max_retries, cap, initial, multiplier
    /// (the cap first because the initial wait is bounded by it).
    const fn validate(&self) -> Result<(), RetryPolicyError> {
        if self.max_retries > MAX_RETRIES_LIMIT {
            return Err(RetryPolicyError::MaxRetries);
        }
        if self.backoff_cap_ms == 0 || self.backoff_cap_ms > MAX_BACKOFF_CAP_MS {
            return Err(RetryPolicyError::BackoffCap);
        }
        if self.initial_backoff_ms == 0 || self.initial_backoff_ms > self.backoff_cap_ms {
            return Err(RetryPolicyError::InitialBackoff);
        }
        if self.backoff_multiplier == 0 || self.backoff_multiplier > MAX_BACKOFF_MULTIPLIER {
            return Err(RetryPolicyError::BackoffMultiplier);
        }
        Ok(())
    }

    /// Wait before the next visibility, given the attempts stored *before*
    /// this failure: `min(initial * multiplier^n, cap)`, saturating.
    #[must_use]
    pub fn backoff_ms(&self, attempts_before: u32) -> u64 {
        let factor = u64::from(self.backoff_multiplier).saturating_pow(attempts_before);
        self.initial_backoff_ms
            .saturating_mul(factor)
            .min(self.backoff_cap_ms)
    }

    /// Wait before a retry when the rail asked for `retry_after_ms`: the
    /// longer of the backoff and the rail's wait (retrying sooner than the
    /// rail allows only earns another refusal), never beyond the cap (the
    /// operator's bound on how long any receipt sits out).
    #[must_use]
    pub fn retry_wait_ms(&self, attempts_before: u32, retry_after_ms: Option<u64>) -> u64 {
        self.backoff_ms(attempts_before)
            .max(retry_after_ms.unwrap_or(0))
            .min(self.backoff_cap_ms)
    }

    /// Whether a retryable failure after `attempts_before` stored attempts may be retried.
    #[must_use]
    pub const fn allows_retry(&self, attempts_before: u32) -> bool {
        attempts_before < self.max_retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = RetryPolicy::default();
        assert_eq!(
            (
                p.max_retries,
                p.initial_backoff_ms,
                p.backoff_multiplier,
                p.backoff_cap_ms
            ),
            (5, 250, 2, 60_000)
        );
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn backoff_grows_then_caps() {
        let p = RetryPolicy::default();
        let waits: Vec<u64> = (0..10).map(|n| p.backoff_ms(n)).collect();
        assert_eq!(
            waits,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]
        );
    }

    #[test]
    fn the_rails_wait_lengthens_the_backoff_up_to_the_cap() {
        let p = RetryPolicy::default();
        // Shorter than the backoff: the backoff stands.
        assert_eq!(p.retry_wait_ms(1, Some(100)), 500);
        // Longer: the rail's wait.
        assert_eq!(p.retry_wait_ms(1, Some(7_000)), 7_000);
        // Beyond the cap: the cap.
        assert_eq!(p.retry_wait_ms(0, Some(3_600_000)), 60_000);
        assert_eq!(p.retry_wait_ms(2, None), p.backoff_ms(2));
    }

    #[test]
    fn backoff_saturates_instead_of_overflowing() {
        let p = RetryPolicy {
            max_retries: 32,
            initial_backoff_ms: MAX_BACKOFF_CAP_MS,
            backoff_multiplier: 16,
            backoff_cap_ms: MAX_BACKOFF_CAP_MS,
        };
        assert_eq!(p.backoff_ms(u32::MAX), MAX_BACKOFF_CAP_MS);
        assert_eq!(p.backoff_ms(32), MAX_BACKOFF_CAP_MS);
        let flat = RetryPolicy {
            backoff_multiplier: 1,
            ..RetryPolicy::default()
        };
        assert_eq!(flat.backoff_ms(u32::MAX), 250);
    }

    #[test]
    fn bounds_are_checked_at_both_edges() {
        let ok = RetryPolicy::default();
        let edges = [
            (
                RetryPolicy {
                    max_retries: 0,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    max_retries: 32,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    max_retries: 33,
                    ..ok
                },
                Err(RetryPolicyError::MaxRetries),
            ),
            (
                RetryPolicy {
                    backoff_cap_ms: 86_400_000,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    backoff_cap_ms: 86_400_001,
                    ..ok
                },
                Err(RetryPolicyError::BackoffCap),
            ),
            (
                RetryPolicy {
                    initial_backoff_ms: 1,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    initial_backoff_ms: 0,
                    ..ok
                },
                Err(RetryPolicyError::InitialBackoff),
            ),
            (
                RetryPolicy {
                    initial_backoff_ms: 60_000,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    initial_backoff_ms: 60_001,
                    ..ok
                },
                Err(RetryPolicyError::InitialBackoff),
            ),
            (
                RetryPolicy {
                    backoff_multiplier: 1,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    backoff_multiplier: 16,
                    ..ok
                },
                Ok(()),
            ),
            (
                RetryPolicy {
                    backoff_multiplier: 0,
                    ..ok
                },
                Err(RetryPolicyError::BackoffMultiplier),
            ),
            (
                RetryPolicy {
                    backoff_multiplier: 17,
                    ..ok
                },
                Err(RetryPolicyError::BackoffMultiplier),
            ),
        ];
        for (policy, expected) in edges {
            assert_eq!(policy.validate(), expected, "{policy:?}");
        }
    }

    #[test]
    fn validation_reports_rules_in_order() {
        let all_bad = RetryPolicy {
            max_retries: 99,
            initial_backoff_ms: 0,
            backoff_multiplier: 0,
            backoff_cap_ms: 0,
        };
        assert_eq!(all_bad.validate(), Err(RetryPolicyError::MaxRetries));
        let p = RetryPolicy {
            max_retries: 1,
            ..all_bad
        };
        assert_eq!(p.validate(), Err(RetryPolicyError::BackoffCap));
        let p = RetryPolicy {
            backoff_cap_ms: 10,
            ..p
        };
        assert_eq!(p.validate(), Err(RetryPolicyError::InitialBackoff));
        let p = RetryPolicy {
            initial_backoff_ms: 10,
            ..p
        };
        assert_eq!(p.validate(), Err(RetryPolicyError::BackoffMultiplier));
    }

    #[test]
    fn default_policy_retries_five_times() {
        let p = RetryPolicy::default();
        assert!((0..5).all(|n| p.allows_retry(n)));
        assert!(!p.allows_retry(5));
        assert!(
            !RetryPolicy {
                max_retries: 0,
                ..p
            }
            .allows_retry(0)
        );
    }
}
