//! What the SQLite store's unit tests share: a store in a temporary
//! directory, and a receipt due at once.

use super::SqliteStore;
use crate::domain::{GroupName, Priority, ReceiptId};
use crate::store::NewReceipt;

/// A fresh store in its own temporary directory (kept alive by the first).
pub async fn open() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite:{}", dir.path().join("settled.db").display());
    let store = SqliteStore::open(&url).await.expect("open");
    (dir, store)
}

/// A receipt due at once, in the default group, without an observation.
pub fn receipt(id: &str) -> NewReceipt {
    NewReceipt {
        priority: Priority::default(),
        trace: None,
        receipt_id: ReceiptId::parse(id).expect("id"),
        finalized_at: 1,
        observation: None,
        visible_at_ms: None,
        group: GroupName::default_group(),
    }
}
