//! A fair claim (docs/groups.md), as both backends run it: read the groups
//! and their limits, work out what each may give, read the groups' due
//! receipts in passes (`domain::next_depths`) and take the first of them in
//! round-robin order (`domain::round_robin`). The backends supply the reads
//! and the leasing; the steps and their order are here.

use std::collections::{BTreeMap, HashMap};

use super::StoreResult;
use crate::domain::{
    Candidate, GroupLimits, Rate, StoreError, allowance, next_depths, round_robin,
};

/// A `receipt_groups` row as a claim reads it.
#[derive(Debug, Clone)]
pub struct GroupRow {
    pub name: String,
    pub limits: GroupLimits,
    /// The rate's bucket as of its last claim: `(tokens, at_ms)`.
    pub bucket: Option<(f64, i64)>,
}

/// What a batch claim got.
#[derive(Debug, Clone, PartialEq)]
pub struct DueClaims<C> {
    pub claims: Vec<C>,
    /// A group's limit held due work back: a look after this many ms may find
    /// more (`None`: no limit held work back, or when is not known).
    pub look_again_ms: Option<u64>,
    /// Whether a limit (pause, cap or rate) may have held due work back.
    pub held_back: bool,
}

/// Limits as stored; a value out of range is a corrupt record.
pub fn limits(
    paused: bool,
    max_leased: Option<i64>,
    rate: Option<f64>,
    burst: Option<i64>,
) -> StoreResult<GroupLimits> {
    let corrupt =
        |what: &str| StoreError::invalid_record(format!("stored group {what} is out of range"));
    let max_leased = max_leased
        .map(|m| u64::try_from(m).map_err(|_| corrupt("max_leased")))
        .transpose()?;
    let rate = match (rate, burst) {
        (Some(per_second), Some(burst)) => Some(
            u64::try_from(burst)
                .ok()
                // A rate stored before rates were bounded below is read as
                // the slowest allowed (one a day).
                .and_then(|b| Rate::new(per_second.max(crate::domain::MIN_RATE), b).ok())
                .ok_or_else(|| corrupt("rate"))?,
        ),
        _ => None,
    };
    Ok(GroupLimits {
        paused,
        max_leased,
        rate,
    })
}

/// Claim order within a group, on both backends: highest priority, then
/// oldest due (docs/groups.md, "Priorities").
pub fn claim_order(priority: i16, next_visible_at_ms: i64, receipt_id: &str) -> impl Ord + '_ {
    (std::cmp::Reverse(priority), next_visible_at_ms, receipt_id)
}

impl<C> Default for DueClaims<C> {
    fn default() -> Self {
        Self {
            claims: Vec::new(),
            look_again_ms: None,
            held_back: false,
        }
    }
}

/// Put groups read by name in turn order: the first is the first named
/// after `after`, the group where the last claim's turn ended, so that
/// every group with due work gets its turn however many there are (a claim
/// reads only as many groups as it needs: `domain::next_depths`).
pub fn in_turn(groups: &mut [GroupRow], after: &str) {
    let start = groups
        .iter()
        .position(|g| g.name.as_str() > after)
        .unwrap_or(0);
    groups.rotate_left(start);
}

/// Where the turn goes on from after a claim: a backend's memory of it,
/// shared by its claims (each server keeps its own).
pub type Turn = std::sync::Arc<std::sync::Mutex<String>>;

/// The group the last claim's turn ended at (`""`: none yet).
#[must_use]
pub fn turn_after(turn: &Turn) -> String {
    turn.lock().map(|t| t.clone()).unwrap_or_default()
}

/// A claim of `wanted` receipts over `groups` in progress.
#[derive(Debug)]
pub struct FairClaim {
    pub groups: Vec<GroupRow>,
    wanted: u64,
    now: i64,
    caps: Vec<u64>,
    asked: Vec<u64>,
    found: Vec<Vec<Candidate>>,
    pub look_again_ms: Option<u64>,
    pub held_back: bool,
}

impl FairClaim {
    /// Start a claim; `live_leased` holds the live leases of each group with
    /// a `max_leased` (read under the group's lock where replicas share it).
    #[must_use]
    pub fn new(
        groups: Vec<GroupRow>,
        live_leased: &HashMap<String, u64>,
        now: i64,
        wanted: u64,
    ) -> Self {
        let mut look_again_ms: Option<u64> = None;
        let mut held_back = false;
        let caps = groups
            .iter()
            .map(|g| {
                let tokens = g.limits.rate.map_or(0.0, |r| r.tokens_at(g.bucket, now));
                let live = live_leased.get(&g.name).copied().unwrap_or(0);
                let a = allowance(&g.limits, live, tokens, wanted);
                if a.take < wanted {
                    held_back = true;
                }
                if let Some(ms) = a.look_again_ms {
                    look_again_ms = Some(look_again_ms.map_or(ms, |m| m.min(ms)));
                }
                a.take
            })
            .collect();
        let n = groups.len();
        Self {
            groups,
            wanted,
            now,
            caps,
            asked: vec![0; n],
            found: vec![Vec::new(); n],
            look_again_ms,
            held_back,
        }
    }

    /// The groups to read next and how deep (their first `depth` due
    /// receipts), or `None` when what was read is enough.
    #[must_use]
    pub fn next_reads(&self) -> Option<Vec<(usize, u64)>> {
        let found: Vec<u64> = self.found.iter().map(|f| f.len() as u64).collect();
        let depths = next_depths(self.wanted, &self.caps, &found, &self.asked)?;
        Some(
            depths
                .into_iter()
                .enumerate()
                .filter(|&(g, d)| d > self.asked[g])
                .collect(),
        )
    }

    /// What a read of group `g` to `depth` found, in the group's claim order.
    pub fn read(&mut self, g: usize, depth: u64, due: Vec<Candidate>) {
        self.asked[g] = depth;
        self.found[g] = due;
    }

    /// The group of this claim's last pick in round-robin order, from what
    /// each group gave (`quotas`): the last group, in turn order, of those
    /// that gave the most (they had a pick in the last round). The next
    /// claim's turn starts after it; a group read but not taken from keeps
    /// its turn.
    #[must_use]
    pub fn last_turn(&self, quotas: &[u64]) -> Option<&str> {
        let most = quotas.iter().copied().max().filter(|&q| q > 0)?;
        let last = quotas.iter().rposition(|&q| q == most)?;
        Some(self.groups[last].name.as_str())
    }

    /// Remember where the turn ends, when the claim took anything.
    pub fn pass_turn(&self, turn: &Turn, quotas: &[u64]) {
        if let (Some(last), Ok(mut at)) = (self.last_turn(quotas), turn.lock()) {
            last.clone_into(&mut at);
        }
    }

    /// A claim by id of one receipt of the one group read: `Ok` with the
    /// buckets to store when its limits let it, `Err(paused)` when not.
    pub fn admit_one(&self) -> Result<Vec<(String, f64, i64)>, bool> {
        match self.groups.first() {
            None => Ok(Vec::new()),
            Some(group) if self.held_back => Err(group.limits.paused),
            Some(_) => Ok(self.spent(&[1])),
        }
    }

    /// The receipts to take, in claim order, with their group's index.
    #[must_use]
    pub fn picks(&self) -> Vec<(usize, Candidate)> {
        let by_group: BTreeMap<usize, Vec<Candidate>> =
            self.found.iter().cloned().enumerate().collect();
        let mut picks = round_robin(by_group);
        picks.truncate(usize::try_from(self.wanted).unwrap_or(usize::MAX));
        // Chosen in turn order; handed out oldest due first within each
        // round, as PostgreSQL's lease numbers them.
        let mut rank: Vec<usize> = vec![0; self.groups.len()];
        let mut ranked: Vec<(usize, usize, Candidate)> = picks
            .into_iter()
            .map(|(g, c)| {
                rank[g] += 1;
                (rank[g], g, c)
            })
            .collect();
        ranked.sort_by(|a, b| {
            (a.0, a.2.next_visible_at_ms, &a.2.receipt_id).cmp(&(
                b.0,
                b.2.next_visible_at_ms,
                &b.2.receipt_id,
            ))
        });
        ranked.into_iter().map(|(_, g, c)| (g, c)).collect()
    }

    /// How many to take from each group (for a backend that leases each
    /// group's first receipts again, skipping rows others hold).
    #[must_use]
    pub fn quotas(&self) -> Vec<u64> {
        let mut quotas = vec![0; self.groups.len()];
        for (g, _) in self.picks() {
            quotas[g] += 1;
        }
        quotas
    }

    /// The new buckets of the rate-limited groups once `taken[g]` were
    /// claimed from each: `(name, tokens, at_ms)`.
    #[must_use]
    pub fn spent(&self, taken: &[u64]) -> Vec<(String, f64, i64)> {
        self.groups
            .iter()
            .zip(taken)
            .filter_map(|(g, &n)| {
                let rate: Rate = g.limits.rate?;
                (n > 0).then(|| {
                    let left = rate.tokens_at(g.bucket, self.now) - n as f64;
                    (g.name.clone(), left.max(0.0), self.now)
                })
            })
            .collect()
    }

    /// The answer, with the claims the backend leased.
    #[must_use]
    pub fn answer<C>(&self, claims: Vec<C>) -> DueClaims<C> {
        let short = (claims.len() as u64) < self.wanted;
        DueClaims {
            claims,
            look_again_ms: self.look_again_ms.filter(|_| short),
            held_back: self.held_back && short,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, limits: GroupLimits) -> GroupRow {
        GroupRow {
            name: name.into(),
            limits,
            bucket: None,
        }
    }

    /// Drives a claim over groups holding `due[g]` receipts due at 0, 1, ….
    fn claim(groups: Vec<GroupRow>, due: &[u64], wanted: u64) -> (Vec<u64>, FairClaim) {
        let mut fair = FairClaim::new(groups, &HashMap::new(), 0, wanted);
        while let Some(reads) = fair.next_reads() {
            for (g, depth) in reads {
                let cands = (0..depth.min(due[g]))
                    .map(|i| Candidate {
                        receipt_id: format!("{g}-{i:04}"),
                        next_visible_at_ms: i64::try_from(i).unwrap(),
                    })
                    .collect();
                fair.read(g, depth, cands);
            }
        }
        (fair.quotas(), fair)
    }

    #[test]
    fn the_small_group_gets_its_share_from_the_first_claim() {
        let groups = vec![
            group("big", GroupLimits::default()),
            group("small", GroupLimits::default()),
        ];
        let (quotas, fair) = claim(groups, &[1000, 10], 10);
        assert_eq!(quotas, vec![5, 5]);
        assert!(!fair.answer(vec![(); 10]).held_back);
    }

    #[test]
    fn each_claim_takes_its_turn_after_the_last_one() {
        let names = ["a", "b", "c", "d", "e"];
        let mut after = String::new();
        let mut served = Vec::new();
        for _ in 0..3 {
            let mut groups: Vec<GroupRow> = names
                .iter()
                .map(|n| group(n, GroupLimits::default()))
                .collect();
            in_turn(&mut groups, &after);
            let (quotas, fair) = claim(groups, &[9; 5], 2);
            for (g, q) in fair.groups.iter().zip(&quotas) {
                if *q > 0 {
                    served.push(g.name.clone());
                }
            }
            after = fair
                .last_turn(&quotas)
                .expect("took from a group")
                .to_owned();
        }
        assert_eq!(
            served,
            ["a", "b", "c", "d", "e", "a"],
            "every group in turn"
        );
    }

    #[test]
    fn limits_shape_the_shares_and_say_when_to_look_again() {
        let rate = GroupLimits {
            rate: Some(Rate::new(10.0, 2).unwrap()),
            ..GroupLimits::default()
        };
        let paused = GroupLimits {
            paused: true,
            ..GroupLimits::default()
        };
        let groups = vec![group("rated", rate), group("paused", paused)];
        let (quotas, fair) = claim(groups, &[50, 50], 10);
        assert_eq!(quotas, vec![2, 0]);
        let answer = fair.answer(vec![(); 2]);
        assert!(answer.held_back);
        assert_eq!(answer.look_again_ms, Some(100));
        assert_eq!(fair.spent(&quotas), vec![("rated".to_owned(), 0.0, 0)]);
    }
}
