//! Forgetting idle groups (docs/groups.md): every period, one pass over the
//! group rows, a page at a time, deletes the rows of groups with no limits
//! and no active receipt (src/store/idle_groups.rs). One replica of a shared
//! database does the passes, the one doing the upkeep.

use std::time::Duration;

use tokio::sync::watch;

use crate::store::{IDLE_GROUPS_PAGE, SharedStore};

/// Pause between two pages: a page holds the group table's lock for a
/// moment on PostgreSQL, and enqueues wait for it.
const BETWEEN_PAGES: Duration = Duration::from_millis(50);

/// One pass over every group row; how many were forgotten. A page that
/// fails ends the pass: the next one starts again from the first group.
pub async fn sweep_once(store: &SharedStore) -> u64 {
    let mut after = String::new();
    let mut forgotten = 0;
    loop {
        match store.forget_idle_groups(&after, IDLE_GROUPS_PAGE).await {
            Ok(page) => {
                forgotten += page.forgotten;
                match page.next {
                    Some(next) => after = next,
                    None => return forgotten,
                }
                tokio::time::sleep(BETWEEN_PAGES).await;
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
