//! What both runs (HTTP and in-process) share: receipt ids, the outcome mix,
//! the client-side ledger of routes, latency figures, the rate pacer and the
//! progress line.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use settled::domain::{Route, SettlementFailureCode, SettlementSkipReason};
use settled::http::wire::OutcomeIn;
use settled_test_support::rng::Rng;

/// Errors of the bench itself.
pub type BenchError = Box<dyn std::error::Error + Send + Sync>;
/// Shorthand.
pub type Res<T> = Result<T, BenchError>;

/// Make an error from a message.
pub fn err(message: impl Into<String>) -> BenchError {
    message.into().into()
}

/// `finalized_at` of receipt 0 (any plausible Unix second).
const FINALIZED_BASE: u64 = 1_764_460_800;

/// Eight random hex characters, so that ids of two runs never collide.
pub fn run_id() -> String {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).unwrap_or_default();
    hex::encode(bytes)
}

/// Receipt ids of one run: `{prefix}-{index}`.
#[derive(Debug, Clone)]
pub struct Ids {
    pub prefix: String,
    /// Spread the receipts over this many groups (0: none named).
    pub groups: usize,
}

impl Ids {
    /// The group of receipt `index`, when the run names groups.
    pub fn group(&self, index: usize) -> Option<String> {
        (self.groups > 0).then(|| format!("g{:04}", index % self.groups))
    }

    pub fn id(&self, index: usize) -> String {
        format!("{}-{index}", self.prefix)
    }

    /// The index of an id of this run.
    pub fn index(&self, id: &str) -> Option<usize> {
        id.strip_prefix(self.prefix.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()
    }

    pub fn finalized_at(index: usize) -> u64 {
        FINALIZED_BASE + index as u64
    }
}

/// What a worker reports, before it becomes a wire or store value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Accepted,
    Retryable,
    Permanent,
    Skipped,
}

/// Outcome weights, e.g. `accepted=90,retryable=8,permanent=2`.
#[derive(Debug, Clone)]
pub struct Mix {
    weights: Vec<(Kind, u64)>,
    total: u64,
    pub text: String,
}

impl std::str::FromStr for Mix {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let mut weights = Vec::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}`: expected KIND=WEIGHT"))?;
            let kind = match name.trim() {
                "accepted" => Kind::Accepted,
                "retryable" => Kind::Retryable,
                "permanent" => Kind::Permanent,
                "skipped" => Kind::Skipped,
                other => return Err(format!("unknown outcome kind `{other}`")),
            };
            let weight: u64 = weight
                .trim()
                .parse()
                .map_err(|_| format!("`{part}`: the weight must be a whole number"))?;
            weights.push((kind, weight));
        }
        let total = weights.iter().map(|(_, w)| w).sum();
        if total == 0 {
            return Err("the weights add up to 0".into());
        }
        if weights
            .iter()
            .all(|(k, w)| *k == Kind::Retryable || *w == 0)
        {
            return Err("only retryable outcomes: nothing would ever finish".into());
        }
        Ok(Self {
            weights,
            total,
            text: text.to_owned(),
        })
    }
}

impl Mix {
    /// The outcome of attempt `attempts` of receipt `index`: the same in both runs.
    pub fn decide(&self, index: usize, attempts: u32) -> Kind {
        // A generator seeded by the pair, so that the same pair always rolls the same.
        let roll = Rng::new((index as u64) << 8 ^ u64::from(attempts)).below(self.total);
        let mut acc = 0;
        for (kind, weight) in &self.weights {
            acc += weight;
            if roll < acc {
                return *kind;
            }
        }
        Kind::Accepted
    }

    /// The wire outcome for receipt `index` at `attempts`.
    pub fn outcome(&self, index: usize, attempts: u32) -> (Kind, OutcomeIn) {
        let kind = self.decide(index, attempts);
        let outcome = match kind {
            Kind::Accepted => OutcomeIn::Accepted {
                transcript_id: format!("tx-{index}"),
            },
            Kind::Retryable => OutcomeIn::Retryable {
                code: SettlementFailureCode::Rpc,
                detail: "bench: rail timeout".into(),
                rail_code: None,
                retry_after_ms: None,
            },
            Kind::Permanent => OutcomeIn::Permanent {
                code: SettlementFailureCode::InvalidReceiptSignature,
                detail: "bench: bad signature".into(),
                rail_code: None,
            },
            Kind::Skipped => OutcomeIn::Skipped {
                reason: SettlementSkipReason::ZeroCharge,
            },
        };
        (kind, outcome)
    }
}

/// The client-side ledger: every route the store answered, per receipt.
pub struct Ledger {
    accepted: Vec<AtomicU8>,
    terminal: Vec<AtomicU8>,
    pub done: AtomicUsize,
    pub settled: AtomicU64,
    pub skipped: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub retries: AtomicU64,
    pub conflicts: AtomicU64,
    pub errors: AtomicU64,
    pub foreign: AtomicU64,
    pub empty_claims: AtomicU64,
}

impl Ledger {
    pub fn new(n: usize) -> Self {
        Self {
            accepted: (0..n).map(|_| AtomicU8::new(0)).collect(),
            terminal: (0..n).map(|_| AtomicU8::new(0)).collect(),
            done: AtomicUsize::new(0),
            settled: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            conflicts: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            foreign: AtomicU64::new(0),
            empty_claims: AtomicU64::new(0),
        }
    }

    pub fn n(&self) -> usize {
        self.terminal.len()
    }

    pub fn all_done(&self) -> bool {
        self.done.load(Ordering::Relaxed) >= self.n()
    }

    /// Note the route the store gave to `kind` for receipt `index`.
    pub fn route(&self, index: usize, kind: Kind, route: &Route) {
        match route {
            Route::RetryScheduled { .. } => {
                self.retries.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Route::NoAction if kind == Kind::Accepted => {
                self.accepted[index].fetch_add(1, Ordering::Relaxed);
                self.settled.fetch_add(1, Ordering::Relaxed);
            }
            Route::NoAction => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
            }
            Route::DeadLettered { .. } => {
                self.dead_lettered.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.terminal[index].fetch_add(1, Ordering::Relaxed) == 0 {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether receipt `index` was accepted (once).
    pub fn was_accepted(&self, index: usize) -> bool {
        self.accepted[index].load(Ordering::Relaxed) > 0
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Client-side invariants: one terminal route per receipt, at most one acceptance.
    pub fn check(&self, failures: &mut Vec<String>, label: &str) {
        let not_terminal = self
            .terminal
            .iter()
            .filter(|t| t.load(Ordering::Relaxed) == 0)
            .count();
        let twice = self
            .terminal
            .iter()
            .filter(|t| t.load(Ordering::Relaxed) > 1)
            .count();
        let accepted_twice = self
            .accepted
            .iter()
            .filter(|a| a.load(Ordering::Relaxed) > 1)
            .count();
        if not_terminal > 0 {
            failures.push(format!(
                "{label}: {not_terminal} receipts never got a terminal route"
            ));
        }
        if twice > 0 {
            failures.push(format!("{label}: {twice} receipts got two terminal routes"));
        }
        if accepted_twice > 0 {
            failures.push(format!("{label}: {accepted_twice} receipts accepted twice"));
        }
    }
}

/// Request latencies, in microseconds.
#[derive(Debug, Default, Clone)]
pub struct Latencies(pub Vec<u32>);

impl Latencies {
    pub fn push(&mut self, elapsed: Duration) {
        self.0
            .push(u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX));
    }

    pub fn merge(&mut self, other: Self) {
        self.0.extend(other.0);
    }

    /// Sorted, to read percentiles.
    pub fn finish(mut self) -> Self {
        self.0.sort_unstable();
        self
    }

    /// The `q` quantile in ms (of sorted values); 0 when empty.
    pub fn ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        f64::from(self.0[rank - 1]) / 1000.0
    }
}

/// Spaces out claims so that at most `rate` receipts a second are claimed.
pub struct Pacer {
    per_receipt: Duration,
    next: tokio::sync::Mutex<Instant>,
}

impl Pacer {
    pub fn new(rate: f64) -> Self {
        Self {
            per_receipt: Duration::from_secs_f64(1.0 / rate),
            next: tokio::sync::Mutex::new(Instant::now()),
        }
    }

    /// Wait for the slot of `n` receipts.
    pub async fn take(&self, n: usize) {
        let slot = {
            let mut next = self.next.lock().await;
            let slot = (*next).max(Instant::now());
            *next = slot + self.per_receipt * u32::try_from(n).unwrap_or(u32::MAX);
            slot
        };
        tokio::time::sleep_until(slot.into()).await;
    }
}

/// Print `label: count/total` with the rate to stderr every second until aborted.
pub fn progress(
    label: String,
    total: usize,
    count: Arc<dyn Fn() -> (usize, String) + Send + Sync>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut last = (0usize, started);
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let (done, extra) = count();
            let now = Instant::now();
            let rate = (done - last.0.min(done)) as f64 / (now - last.1).as_secs_f64();
            let avg = done as f64 / (now - started).as_secs_f64();
            eprintln!("  {label}: {done}/{total}  {rate:.0}/s now, {avg:.0}/s average{extra}");
            last = (done, now);
        }
    })
}

/// Now, Unix ms.
pub fn now_ms() -> u64 {
    use settled::clock::Clock;
    settled::clock::SystemClock.now_ms()
}

/// `visible_at_ms` of preloaded receipts: ten years from now, never due in a run.
pub fn far_future_ms() -> u64 {
    now_ms() + 10 * 365 * 24 * 3_600_000
}
