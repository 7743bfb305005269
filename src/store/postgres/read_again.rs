//! Reads that meet a connection the server has just closed.
//!
//! `pg_terminate_backend`, a restart or a pooler closing its server side
//! leave pooled connections that fail on their next statement. Each is
//! pinged before it is lent (`primary.rs`), but a server ends a backend a
//! moment after it is told to, so a connection can pass its ping and fail
//! the statement after it. A read changed nothing, so it is run again on
//! another connection rather than answered 503. Writes are not: their
//! callers are told to send them again (docs/high-availability.md).

use std::future::Future;
use std::io::ErrorKind;

use super::{PostgresStore, is_disconnect};
use crate::domain::{BackendFault, StoreError};
use crate::store::StoreResult;

/// Every connection of the pool can be closed at once (a restart, or every
/// session terminated); a closed one fails at once, so a few more tries
/// cost little.
const ATTEMPTS: u32 = 3;

impl PostgresStore {
    /// Run the read `call` within the store's bound; again, up to
    /// [`ATTEMPTS`] in all, while its connection turns out to be closed.
    pub(super) async fn read<T, F, Fut>(&self, call: F) -> StoreResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let mut attempt = 1;
        loop {
            match self.bounded(call()).await {
                Err(error) if attempt < ATTEMPTS && lost_connection(&error) => attempt += 1,
                answered => return answered,
            }
        }
    }
}

/// Whether `error` says the connection was closed under the call: the
/// server ended it (SQLSTATE 57P01, 57P02, 08…) or the socket was closed.
/// Not a pool or socket timeout (a silent server): waiting a second time
/// would only double the wait.
fn lost_connection(error: &StoreError) -> bool {
    let StoreError::Backend {
        fault: BackendFault::Connection,
        cause: Some(cause),
        ..
    } = error
    else {
        return false;
    };
    match cause.error().downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Io(io)) => matches!(
            io.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
                | ErrorKind::NotConnected
        ),
        Some(sqlx::Error::Database(db)) => db.code().is_some_and(|code| is_disconnect(&code)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_connection_is_read_again() {
        let io = |kind| StoreError::from(sqlx::Error::Io(std::io::Error::from(kind)));
        assert!(lost_connection(&io(ErrorKind::ConnectionReset)));
        assert!(lost_connection(&io(ErrorKind::UnexpectedEof)));
        assert!(!lost_connection(&io(ErrorKind::TimedOut)));
        assert!(!lost_connection(&StoreError::from(
            sqlx::Error::PoolTimedOut
        )));
        assert!(!lost_connection(&StoreError::backend_fault(
            BackendFault::Connection,
            "the store's own bound ran out"
        )));
        assert!(!lost_connection(&StoreError::from(
            sqlx::Error::RowNotFound
        )));
    }
}
