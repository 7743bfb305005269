//! The groups a claim that names none looks at: a walk of the groups with
//! work, in turn order, bounded by what the claim may need
//! (`rules::claim_groups_sql`; docs/groups.md, "What it costs").

use super::fair::GroupRow;

/// How many groups with work a claim of `wanted` walks before it looks at
/// what they hold: enough that the first `wanted` of them with a receipt
/// due usually fill it.
#[must_use]
pub fn walk_bound(wanted: u64) -> u64 {
    wanted.saturating_mul(4).saturating_add(64)
}

/// The groups of a bounded walk (`claim_groups_sql`): `(group, walked)`
/// rows, walked ones in turn order after `after`, at most `bound` of them,
/// and those with a lapsed lease. In turn order, each once; the lapsed ones
/// only up to the last group walked, unless the walk reached the end. The
/// second value says whether it did (then these are all the groups with
/// work).
#[must_use]
pub fn walked_groups(
    rows: Vec<(GroupRow, bool)>,
    after: &str,
    bound: u64,
) -> (Vec<GroupRow>, bool) {
    let walked = rows.iter().filter(|(_, w)| *w).count() as u64;
    let complete = walked < bound;
    let key = |name: &str| (name <= after, name.to_owned());
    let last = rows
        .iter()
        .filter(|(_, w)| *w)
        .map(|(g, _)| key(&g.name))
        .max();
    let mut groups: Vec<GroupRow> = rows
        .into_iter()
        .filter(|(g, w)| *w || complete || last.as_ref().is_some_and(|l| key(&g.name) <= *l))
        .map(|(g, _)| g)
        .collect();
    groups.sort_by_key(|g| key(&g.name));
    groups.dedup_by(|a, b| a.name == b.name);
    (groups, complete)
}

/// Whether a claim over the groups of a walk that stopped at its bound
/// (`quotas` per group) is the claim a walk of every group would make: it
/// is full and takes at most one receipt of each group, so that it took the
/// first `wanted` groups in turn able to give one, which the walk's groups
/// begin with. Otherwise the claim walks every group with work.
#[must_use]
pub fn walked_enough(quotas: &[u64], wanted: u64) -> bool {
    quotas.iter().sum::<u64>() >= wanted && quotas.iter().all(|&q| q <= 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::GroupLimits;

    fn group(name: &str) -> GroupRow {
        GroupRow {
            name: name.into(),
            limits: GroupLimits::default(),
            bucket: None,
        }
    }

    fn rows(names: &[(&str, bool)]) -> Vec<(GroupRow, bool)> {
        names.iter().map(|(n, w)| (group(n), *w)).collect()
    }

    #[test]
    fn a_walk_at_its_bound_keeps_lapsed_groups_up_to_where_it_stopped() {
        // Walked after "c": d, e, then wrapped to a; lapsed leases in b and f.
        let found = rows(&[
            ("d", true),
            ("e", true),
            ("a", true),
            ("b", false),
            ("f", false),
            ("e", false),
        ]);
        let (groups, complete) = walked_groups(found.clone(), "c", 3);
        let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["d", "e", "f", "a"], "b lies past the walk's end");
        assert!(!complete);
        let (groups, complete) = walked_groups(found, "c", 4);
        let names: Vec<&str> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["d", "e", "f", "a", "b"]);
        assert!(complete);
    }

    #[test]
    fn a_bounded_walk_is_enough_only_for_a_full_first_round() {
        assert!(walked_enough(&[1, 0, 1, 1], 3));
        assert!(!walked_enough(&[1, 0, 1], 3), "short");
        assert!(!walked_enough(&[2, 1], 3), "a second round");
    }
}
