//! HTTP end-to-end tests on a real listener, every endpoint and status code
//! of openapi.yaml, run once per backend.

#[path = "../common/mod.rs"]
mod common;

mod access;
mod actions;
mod browser;
mod claims;
mod claims_with_outcomes;
mod dead_letters;
mod errors;
mod feed;
mod groups;
mod leases;
mod long_polls;
mod metrics;
mod monitoring;
mod operations;
mod outcomes;
mod rail_codes;
mod receipt_search;
mod receipts;
mod stats;
mod stream_caps;
mod traces;

// Attacks on the HTTP surface, the spec and the docs against the code.
mod docs_config;
mod examples;
mod hostile_input;
mod openapi_drift;
