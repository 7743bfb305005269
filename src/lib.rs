//! settled: settles payment receipts reliably over HTTP/JSON.

pub mod clock;
pub mod config;
pub mod domain;
pub mod group_sweep;
pub mod healthcheck;
pub mod http;
pub mod retention;
pub mod server;
pub mod store;
pub mod telemetry;
