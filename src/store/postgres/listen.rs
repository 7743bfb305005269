//! Wakeups from other replicas: a dedicated connection `LISTEN`s on
//! [`CHANNEL`] and turns every notification into `notify_waiters()`. When
//! the writer changes it subscribes again there: notifications are sent by
//! the server that commits, and a listener left on a demoted primary would
//! hear nothing, without an error, for good.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;

use super::CHANNEL;
use super::primary::Primary;
use crate::store::StoreResult;

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// Subscribe now (so that `open` fails if it cannot) and keep listening in
/// the background until the returned handle is aborted.
pub(super) async fn start(
    primary: Arc<Primary>,
    acquire_timeout: Duration,
    notify: Arc<Notify>,
) -> StoreResult<AbortHandle> {
    let mut generation = primary.generation();
    generation.mark_unchanged();
    let pool = kept_pool(&primary, acquire_timeout);
    let listener = subscribe(&pool).await?;
    let task = run(primary, acquire_timeout, pool, listener, generation, notify);
    Ok(tokio::spawn(task).abort_handle())
}

/// A pool of its own, on the writer in use: the listener holds its
/// connection for good, and must not take one from the store's pool.
fn kept_pool(primary: &Arc<Primary>, acquire_timeout: Duration) -> PgPool {
    super::one_kept_connection(primary, None)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(primary.options())
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Its own reconnection would go through this pool's options, to the
    // old writer, and retry at once without end: reconnecting is done here.
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

async fn run(
    primary: Arc<Primary>,
    acquire_timeout: Duration,
    mut pool: PgPool,
    mut listener: PgListener,
    mut generation: watch::Receiver<u64>,
    notify: Arc<Notify>,
) {
    let mut pause = FIRST_PAUSE;
    let mut subscribed_at = Instant::now();
    loop {
        let received = tokio::select! {
            received = listener.try_recv() => received,
            changed = generation.changed() => {
                if changed.is_err() {
                    return;
                }
                tracing::info!("the writer changed; subscribing to work notifications there");
                Err(sqlx::Error::PoolClosed)
            }
        };
        let failed = match received {
            Ok(Some(_)) => {
                notify.notify_waiters();
                continue;
            }
            // The connection dropped. sqlx would listen again at the next
            // receive, but a wake-up sent before that is lost, and nothing
            // would say when it listens again: subscribe here, and wake
            // every waiter once listening.
            Ok(None) => true,
            Err(sqlx::Error::PoolClosed) => false,
            Err(error) => {
                tracing::warn!(%error, "work notifications interrupted; resubscribing");
                true
            }
        };
        // Start over on a fresh pool, on the writer in use now: some
        // errors leave the listener holding a dead connection, and a
        // fenced one must not be reused. The old one closes aside (a
        // silent server holds it until the TCP timeout).
        drop(listener);
        if failed {
            // A subscription that lasted starts the back-off afresh; one
            // dropped at once (a proxy that closes it) backs off further.
            if subscribed_at.elapsed() >= LONGEST_PAUSE {
                pause = FIRST_PAUSE;
            }
            pause_unless_moved(&mut generation, &mut pause).await;
        }
        loop {
            // Marked before the options are read: a move after this
            // is seen at the next turn, never lost.
            generation.mark_unchanged();
            let old = std::mem::replace(&mut pool, kept_pool(&primary, acquire_timeout));
            tokio::spawn(async move { old.close().await });
            match subscribe(&pool).await {
                Ok(fresh) => {
                    listener = fresh;
                    subscribed_at = Instant::now();
                    notify.notify_waiters();
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot resubscribe to work notifications");
                }
            }
            pause_unless_moved(&mut generation, &mut pause).await;
        }
    }
}

/// Back off before the next try, but not past a move of the writer.
async fn pause_unless_moved(generation: &mut watch::Receiver<u64>, pause: &mut Duration) {
    tokio::select! {
        () = tokio::time::sleep(*pause) => {}
        _ = generation.changed() => {}
    }
    *pause = (*pause * 2).min(LONGEST_PAUSE);
}
