//! A seeded generator for load tests, and the wall clock in ms.

/// A small xorshift generator; the seed is printed so a run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn seeded() -> Self {
        let seed = std::env::var("SETTLED_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).expect("rng");
                u64::from_le_bytes(b) | 1
            });
        eprintln!("seed {seed} (set SETTLED_SEED to repeat)");
        Self(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn fork(&mut self) -> Self {
        Self(self.next() | 1)
    }
}

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
