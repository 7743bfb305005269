//! Groups (docs/groups.md): the unit of fairness and of flow control. A
//! claim spreads over the groups with due work, round robin, and takes from
//! each no more than its limits allow. The rules here are pure; the stores
//! read the rows they need and apply them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use utoipa::ToSchema;

/// Largest group name, in UTF-8 bytes.
pub const MAX_GROUP_BYTES: usize = 128;

/// The group of a receipt enqueued without one.
pub const DEFAULT_GROUP: &str = "default";

/// Why a group name was refused.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum GroupError {
    #[error("group must be 1..=128 UTF-8 bytes")]
    Length,
    #[error("group must not contain control characters")]
    ControlCharacter,
    #[error("group must not be `.` or `..` (they cannot be addressed in a URL path)")]
    Dots,
}

/// A group name: 1..=128 UTF-8 bytes, no control characters, not `.`/`..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupName(String);

impl GroupName {
    /// Check the bounds.
    pub fn parse(value: &str) -> Result<Self, GroupError> {
        if value.is_empty() || value.len() > MAX_GROUP_BYTES {
            return Err(GroupError::Length);
        }
        if value.chars().any(char::is_control) {
            return Err(GroupError::ControlCharacter);
        }
        if value == "." || value == ".." {
            return Err(GroupError::Dots);
        }
        Ok(Self(value.to_owned()))
    }

    /// One the store holds: it was parsed before it was written.
    pub(crate) const fn from_stored(value: String) -> Self {
        Self(value)
    }

    /// The group of a receipt enqueued without one.
    #[must_use]
    pub fn default_group() -> Self {
        Self(DEFAULT_GROUP.to_owned())
    }

    /// The name as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A token bucket: `per_second` claims per second on average, at most
/// `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Tokens added per second (a claimed receipt takes one): at least one a
    /// day (1/86400, 0.000011574074074074073), at most 1000000.
    #[schema(minimum = 0.000_011_574_074_074_074_073, maximum = 1_000_000)]
    pub per_second: f64,
    /// The bucket's size: how many may be claimed at once after a quiet
    /// spell, 1..=1000000.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub burst: u64,
}

/// Largest rate and burst an operator may set.
pub const MAX_RATE: f64 = 1_000_000.0;

/// Smallest rate: one claim a day. A slower bucket would tell workers to
/// look again after more than a day, longer than any wait settled answers.
pub const MIN_RATE: f64 = 1.0 / 86_400.0;

/// The longest `look_again_ms` settled answers: a day.
pub const MAX_LOOK_AGAIN_MS: u64 = 86_400_000;

impl Rate {
    /// A rate within bounds, or why not.
    pub fn new(per_second: f64, burst: u64) -> Result<Self, &'static str> {
        // A hair of slack below one a day: JSON's decimal for 1/86400 may
        // read back one unit in the last place below it.
        if !(per_second.is_finite() && (MIN_RATE * 0.999_999_999..=MAX_RATE).contains(&per_second))
        {
            return Err(
                "rate.per_second must be at least one a day (1/86400 = 0.000011574074074074073) \
                 and at most 1000000",
            );
        }
        if burst == 0 || burst as f64 > MAX_RATE {
            return Err("rate.burst must be 1..=1000000");
        }
        Ok(Self { per_second, burst })
    }

    /// The bucket at `now_ms`, from `tokens` at `at_ms` (`None`: never used,
    /// so full). Never more than `burst`; a clock that went back adds nothing.
    #[must_use]
    pub fn tokens_at(self, stored: Option<(f64, i64)>, now_ms: i64) -> f64 {
        let burst = self.burst as f64;
        match stored {
            None => burst,
            Some((tokens, at_ms)) => {
                let elapsed = now_ms.saturating_sub(at_ms).max(0) as f64;
                (tokens + elapsed * self.per_second / 1000.0).min(burst)
            }
        }
    }

    /// Milliseconds until the bucket holds one whole token again.
    #[must_use]
    pub fn ms_until_token(self, tokens: f64) -> u64 {
        if tokens >= 1.0 {
            return 0;
        }
        let ms = ((1.0 - tokens) * 1000.0 / self.per_second).ceil();
        // At least 1 ms: a look sooner would find the same bucket. At most a
        // day, whatever a rate stored before rates were bounded says.
        (ms as u64).clamp(1, MAX_LOOK_AGAIN_MS)
    }
}

/// The limits an operator set on a group; none by default.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, ToSchema)]
pub struct GroupLimits {
    /// Nothing in the group is claimed while paused; due times are kept.
    #[serde(default)]
    pub paused: bool,
    /// At most this many live leases in the group (absent: no cap).
    #[serde(default)]
    pub max_leased: Option<u64>,
    /// Claims per second, as a token bucket (absent: no rate limit).
    #[serde(default)]
    pub rate: Option<Rate>,
}

impl GroupLimits {
    /// Whether a claim must lock the group's row and read its state.
    #[must_use]
    pub fn limited(&self) -> bool {
        self.paused || self.max_leased.is_some() || self.rate.is_some()
    }
}

/// What a group's limits allow a claim now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowance {
    /// How many receipts the claim may take from the group.
    pub take: u64,
    /// When a limit holds work back: after how many ms a look may find more
    /// (`None`: not known, e.g. paused or waiting for a lease to end).
    pub look_again_ms: Option<u64>,
}

/// How many a claim may take from a group with `live_leased` live leases
/// and `tokens` in its bucket (when it has a rate), at most `wanted`.
#[must_use]
pub fn allowance(limits: &GroupLimits, live_leased: u64, tokens: f64, wanted: u64) -> Allowance {
    if limits.paused {
        return Allowance {
            take: 0,
            look_again_ms: None,
        };
    }
    let mut take = wanted;
    if let Some(max) = limits.max_leased {
        take = take.min(max.saturating_sub(live_leased));
    }
    let mut look_again_ms = None;
    if let Some(rate) = limits.rate {
        let whole = tokens.max(0.0).floor() as u64;
        if whole < take {
            take = whole;
            look_again_ms = Some(rate.ms_until_token(tokens - whole as f64));
        }
    }
    Allowance {
        take,
        look_again_ms,
    }
}

/// A due receipt found in a group, in the group's claim order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub receipt_id: String,
    pub next_visible_at_ms: i64,
}

/// How deep to read each group in the next pass of a fair claim of `wanted`
/// receipts, given what earlier passes found (`found[g]`: how many were
/// read, `asked[g]`: how many were asked for, `cap[g]`: the group's
/// allowance). `None` when the candidates read are enough: every group read
/// to its end or its cap, or at least `wanted` in all.
///
/// The groups come in turn order (see `store::fair`). While fewer receipts
/// are missing than groups may still give, one more is asked of as many
/// groups as receipts are missing, those asked least first, in turn order:
/// every group gets its turn before any gets a second, and a claim of 10
/// over 1 000 groups reads 10 of them, not 1 000. Otherwise each group that
/// may give more is asked for an equal share of what is missing. The
/// receipts the claim takes are then the first `wanted` of
/// [`round_robin`]: each group's share is never more than it has due.
#[must_use]
pub fn next_depths(wanted: u64, caps: &[u64], found: &[u64], asked: &[u64]) -> Option<Vec<u64>> {
    let total: u64 = found.iter().sum();
    let mut open: Vec<usize> = (0..caps.len())
        .filter(|&g| found[g] == asked[g] && asked[g] < caps[g].min(wanted))
        .collect();
    if total >= wanted || open.is_empty() {
        return None;
    }
    let missing = wanted - total;
    let mut depths = asked.to_vec();
    // At least as many groups as were read already: a claim that meets
    // empty groups reads twice as many each pass, not one more.
    let visited = asked.iter().filter(|&&a| a > 0).count() as u64;
    let ask = missing.max(visited);
    if (open.len() as u64) > ask {
        // A stable sort: among groups asked as often, turn order decides.
        open.sort_by_key(|&g| asked[g]);
        for &g in open.iter().take(usize::try_from(ask).unwrap_or(usize::MAX)) {
            depths[g] = asked[g] + 1;
        }
        return Some(depths);
    }
    let share = missing.div_ceil(open.len() as u64);
    for g in open {
        depths[g] = (asked[g] + share).min(caps[g]).min(wanted);
    }
    Some(depths)
}

/// The candidates of every group in round-robin order: each group's first
/// due receipt (in the groups' order: turn order), then each group's
/// second, and so on.
#[must_use]
pub fn round_robin<G: Ord + Clone>(groups: BTreeMap<G, Vec<Candidate>>) -> Vec<(G, Candidate)> {
    let mut all: Vec<(usize, G, Candidate)> = groups
        .into_iter()
        .flat_map(|(g, cands)| {
            cands
                .into_iter()
                .enumerate()
                .map(move |(rank, c)| (rank, g.clone(), c))
        })
        .collect();
    all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    all.into_iter().map(|(_, g, c)| (g, c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_are_bounded() {
        assert!(GroupName::parse("rail:ach").is_ok());
        assert!(GroupName::parse(&"g".repeat(128)).is_ok());
        assert_eq!(GroupName::parse(""), Err(GroupError::Length));
        assert_eq!(
            GroupName::parse(&"\u{e9}".repeat(65)),
            Err(GroupError::Length)
        );
        assert_eq!(GroupName::parse("a\nb"), Err(GroupError::ControlCharacter));
        assert_eq!(GroupName::parse(".."), Err(GroupError::Dots));
    }

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let rate = Rate::new(10.0, 5).unwrap();
        assert!((rate.tokens_at(None, 0) - 5.0).abs() < 1e-9);
        assert!((rate.tokens_at(Some((0.0, 1000)), 1100) - 1.0).abs() < 1e-9);
        assert!((rate.tokens_at(Some((0.0, 0)), 60_000) - 5.0).abs() < 1e-9);
        assert!((rate.tokens_at(Some((2.0, 1000)), 500) - 2.0).abs() < 1e-9);
        assert_eq!(rate.ms_until_token(0.5), 50);
        assert_eq!(rate.ms_until_token(1.0), 0);
        assert!(Rate::new(0.0, 1).is_err());
        // One a day is the slowest: a worker is never told to wait longer.
        assert!(Rate::new(0.000_01, 1).is_err());
        let daily = Rate::new(MIN_RATE, 1).unwrap();
        assert_eq!(daily.ms_until_token(0.0), MAX_LOOK_AGAIN_MS);
        assert_eq!(
            Rate {
                per_second: 1e-300,
                burst: 1
            }
            .ms_until_token(0.0),
            MAX_LOOK_AGAIN_MS
        );
        assert!(Rate::new(f64::NAN, 1).is_err());
        assert!(Rate::new(1.0, 0).is_err());
    }

    #[test]
    fn limits_bound_what_a_claim_takes() {
        let none = GroupLimits::default();
        assert_eq!(allowance(&none, 100, 0.0, 7).take, 7);
        let paused = GroupLimits {
            paused: true,
            ..none
        };
        assert_eq!(allowance(&paused, 0, 9.0, 7).take, 0);
        let capped = GroupLimits {
            max_leased: Some(3),
            ..none
        };
        assert_eq!(allowance(&capped, 1, 0.0, 7).take, 2);
        assert_eq!(allowance(&capped, 5, 0.0, 7).take, 0);
        let rated = GroupLimits {
            rate: Some(Rate::new(4.0, 10).unwrap()),
            ..none
        };
        let a = allowance(&rated, 0, 2.5, 7);
        assert_eq!((a.take, a.look_again_ms), (2, Some(125)));
        assert_eq!(allowance(&rated, 0, 9.0, 7).look_again_ms, None);
    }

    /// Reads groups with `due[g]` receipts the way the stores do, and
    /// returns what each group gives a claim of `wanted`.
    fn shares(wanted: u64, due: &[u64], caps: &[u64]) -> Vec<u64> {
        let mut asked = vec![0; due.len()];
        let mut found = vec![0; due.len()];
        while let Some(depths) = next_depths(wanted, caps, &found, &asked) {
            found = depths.iter().zip(due).map(|(d, n)| (*d).min(*n)).collect();
            asked = depths;
        }
        let groups: BTreeMap<usize, Vec<Candidate>> = (0..due.len())
            .map(|g| {
                let cands = (0..found[g])
                    .map(|i| Candidate {
                        receipt_id: format!("{g}-{i:04}"),
                        next_visible_at_ms: i64::try_from(i).unwrap(),
                    })
                    .collect();
                (g, cands)
            })
            .collect();
        let mut taken = vec![0; due.len()];
        for (g, _) in round_robin(groups).into_iter().take(wanted as usize) {
            taken[g] += 1;
        }
        taken
    }

    #[test]
    fn a_claim_shares_out_over_the_groups_with_due_work() {
        assert_eq!(shares(10, &[1000, 10], &[u64::MAX; 2]), vec![5, 5]);
        assert_eq!(shares(10, &[1000, 3], &[u64::MAX; 2]), vec![7, 3]);
        assert_eq!(shares(10, &[0, 1000, 2], &[u64::MAX; 3]), vec![0, 8, 2]);
        assert_eq!(shares(3, &[5; 6], &[u64::MAX; 6]), vec![1, 1, 1, 0, 0, 0]);
        // Empty groups pass their turn to the next ones.
        assert_eq!(
            shares(3, &[0, 5, 0, 5, 5, 5], &[u64::MAX; 6]),
            vec![0, 1, 0, 1, 1, 0]
        );
        // Every group a turn before any a second.
        assert_eq!(shares(5, &[9, 9, 9, 9], &[u64::MAX; 4]), vec![2, 1, 1, 1]);
        assert_eq!(shares(10, &[1000, 1000], &[2, u64::MAX]), vec![2, 8]);
        assert_eq!(shares(10, &[4, 4], &[u64::MAX; 2]), vec![4, 4]);
        assert_eq!(shares(10, &[], &[]), Vec::<u64>::new());
    }
}
