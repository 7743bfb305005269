//! A seeded generator for load tests (the one the tools use), and the wall
//! clock in ms.

#[allow(unused_imports, reason = "not every test binary draws random numbers")]
pub use settled_test_support::rng::Rng;

/// Unix milliseconds of the system clock.
pub fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms")
}
