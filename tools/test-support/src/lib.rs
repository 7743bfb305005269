//! What the tests, `settled-bench` and `settled-faults` share: starting a
//! `settled` process and learning where it listens ([`process`]), a fresh
//! PostgreSQL database ([`postgres`]) and a seeded generator ([`rng`]).

pub mod postgres;
pub mod process;
pub mod rng;
