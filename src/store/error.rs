//! Database errors classified once, for every backend.

use crate::domain::{BackendFault, StoreError};

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            // A CHECK or NOT NULL constraint refused a row: the data would be corrupt.
            sqlx::Error::Database(db)
                if matches!(
                    db.kind(),
                    sqlx::error::ErrorKind::CheckViolation
                        | sqlx::error::ErrorKind::NotNullViolation
                ) =>
            {
                StoreError::invalid_record(format!("constraint refused the row: {error}"))
            }
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                StoreError::invalid_record(format!("stored value does not decode: {error}"))
            }
            sqlx::Error::Database(db)
                if db
                    .code()
                    .is_some_and(|code| super::postgres::is_unwritable(&code)) =>
            {
                StoreError::backend_caused(BackendFault::WriterLost, error)
            }
            // The server answered; whatever it said, it is there.
            sqlx::Error::Database(db)
                if !db
                    .code()
                    .is_some_and(|code| super::postgres::is_disconnect(&code)) =>
            {
                StoreError::backend_caused(BackendFault::Answered, error)
            }
            _ => StoreError::backend_caused(BackendFault::Connection, error),
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        match &error {
            // A CHECK or NOT NULL constraint refused a row: the data would be corrupt.
            rusqlite::Error::SqliteFailure(e, _)
                if matches!(
                    e.extended_code,
                    rusqlite::ffi::SQLITE_CONSTRAINT_CHECK
                        | rusqlite::ffi::SQLITE_CONSTRAINT_NOTNULL
                ) =>
            {
                StoreError::invalid_record(format!("constraint refused the row: {error}"))
            }
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => {
                StoreError::invalid_record(format!("stored value does not decode: {error}"))
            }
            _ => StoreError::backend_caused(BackendFault::Answered, error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// A backend failure keeps the driver's error as its source, for logs and
    /// debugging; its class and detail are what they were.
    #[test]
    fn a_backend_failure_keeps_the_drivers_error_as_its_source() {
        let error = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(matches!(
            error,
            StoreError::Backend {
                fault: BackendFault::Connection,
                ..
            }
        ));
        let source = error.source().expect("a source");
        assert_eq!(source.to_string(), sqlx::Error::PoolTimedOut.to_string());
        let StoreError::Backend {
            cause: Some(cause), ..
        } = &error
        else {
            panic!("{error:?}");
        };
        assert!(cause.error().downcast_ref::<sqlx::Error>().is_some());

        let sqlite = StoreError::from(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        ));
        let StoreError::Backend {
            cause: Some(cause), ..
        } = &sqlite
        else {
            panic!("{sqlite:?}");
        };
        assert!(cause.error().downcast_ref::<rusqlite::Error>().is_some());
        // A failure of settled's own has none.
        assert!(
            StoreError::backend("the write queue has stopped")
                .source()
                .is_none()
        );
    }
}
