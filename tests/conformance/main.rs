//! One conformance suite for every store backend: each rule of
//! docs/concepts.md ("The rules"), driven with explicit clocks. Every test
//! runs once per backend (PostgreSQL only when `SETTLED_TEST_POSTGRES_URL`
//! is set).

#[path = "../common/mod.rs"]
mod common;

mod support;

mod enqueue;

mod claims;

mod outcomes;

mod carried;

mod cas;

mod leases;

mod views;

mod counts;

mod actions;
mod feed;
mod groups;
mod idle_groups;
mod priorities;
mod search;
mod stats;

// Store tests beyond the rules: PostgreSQL specifics, retention, and random
// sequences of operations against a model of the rules.
mod model;
mod postgres_smoke;
mod retention;
mod upgrade;
