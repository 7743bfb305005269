//! One conformance suite for every store backend: each rule of
//! docs/concepts.md ("The rules"), driven with explicit clocks. Every test
//! runs once per backend (PostgreSQL only when `SETTLED_TEST_POSTGRES_URL`
//! is set).

mod common;

#[path = "conformance/support.rs"]
mod support;

#[path = "conformance/enqueue.rs"]
mod enqueue;

#[path = "conformance/claims.rs"]
mod claims;

#[path = "conformance/outcomes.rs"]
mod outcomes;

#[path = "conformance/cas.rs"]
mod cas;

#[path = "conformance/leases.rs"]
mod leases;

#[path = "conformance/views.rs"]
mod views;

#[path = "conformance/counts.rs"]
mod counts;

#[path = "conformance/actions.rs"]
mod actions;
#[path = "conformance/feed.rs"]
mod feed;
#[path = "conformance/search.rs"]
mod search;
#[path = "conformance/stats.rs"]
mod stats;
