//! HTTP end-to-end tests on a real listener, every endpoint and status code
//! of openapi.yaml, run once per backend.

mod common;

#[path = "http_api/access.rs"]
mod access;
#[path = "http_api/actions.rs"]
mod actions;
#[path = "http_api/browser.rs"]
mod browser;
#[path = "http_api/claims.rs"]
mod claims;
#[path = "http_api/dead_letters.rs"]
mod dead_letters;
#[path = "http_api/errors.rs"]
mod errors;
#[path = "http_api/feed.rs"]
mod feed;
#[path = "http_api/long_polls.rs"]
mod long_polls;
#[path = "http_api/metrics.rs"]
mod metrics;
#[path = "http_api/operations.rs"]
mod operations;
#[path = "http_api/outcomes.rs"]
mod outcomes;
#[path = "http_api/receipt_search.rs"]
mod receipt_search;
#[path = "http_api/receipts.rs"]
mod receipts;
#[path = "http_api/stats.rs"]
mod stats;
