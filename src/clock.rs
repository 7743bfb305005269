//! The server's clock: the only clock the store ever sees.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub trait Clock: Send + Sync {
    /// Now, in Unix milliseconds.
    fn now_ms(&self) -> u64;

    /// Now, as the store takes it (a reading past `i64::MAX` ms is that bound).
    fn now(&self) -> crate::domain::UnixMs {
        crate::domain::UnixMs::saturating(self.now_ms())
    }
}

/// The system wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to; for tests that cross lease deadlines
/// without sleeping.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `start_ms`.
    #[must_use]
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Move forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Jump to `ms`.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The clock a running server reads: steady between samples of a reference.
///
/// It reads the monotonic clock from an anchor, so a step of the host's wall
/// clock (an NTP step, an operator's `date -s`) after start does not move it:
/// a lease granted for 30 s lasts 30 s. With PostgreSQL the reference is the
/// database's clock, sampled by [`SteadyClock::resync`], so that replicas on
/// hosts whose clocks disagree still agree on when a lease ends (see
/// docs/concepts.md, "Lease"). It never reads backwards: a sample behind the
/// time already read holds the clock until it catches up.
#[derive(Debug)]
pub struct SteadyClock {
    anchor: std::time::Instant,
    /// Unix ms at `anchor`, as the latest reference sample puts it.
    base_ms: AtomicI64,
    /// The latest time read, so that no reading is earlier than one before.
    last_ms: AtomicU64,
}

impl SteadyClock {
    /// A clock starting from the host's wall clock now.
    #[must_use]
    pub fn from_system() -> Self {
        let anchor = std::time::Instant::now();
        let wall = i64::try_from(SystemClock.now_ms()).unwrap_or(i64::MAX);
        Self {
            anchor,
            base_ms: AtomicI64::new(wall),
            last_ms: AtomicU64::new(0),
        }
    }

    /// Take `reference_ms` as the time it was at `at` (a sample of the
    /// reference clock, best taken midway through the round trip that read it).
    pub fn resync(&self, reference_ms: u64, at: std::time::Instant) {
        let since_anchor = self.ms_since_anchor(at);
        let reference = i64::try_from(reference_ms).unwrap_or(i64::MAX);
        self.base_ms
            .store(reference.saturating_sub(since_anchor), Ordering::SeqCst);
    }

    /// How far the reference is from this clock now (positive: reference ahead).
    #[must_use]
    pub fn offset_from(&self, reference_ms: u64, at: std::time::Instant) -> i64 {
        let since_anchor = self.ms_since_anchor(at);
        let ours = self
            .base_ms
            .load(Ordering::SeqCst)
            .saturating_add(since_anchor);
        i64::try_from(reference_ms)
            .unwrap_or(i64::MAX)
            .saturating_sub(ours)
    }
}

impl SteadyClock {
    /// Whole milliseconds from the anchor to `at` (0 before it).
    fn ms_since_anchor(&self, at: std::time::Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.anchor).as_millis()).unwrap_or(i64::MAX)
    }
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> u64 {
        let elapsed = self.ms_since_anchor(std::time::Instant::now());
        let now = self
            .base_ms
            .load(Ordering::SeqCst)
            .saturating_add(elapsed)
            .max(0)
            .cast_unsigned();
        // fetch_max returns the previous value: the reading is the larger.
        self.last_ms.fetch_max(now, Ordering::SeqCst).max(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn steady_clock_follows_the_reference_and_never_reads_backwards() {
        let clock = SteadyClock::from_system();
        let wall = SystemClock.now_ms();
        assert!(clock.now_ms().abs_diff(wall) < 1_000);

        // A reference 10 s ahead moves the clock forward at once.
        clock.resync(wall + 10_000, Instant::now());
        let ahead = clock.now_ms();
        assert!(ahead >= wall + 10_000, "{ahead} < {}", wall + 10_000);

        // A reference behind holds the clock: readings do not go back.
        clock.resync(wall, Instant::now());
        assert!(clock.now_ms() >= ahead);
        assert!(clock.offset_from(wall, Instant::now()).abs() < 1_000);

        // A sample counts for the instant it was taken: time goes on from there.
        let at = Instant::now();
        clock.resync(wall + 20_000, at);
        std::thread::sleep(Duration::from_millis(50));
        assert!(clock.now_ms() >= wall + 20_050);
    }
}
