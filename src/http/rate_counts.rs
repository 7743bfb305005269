//! This server's counts for the rates over the last hour (docs/operators.md,
//! "Rates over the last hour"; served by `routes::rates`).
//!
//! Nothing is added to the writes of receipts: the handlers that already
//! count committed writes for `/metrics` also add them, in memory, to this
//! server's counts of the current minute ([`Recorder`]). Every
//! [`FLUSH_EVERY`] (and on shutdown, and before answering `GET /v1/stats`)
//! the counts are added to the database's per-minute table, where the
//! replicas of one database sum up. A crash loses at most the counts of the
//! last interval: these are statistics, not the ledger.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use super::AppState;
use crate::domain::{Outcome, Route, UnixMs};
use crate::store::{STATS_KEEP_MS, StatsCounts, StatsMinute, StoreResult, minute_of};

/// How often a server adds its counts to the database.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// Counts not yet in the database, by minute, and what the flushes share.
#[derive(Debug, Default)]
pub struct Recorder {
    pending: Mutex<BTreeMap<u64, StatsCounts>>,
    /// One flush at a time: a read that flushes first then sees everything
    /// this server counted before it, even counts a periodic flush holds.
    flushing: tokio::sync::Mutex<Flushed>,
}

/// What the last flush wrote.
#[derive(Debug, Default)]
struct Flushed {
    /// `(minute_ms, depth)` of the last depth sample written.
    depth: Option<(u64, u64)>,
    /// The last flush failed (logged once until one succeeds again).
    failing: bool,
}

impl Recorder {
    /// Count `delta` in the minute of `now_ms` (a lock held for an addition).
    pub fn add(&self, now_ms: u64, delta: &StatsCounts) {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(minute_of(now_ms))
            .or_default()
            .add(delta);
    }

    fn take(&self) -> BTreeMap<u64, StatsCounts> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Put counts that could not be written back, to go with the next flush.
    fn restore(&self, counts: BTreeMap<u64, StatsCounts>) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        for (minute, delta) in counts {
            pending.entry(minute).or_default().add(&delta);
        }
    }
}

/// What one committed outcome counts as.
#[must_use]
pub fn routed(input: &Outcome, route: &Route) -> StatsCounts {
    let mut delta = StatsCounts::default();
    match (route, input) {
        (Route::NoAction, Outcome::Skipped { .. }) => delta.skipped = 1,
        (Route::NoAction, _) => delta.settled = 1,
        (Route::RetryScheduled { .. }, _) => delta.retried = 1,
        (Route::DeadLettered { .. }, _) => delta.dead_lettered = 1,
    }
    delta
}

/// Add this server's counts to the database, with a sample of the queue
/// depth for the current minute, and delete minutes older than
/// [`STATS_KEEP_MS`]. Counts that could not be written are kept for the
/// next flush. An idle server writes once a minute (its depth sample).
pub async fn flush(app: &AppState) -> StoreResult<()> {
    let mut flushed = app.stats.flushing.lock().await;
    let now = app.now();
    let minute = minute_of(now.get());
    // The depth is a sample: when it cannot be read, the counts still go.
    let depth = app.store.status(now, 0).await.ok().map(|status| {
        let c = status.counts;
        c.pending + c.leased + c.retry_scheduled
    });
    let counts = app.stats.take();
    let new_depth = depth.filter(|d| flushed.depth != Some((minute, *d)));
    if counts.is_empty() && new_depth.is_none() {
        return Ok(());
    }
    let mut minutes: Vec<StatsMinute> = counts
        .iter()
        .map(|(&minute_ms, &counts)| StatsMinute {
            minute_ms,
            counts,
            depth: None,
        })
        .collect();
    if let Some(depth) = new_depth {
        match minutes.iter_mut().find(|m| m.minute_ms == minute) {
            Some(m) => m.depth = Some(depth),
            None => minutes.push(StatsMinute {
                minute_ms: minute,
                counts: StatsCounts::default(),
                depth: Some(depth),
            }),
        }
    }
    match app
        .store
        .add_stats(&minutes, UnixMs::saturating(minute) - STATS_KEEP_MS)
        .await
    {
        Ok(()) => {
            if let Some(depth) = new_depth {
                flushed.depth = Some((minute, depth));
            }
            if std::mem::take(&mut flushed.failing) {
                tracing::info!("stats are written again");
            }
            Ok(())
        }
        Err(e) => {
            app.stats.restore(counts);
            if !std::mem::replace(&mut flushed.failing, true) {
                tracing::warn!(error = %e, "cannot write stats; keeping them for the next try");
            }
            Err(e)
        }
    }
}

/// Flush every `every` until `stop` turns true (the server then flushes
/// once more, after its last request).
pub async fn flush_every(app: AppState, every: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // A failure is logged by `flush` and retried at the next tick.
        let _ = flush(&app).await;
    }
}
