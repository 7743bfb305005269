//! Forgetting idle groups (docs/groups.md): every period, one pass over the
//! group rows, a page at a time, deletes the rows of groups with no limits
//! and no active receipt (src/store/idle_groups.rs). One replica of a shared
//! database does the passes, the one doing the upkeep.

use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::store::{IDLE_GROUPS_PAGE, SharedStore};

/// Pause between two pages, at least: a page holds the group table's lock
/// for a moment on PostgreSQL, and enqueues wait for it.
const BETWEEN_PAGES: Duration = Duration::from_millis(50);

/// The pause after a page, as a multiple of the time it took: a pass takes
/// at most a tenth of one database connection's time, however costly its
/// pages are (each reads every lease and hold once).
const PAUSE_PER_PAGE_TIME: u32 = 9;

/// Tries of one page: a page gives up its wait for the group table's lock
/// after 100 ms (an autovacuum of the table holds it longer), and is tried
/// again a second later.
const PAGE_TRIES: u32 = 5;

/// One pass over every group row; how many were forgotten. A page that
/// fails [`PAGE_TRIES`] times ends the pass; the next pass starts again
/// from the first group.
pub async fn sweep_once(store: &SharedStore) -> u64 {
    let mut after = String::new();
    let mut forgotten = 0;
    let mut tried = 0;
    loop {
        tried += 1;
        let started = Instant::now();
        match store.forget_idle_groups(&after, IDLE_GROUPS_PAGE).await {
            Ok(page) => {
                forgotten += page.forgotten;
                tried = 0;
                match page.next {
                    Some(next) => after = next,
                    None => return forgotten,
                }
                let pause = started.elapsed() * PAUSE_PER_PAGE_TIME;
                tokio::time::sleep(pause.max(BETWEEN_PAGES)).await;
            }
            Err(e) if tried < PAGE_TRIES => {
                tracing::debug!(error = %e, tried, "a page of the idle-group sweep failed; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "forgetting idle groups failed; the next pass tries again");
                return forgotten;
            }
        }
    }
}

/// A pass every `every` until `stop` turns true; the first after `every`.
pub async fn run(store: SharedStore, every: Duration, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if store.does_upkeep() {
            let forgotten = sweep_once(&store).await;
            if forgotten > 0 {
                tracing::info!(forgotten, "forgot idle groups");
            }
        }
    }
}
