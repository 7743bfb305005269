//! Optional clean-up of finished work: settled and skipped receipts (and
//! their history) older than the retention period, removed in small batches
//! so that claims and outcomes are never held up for long. Dead letters and
//! active work are never removed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::store::SharedStore;

/// Rows removed per transaction.
pub const BATCH: usize = 500;
/// Pause between two passes over the table.
pub const EVERY: Duration = Duration::from_secs(60);

/// One pass: remove everything finished before `now - retain`, batch by batch.
pub async fn purge_once(store: &SharedStore, clock: &dyn Clock, retain: Duration) -> u64 {
    let cutoff = clock.now() - u64::try_from(retain.as_millis()).unwrap_or(u64::MAX);
    let mut removed = 0;
    loop {
        match store.purge_finished(cutoff, BATCH).await {
            Ok(n) => {
                removed += n;
                if n < BATCH as u64 {
                    return removed;
                }
                // Let waiting writers in between batches.
                tokio::task::yield_now().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "retention pass failed; will try again");
                return removed;
            }
        }
    }
}

/// Run passes every [`EVERY`] until `stop` turns true.
pub async fn run(
    store: SharedStore,
    clock: Arc<dyn Clock>,
    retain: Duration,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        // One replica of a shared database does the passes (src/store/postgres/upkeep.rs).
        let removed = if store.does_upkeep() {
            purge_once(&store, clock.as_ref(), retain).await
        } else {
            0
        };
        if removed > 0 {
            tracing::info!(removed, "retention removed finished receipts");
        }
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
