//! A small seeded generator (xorshift64*): a run is repeatable in what each
//! task chooses, whatever the timing, given its seed.

/// The variable that sets the seed of [`Rng::from_env`].
pub const SEED_ENV: &str = "SETTLED_SEED";

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Seeded from `SETTLED_SEED`, else at random; the seed is printed so
    /// that a failing run can be repeated.
    pub fn from_env() -> Self {
        let seed = std::env::var(SEED_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).expect("the system's random source");
                u64::from_le_bytes(b)
            });
        eprintln!("seed {seed} (set {SEED_ENV} to repeat)");
        Self::new(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform enough in `0..n` (`n` > 0; 0 is read as 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index in `0..n`.
    pub fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    /// 16 hex digits.
    pub fn token(&mut self) -> String {
        format!("{:016x}", self.next_u64())
    }

    /// A generator of its own for another task, drawn from this one.
    pub fn fork(&mut self) -> Self {
        Self::new(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn the_same_seed_repeats_and_another_differs() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..8).map(|_| rng.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut rng = Rng::new(0);
        assert!((0..1000).all(|_| rng.index(3) < 3));
    }
}
