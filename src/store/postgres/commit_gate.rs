//! A store call's time limit and its commit. A call may be given up by its
//! time limit only before it sends its `COMMIT` (or the one statement that
//! commits by itself): given up then, it is rolled back and answered "did
//! not answer in time", truthfully. Once the `COMMIT` is on its way, the
//! answer is the database's, however long it takes (PostgreSQL's
//! `statement_timeout` bounds it there): a write the database committed is
//! never answered as a failure. Only a `COMMIT` unanswered for
//! [`COMMIT_WAIT`] more (a network that swallows packets) is answered as
//! unknown, so that a lost connection cannot hold a write queue forever.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::domain::{BackendFault, StoreError};
use crate::store::StoreResult;

const OPEN: u8 = 0;
const COMMITTING: u8 = 1;
const ABANDONED: u8 = 2;

/// Whether a call (or a queued write) has passed the point of no return.
#[derive(Debug, Default)]
pub(super) struct Gate(AtomicU8);

impl Gate {
    /// Pass the point of no return; `false` if the call was given up.
    pub fn enter(&self) -> bool {
        match self
            .0
            .compare_exchange(OPEN, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == COMMITTING,
        }
    }

    /// Give the call up; `false` if it already passed the point of no return.
    pub fn abandon(&self) -> bool {
        match self
            .0
            .compare_exchange(OPEN, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == ABANDONED,
        }
    }
}

tokio::task_local! {
    static GATE: Arc<Gate>;
}

/// How long a call whose `COMMIT` was sent waits past its bound for the
/// answer before it gives up (answered as unknown: it may have committed).
pub(super) const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// What a call whose commit went unanswered answers.
fn unconfirmed() -> StoreError {
    StoreError::backend_fault(
        BackendFault::Connection,
        "the database did not confirm the commit in time; it may have been applied",
    )
}

/// What a call given up by its time limit answers.
pub(super) fn too_late() -> StoreError {
    StoreError::backend_fault(
        BackendFault::Connection,
        "the database did not answer in time",
    )
}

/// Call just before sending a `COMMIT`, or a statement that commits by
/// itself: `Err` when the time limit already gave the call up, so that the
/// caller rolls back instead.
pub(super) fn may_commit() -> StoreResult<()> {
    match GATE.try_with(|gate| gate.enter()) {
        Ok(false) => Err(too_late()),
        // Entered, or no time limit around this call.
        _ => Ok(()),
    }
}

/// Run `call` within `bound` (see the module's documentation).
pub(super) async fn within<T>(
    bound: Option<Duration>,
    call: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let Some(bound) = bound else {
        return call.await;
    };
    let gate = Arc::new(Gate::default());
    let call = GATE.scope(gate.clone(), call);
    tokio::pin!(call);
    tokio::select! {
        result = &mut call => result,
        () = tokio::time::sleep(bound) => {
            if gate.abandon() {
                // Dropping the call rolls its transaction back.
                Err(too_late())
            } else {
                tokio::time::timeout(COMMIT_WAIT, call).await.unwrap_or_else(|_| Err(unconfirmed()))
            }
        }
    }
}

/// Run `call` on a task of its own within `bound` (the task's panic is the
/// error `panicked`): the task is aborted only before it commits.
pub(super) async fn spawned_within<T: Send + 'static>(
    bound: Option<Duration>,
    call: impl Future<Output = T> + Send + 'static,
    panicked: impl FnOnce() -> T,
    late: impl FnOnce(StoreError) -> T,
) -> T {
    let gate = Arc::new(Gate::default());
    let mut task = tokio::spawn(GATE.scope(gate.clone(), call));
    let finished = match bound {
        None => (&mut task).await,
        Some(bound) => match tokio::time::timeout(bound, &mut task).await {
            Ok(finished) => finished,
            Err(_) if gate.abandon() => {
                task.abort();
                return late(too_late());
            }
            // Committing: its answer is the database's, if it comes.
            Err(_) => match tokio::time::timeout(COMMIT_WAIT, &mut task).await {
                Ok(finished) => finished,
                Err(_) => {
                    task.abort();
                    return late(unconfirmed());
                }
            },
        },
    };
    finished.unwrap_or_else(|_| panicked())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Option<Duration> = Some(Duration::from_secs(5));

    /// A call still working when its time runs out is given up, and learns
    /// so at its commit.
    #[tokio::test(start_paused = true)]
    async fn a_call_that_has_not_committed_is_given_up() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            let _ = tx.send(may_commit());
            Ok(())
        };
        assert_eq!(within(BOUND, call).await, Err(too_late()));
        // Dropped before its commit: it never sent one.
        assert!(rx.await.is_err());
    }

    /// A call whose commit is on its way when its time runs out is answered
    /// with what the commit answers, not with a time-out.
    #[tokio::test(start_paused = true)]
    async fn a_call_whose_commit_was_sent_gets_its_answer() {
        let call = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            may_commit()?;
            // A slow COMMIT round trip, past the bound.
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(42)
        };
        assert_eq!(within(BOUND, call).await, Ok(42));
        let spawned = spawned_within(
            BOUND,
            async {
                may_commit().expect("in time");
                tokio::time::sleep(Duration::from_secs(10)).await;
                "committed"
            },
            || "panicked",
            |_| "too late",
        )
        .await;
        assert_eq!(spawned, "committed");
    }

    /// A commit that never answers is given up at last, as unknown: a
    /// network that swallows packets cannot hold a write queue forever.
    #[tokio::test(start_paused = true)]
    async fn a_commit_that_never_answers_is_answered_as_unknown() {
        let call = async {
            may_commit()?;
            std::future::pending::<()>().await;
            Ok(())
        };
        let started = tokio::time::Instant::now();
        assert_eq!(within(BOUND, call).await, Err(unconfirmed()));
        assert_eq!(started.elapsed(), BOUND.unwrap() + COMMIT_WAIT);
    }

    /// A gate given up refuses the commit, and one entered refuses to be given up.
    #[test]
    fn the_gate_is_passed_once_one_way() {
        let gate = Gate::default();
        assert!(gate.enter() && gate.enter());
        assert!(!gate.abandon());
        let gate = Gate::default();
        assert!(gate.abandon() && gate.abandon());
        assert!(!gate.enter());
    }
}
