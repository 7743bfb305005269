//! The per-minute series of `GET /v1/stats`: what servers add sums up per
//! minute (two calls stand for two replicas of one database), the depth is
//! the latest sample, and an add deletes minutes older than it keeps.

use settled::domain::UnixMs;
use settled::store::{STATS_MINUTE_MS, StatsCounts, StatsMinute};

use super::support::*;
use crate::common::Fresh;

/// Minute `n` after [`T0`]'s minute.
const fn minute(n: u64) -> u64 {
    T0 - T0 % STATS_MINUTE_MS + n * STATS_MINUTE_MS
}

fn counts(base: u64) -> StatsCounts {
    StatsCounts::from_values(&(base..base + 6).collect::<Vec<_>>())
}

fn row(minute_ms: u64, counts: StatsCounts, depth: Option<u64>) -> StatsMinute {
    StatsMinute {
        minute_ms,
        counts,
        depth,
    }
}

async fn what_two_replicas_add_sums_up_per_minute(fresh: Fresh) {
    let s = store(&fresh);
    assert_eq!(s.stats(ms(0), UnixMs::MAX).await.unwrap(), []);
    // Replica one: minutes 0 and 1, with a depth sample in minute 1.
    s.add_stats(
        &[
            row(minute(0), counts(1), None),
            row(minute(1), counts(10), Some(5)),
        ],
        ms(0),
    )
    .await
    .unwrap();
    // Replica two: minute 1 again, without a sample, and minute 3.
    s.add_stats(
        &[
            row(minute(1), counts(100), None),
            row(minute(3), counts(7), Some(2)),
        ],
        ms(0),
    )
    .await
    .unwrap();
    let mut sum = counts(10);
    sum.add(&counts(100));
    assert_eq!(sum.enqueued, 110);
    assert_eq!(
        s.stats(ms(minute(0)), ms(minute(4))).await.unwrap(),
        [
            row(minute(0), counts(1), None),
            row(minute(1), sum, Some(5)),
            row(minute(3), counts(7), Some(2)),
        ],
        "oldest first, each minute summed, a missing sample keeps the stored one"
    );
    // A later sample replaces the depth; the counters keep adding up.
    s.add_stats(&[row(minute(1), StatsCounts::default(), Some(9))], ms(0))
        .await
        .unwrap();
    assert_eq!(
        s.stats(ms(minute(1)), ms(minute(3))).await.unwrap(),
        [row(minute(1), sum, Some(9))],
        "[from, to): minute 3 is left out"
    );
}

async fn an_add_deletes_the_minutes_before_what_it_keeps(fresh: Fresh) {
    let s = store(&fresh);
    s.add_stats(
        &[
            row(minute(0), counts(1), Some(1)),
            row(minute(1), counts(2), None),
        ],
        ms(0),
    )
    .await
    .unwrap();
    // Two hours later a replica adds its minute and keeps from minute 1 on.
    s.add_stats(&[row(minute(120), counts(3), Some(4))], ms(minute(1)))
        .await
        .unwrap();
    assert_eq!(
        s.stats(ms(0), ms(minute(200))).await.unwrap(),
        [
            row(minute(1), counts(2), None),
            row(minute(120), counts(3), Some(4))
        ]
    );
    // An add with nothing to add still deletes.
    s.add_stats(&[], ms(minute(2))).await.unwrap();
    assert_eq!(
        s.stats(ms(0), ms(minute(200))).await.unwrap(),
        [row(minute(120), counts(3), Some(4))]
    );
}

async fn a_counter_beyond_the_database_range_is_refused_and_changes_nothing(fresh: Fresh) {
    let s = store(&fresh);
    s.add_stats(&[row(minute(0), counts(1), None)], ms(0))
        .await
        .unwrap();
    let huge = StatsCounts {
        settled: u64::MAX,
        ..StatsCounts::default()
    };
    let refused = s
        .add_stats(
            &[row(minute(0), counts(1), None), row(minute(1), huge, None)],
            ms(0),
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        s.stats(ms(0), ms(minute(10))).await.unwrap(),
        [row(minute(0), counts(1), None)],
        "the whole add was undone"
    );
}

crate::on_every_backend!(
    what_two_replicas_add_sums_up_per_minute,
    an_add_deletes_the_minutes_before_what_it_keeps,
    a_counter_beyond_the_database_range_is_refused_and_changes_nothing,
);
