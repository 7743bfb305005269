//! settled: settles payment receipts reliably over HTTP/JSON.

pub mod domain;
pub mod store;
