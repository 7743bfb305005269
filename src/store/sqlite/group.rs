//! Group commit: one task owns the writer connection and runs every write
//! job that is waiting, each in its own savepoint, inside one transaction
//! with one durable commit. A job's answer is sent only after that commit,
//! so nothing is acknowledged that a crash could lose; a job that fails is
//! rolled back to its savepoint and does not disturb the others.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use crate::domain::SettlementRouteError;
use crate::store::StoreResult;

/// Most jobs merged into one commit.
const MAX_GROUP: usize = 256;

type Value = Box<dyn Any + Send>;
type Run = Box<
    dyn for<'c> FnOnce(
            &'c mut SqliteConnection,
        ) -> Pin<Box<dyn Future<Output = StoreResult<Value>> + Send + 'c>>
        + Send,
>;

/// One write and where its answer goes.
pub struct Job {
    run: Run,
    reply: oneshot::Sender<StoreResult<Value>>,
}

/// A handle that submits jobs to the writer task.
#[derive(Clone)]
pub struct Writer(mpsc::Sender<Job>);

fn stopped() -> SettlementRouteError {
    SettlementRouteError::backend("the SQLite writer has stopped")
}

impl Writer {
    /// Start the writer task on `conn`; `options` reopen it after a failure.
    pub fn start(conn: SqliteConnection, options: SqliteConnectOptions) -> Self {
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(run(conn, options, rx));
        Self(tx)
    }

    /// Run `op` in the next group commit and return its value once committed.
    pub async fn write<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(
                &'c mut SqliteConnection,
            ) -> Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 'c>>
            + Send
            + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let run: Run = Box::new(move |conn| {
            Box::pin(async move { op(conn).await.map(|v| Box::new(v) as Value) })
        });
        self.0
            .send(Job { run, reply })
            .await
            .map_err(|_| stopped())?;
        let value = answer.await.map_err(|_| stopped())??;
        value
            .downcast::<T>()
            .map(|v| *v)
            .map_err(|_| SettlementRouteError::backend("writer answered with the wrong type"))
    }
}

async fn run(conn: SqliteConnection, options: SqliteConnectOptions, mut jobs: mpsc::Receiver<Job>) {
    let mut conn = Some(conn);
    let mut group = Vec::with_capacity(MAX_GROUP);
    while let Some(first) = jobs.recv().await {
        group.push(first);
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        if conn.is_none() {
            match options.connect().await {
                Ok(fresh) => conn = Some(fresh),
                Err(e) => {
                    let e = SettlementRouteError::from(e);
                    for job in group.drain(..) {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                    continue;
                }
            }
        }
        if let Some(open) = conn.as_mut()
            && !commit_group(open, &mut group).await
        {
            // After an error SQLite may have rolled back on its own (a
            // full disk, an I/O error) while the driver still counts an
            // open transaction; a fresh connection starts clean.
            tracing::warn!("reopening the SQLite writer connection after a failed commit");
            if let Some(broken) = conn.take() {
                let _ = broken.close().await;
            }
        }
    }
}

/// Run and commit one group; `false` when the connection should be reopened.
async fn commit_group(conn: &mut SqliteConnection, group: &mut Vec<Job>) -> bool {
    let mut tx = match conn.begin_with("BEGIN IMMEDIATE").await {
        Ok(tx) => tx,
        Err(e) => {
            let e = SettlementRouteError::from(e);
            for job in group.drain(..) {
                let _ = job.reply.send(Err(e.clone()));
            }
            return false;
        }
    };
    let mut done = Vec::with_capacity(group.len());
    for job in group.drain(..) {
        let result = match tx.begin().await {
            Ok(mut savepoint) => match (job.run)(&mut savepoint).await {
                Ok(value) => savepoint.commit().await.map(|()| value).map_err(Into::into),
                Err(e) => {
                    let _ = savepoint.rollback().await;
                    Err(e)
                }
            },
            Err(e) => Err(e.into()),
        };
        done.push((job.reply, result));
    }
    let committed = tx.commit().await.map_err(SettlementRouteError::from);
    let healthy = committed.is_ok();
    for (reply, result) in done {
        let answer = match &committed {
            Ok(()) => result,
            Err(e) => Err(e.clone()),
        };
        let _ = reply.send(answer);
    }
    healthy
}
