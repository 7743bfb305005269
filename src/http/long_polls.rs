//! What waiting long polls may cost. Each waiting poll looks for work again
//! when woken (work enqueued, released or redriven) and on a fallback timer
//! (work coming due by the clock). With thousands waiting, each looking on
//! every wake-up and every 250 ms swamped the database and pushed answers
//! seconds past `wait_ms`. So:
//!
//! - repeat looks run at most [`CONCURRENT_LOOKS`] at a time, and a poll whose
//!   deadline passes while it waits for its turn answers at once (empty);
//! - a poll skips its look when another poll's look, begun after this one
//!   was woken, found nothing: that look already saw everything the wake-up
//!   announced;
//! - the fallback timer stretches with the number of waiting polls, so that
//!   all of them together look about [`FALLBACK_LOOKS`] times per
//!   [`FALLBACK_POLL`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How often a single waiting poll looks again without a wake-up.
pub const FALLBACK_POLL: Duration = Duration::from_millis(250);
/// Fallback looks per [`FALLBACK_POLL`] across all waiting polls.
const FALLBACK_LOOKS: usize = 32;
/// Repeat looks running at once.
const CONCURRENT_LOOKS: usize = 8;

/// Shared by every long poll of one server.
#[derive(Debug)]
pub struct Waits {
    started: Instant,
    looks: Semaphore,
    waiting: AtomicUsize,
    /// Start of the latest look that found nothing, in µs after `started` (+1; 0: none).
    last_empty_look: AtomicU64,
}

impl Default for Waits {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            looks: Semaphore::new(CONCURRENT_LOOKS),
            waiting: AtomicUsize::new(0),
            last_empty_look: AtomicU64::new(0),
        }
    }
}

/// Counts a poll as waiting while held.
#[derive(Debug)]
pub struct Waiting(Arc<Waits>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Waits {
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.started).as_micros()).unwrap_or(u64::MAX)
    }

    /// Count a poll as waiting until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiting(self.clone())
    }

    /// How long a waiting poll sleeps before looking without a wake-up.
    pub fn fallback_interval(&self) -> Duration {
        let waiting = self.waiting.load(Ordering::Relaxed).max(1);
        let rounds = u32::try_from(waiting.div_ceil(FALLBACK_LOOKS)).unwrap_or(u32::MAX);
        FALLBACK_POLL.saturating_mul(rounds)
    }

    /// A turn to look again, or `None` once `deadline` has passed.
    pub async fn turn(&self, deadline: Instant) -> Option<SemaphorePermit<'_>> {
        tokio::time::timeout_at(deadline, self.looks.acquire())
            .await
            .ok()?
            .ok()
    }

    /// Whether a look that began at or after `woken` found nothing.
    pub fn looked_empty_since(&self, woken: Instant) -> bool {
        let last = self.last_empty_look.load(Ordering::Acquire);
        last > self.micros(woken)
    }

    /// A look that began at `started` found nothing.
    pub fn found_nothing(&self, started: Instant) {
        self.last_empty_look
            .fetch_max(self.micros(started) + 1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_stretches_with_the_number_waiting() {
        let waits = Arc::new(Waits::default());
        assert_eq!(waits.fallback_interval(), FALLBACK_POLL);
        let guards: Vec<_> = (0..FALLBACK_LOOKS * 4).map(|_| waits.enter()).collect();
        assert_eq!(waits.fallback_interval(), FALLBACK_POLL * 4);
        drop(guards);
        assert_eq!(waits.fallback_interval(), FALLBACK_POLL);
    }

    #[tokio::test]
    async fn an_empty_look_after_a_wake_up_answers_for_it() {
        let waits = Waits::default();
        let woken = Instant::now();
        assert!(!waits.looked_empty_since(woken));
        tokio::time::sleep(Duration::from_millis(2)).await;
        waits.found_nothing(Instant::now());
        assert!(waits.looked_empty_since(woken));
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(!waits.looked_empty_since(Instant::now()));
    }
}
