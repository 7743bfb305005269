//! Wakeups from other replicas: a dedicated connection `LISTEN`s on
//! [`CHANNEL`] and turns every notification into `notify_waiters()`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::CHANNEL;
use crate::store::StoreResult;

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(10);

/// Subscribe now (so that `open` fails if it cannot) and keep listening in
/// the background until the returned handle is aborted.
pub(super) async fn start(
    connect: PgConnectOptions,
    acquire_timeout: Duration,
    notify: Arc<Notify>,
) -> StoreResult<AbortHandle> {
    // A pool of its own: the listener holds its connection for good, and
    // must not take one from the store's pool.
    let pool = super::one_kept_connection()
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(connect);
    let listener = subscribe(&pool).await?;
    Ok(tokio::spawn(run(pool, listener, notify)).abort_handle())
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

async fn run(pool: PgPool, mut listener: PgListener, notify: Arc<Notify>) {
    let mut pause = FIRST_PAUSE;
    loop {
        match listener.try_recv().await {
            Ok(Some(_)) => notify.notify_waiters(),
            // The connection dropped and was re-established: whatever was
            // sent meanwhile is lost, so wake every waiter to look again.
            Ok(None) => notify.notify_waiters(),
            Err(error) => {
                tracing::warn!(%error, "work notifications interrupted; resubscribing");
                // Start over on a fresh connection: some errors leave the
                // listener holding a dead one, and it is the pool's only one.
                drop(listener);
                loop {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    match subscribe(&pool).await {
                        Ok(fresh) => {
                            listener = fresh;
                            pause = FIRST_PAUSE;
                            notify.notify_waiters();
                            break;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "cannot resubscribe to work notifications")
                        }
                    }
                }
            }
        }
    }
}
