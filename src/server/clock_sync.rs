//! The server's clock, kept to the database's where the database has one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::clock::SteadyClock;
use crate::store::SettlementOutcomeStore;

/// How often the database's clock is sampled again. Monotonic clocks of two
/// hosts drift by parts per million, so a few seconds keep them within a
/// millisecond or so of each other.
const RESYNC_EVERY: Duration = Duration::from_secs(5);

/// A sample whose round trip took longer than this is not taken (after the
/// first): half of it is how far off it may be.
const MAX_ROUND_TRIP: Duration = Duration::from_millis(50);

/// Samples taken before the first request: at least [`FIRST_SAMPLES`], and
/// more, up to [`MOST_FIRST_SAMPLES`], while none came back within
/// [`MAX_ROUND_TRIP`]. A replica starting on a busy host would otherwise keep a
/// first sample off by half a slow round trip until its first resync, and a
/// resync that corrects it moves every lease's end by as much.
const FIRST_SAMPLES: usize = 3;
const MOST_FIRST_SAMPLES: usize = 20;

/// A clock for the server: steady, and on PostgreSQL set from the database's
/// clock before the first request (the best of a few samples) and again every
/// [`RESYNC_EVERY`], until `stop` turns true.
pub async fn start(
    store: Arc<dyn SettlementOutcomeStore>,
    stop: watch::Receiver<bool>,
) -> Arc<SteadyClock> {
    let clock = Arc::new(SteadyClock::from_system());
    let Some(best) = first_sample(|| sample(&*store)).await else {
        return clock;
    };
    if let Some(first) = best {
        let offset = clock.offset_from(first.reference_ms, first.at);
        if offset.abs() > 1_000 {
            tracing::warn!(
                offset_ms = offset,
                "this host's clock disagrees with the database's; leases and due times follow the database's"
            );
        }
        if first.round_trip > MAX_ROUND_TRIP {
            tracing::warn!(
                round_trip_ms = first.round_trip.as_millis(),
                "no quick reading of the database's clock at start-up; leases may end up to half of that early or late until the next resync"
            );
        }
        clock.resync(first.reference_ms, first.at);
    }
    let kept = clock.clone();
    tokio::spawn(async move {
        let mut stop = stop;
        let mut tick = tokio::time::interval(RESYNC_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Reading::Shared(s) = sample(&*store).await
                        && s.round_trip <= MAX_ROUND_TRIP
                    {
                        kept.resync(s.reference_ms, s.at);
                    }
                }
                _ = stop.changed() => return,
            }
        }
    });
    clock
}

/// The best of the first samples, by round trip (see [`FIRST_SAMPLES`]);
/// `None` when the store has no clock of its own to follow.
async fn first_sample<F, R>(mut sample: F) -> Option<Option<Sample>>
where
    F: FnMut() -> R,
    R: Future<Output = Reading>,
{
    let mut best: Option<Sample> = None;
    for taken in 1..=MOST_FIRST_SAMPLES {
        match sample().await {
            Reading::Shared(s) if best.as_ref().is_none_or(|b| s.round_trip < b.round_trip) => {
                best = Some(s);
            }
            Reading::Shared(_) | Reading::Failed => {}
            Reading::NoSharedClock => return None,
        }
        let close_enough = best
            .as_ref()
            .is_some_and(|b| b.round_trip <= MAX_ROUND_TRIP);
        // Every sample failing is not helped by more of them.
        if taken >= FIRST_SAMPLES && (close_enough || best.is_none()) {
            break;
        }
    }
    Some(best)
}

struct Sample {
    reference_ms: u64,
    /// Halfway through the round trip that read it.
    at: Instant,
    round_trip: Duration,
}

enum Reading {
    Shared(Sample),
    NoSharedClock,
    Failed,
}

/// One sample of the database's clock.
async fn sample(store: &dyn SettlementOutcomeStore) -> Reading {
    let sent = Instant::now();
    match store.database_clock_ms().await {
        Ok(Some(reference_ms)) => {
            let round_trip = sent.elapsed();
            Reading::Shared(Sample {
                reference_ms,
                at: sent + round_trip / 2,
                round_trip,
            })
        }
        Ok(None) => Reading::NoSharedClock,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the database's clock; keeping the last sample");
            Reading::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `first_sample` readings with these round trips (ms; `None` a
    /// failed reading), the reference being the round trip, and counts them.
    async fn first_of(round_trips: &[Option<u64>]) -> (Option<u64>, usize) {
        let mut taken = 0;
        let best = first_sample(|| {
            let reading = match round_trips.get(taken).copied().flatten() {
                Some(ms) => Reading::Shared(Sample {
                    reference_ms: ms,
                    at: Instant::now(),
                    round_trip: Duration::from_millis(ms),
                }),
                None => Reading::Failed,
            };
            taken += 1;
            async move { reading }
        })
        .await
        .expect("a shared clock");
        (best.map(|s| s.reference_ms), taken)
    }

    #[tokio::test]
    async fn the_first_sample_is_the_quickest_of_three_when_one_is_quick() {
        assert_eq!(
            first_of(&[Some(2), Some(1), Some(3), Some(0)]).await,
            (Some(1), 3)
        );
        assert_eq!(
            first_of(&[Some(90), Some(40), Some(80)]).await,
            (Some(40), 3)
        );
    }

    #[tokio::test]
    async fn slow_first_samples_are_taken_again_until_one_is_quick() {
        let slow = [
            Some(200),
            Some(120),
            None,
            Some(300),
            Some(70),
            Some(30),
            Some(1),
        ];
        assert_eq!(first_of(&slow).await, (Some(30), 6));
    }

    #[tokio::test]
    async fn at_most_twenty_samples_are_taken_and_the_best_kept() {
        let all_slow: Vec<Option<u64>> = (0..30).map(|n| Some(500 - n)).collect();
        assert_eq!(first_of(&all_slow).await, (Some(481), MOST_FIRST_SAMPLES));
    }

    #[tokio::test]
    async fn failing_readings_end_after_three() {
        assert_eq!(first_of(&[None, None, None, Some(1)]).await, (None, 3));
    }

    #[tokio::test]
    async fn a_store_without_a_clock_is_asked_once() {
        let mut asked = 0;
        let best = first_sample(|| {
            asked += 1;
            async { Reading::NoSharedClock }
        })
        .await;
        assert!(best.is_none());
        assert_eq!(asked, 1);
    }
}
