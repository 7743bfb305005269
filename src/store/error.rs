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
                StoreError::backend_fault(BackendFault::WriterLost, error.to_string())
            }
            // The server answered; whatever it said, it is there.
            sqlx::Error::Database(db)
                if !db
                    .code()
                    .is_some_and(|code| super::postgres::is_disconnect(&code)) =>
            {
                StoreError::backend(error.to_string())
            }
            _ => StoreError::backend_fault(BackendFault::Connection, error.to_string()),
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
            _ => StoreError::backend(error.to_string()),
        }
    }
}
