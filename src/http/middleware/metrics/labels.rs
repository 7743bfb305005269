//! The label sets of the metrics, and the helpers that keep their values
//! bounded (see the parent module).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::Histogram;

use crate::store::GLANCE_GROUPS;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) method: String,
    pub(super) route: String,
    pub(super) status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteLabels {
    pub(super) method: String,
    pub(super) route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    pub(super) route: &'static str,
    pub(super) kind: &'static str,
    pub(super) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteOnlyLabels {
    pub(super) route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClaimResultLabels {
    pub(super) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ActionLabels {
    pub(super) action: &'static str,
    pub(super) result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GroupLabels {
    pub(super) group: String,
}

/// The PostgreSQL host a replica writes to, as `--database-url` names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HostLabels {
    pub(super) host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) state: String,
}

/// Buckets for waits: 5 ms to a day, as queues wait (a worker's busy
/// minute and an outage's hours both have a bucket).
pub(super) fn wait_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
        3_600.0, 21_600.0, 86_400.0,
    ])
}

/// `to - from` in seconds; 0 when the clock says `to` came first.
pub(super) fn seconds_between(from_ms: u64, to_ms: u64) -> f64 {
    to_ms.saturating_sub(from_ms) as f64 / 1000.0
}

/// Group labels of the per-group histograms: the first [`GLANCE_GROUPS`]
/// groups seen keep their names, later ones share `""` (no group has an
/// empty name), so a producer naming groups cannot grow `/metrics` without
/// bound.
#[derive(Default)]
pub(super) struct LabelledGroups(std::sync::RwLock<std::collections::HashSet<String>>);

impl LabelledGroups {
    pub(super) fn label(&self, group: &str) -> String {
        let known = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.contains(group) {
            return group.to_owned();
        }
        drop(known);
        let mut known = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if known.len() < GLANCE_GROUPS {
            known.insert(group.to_owned());
            return group.to_owned();
        }
        known.get(group).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_past_the_first_hundred_share_one_label() {
        let groups = LabelledGroups::default();
        for i in 0..GLANCE_GROUPS {
            assert_eq!(groups.label(&format!("g{i}")), format!("g{i}"));
        }
        assert_eq!(groups.label("late"), "", "the 101st group");
        assert_eq!(groups.label("g7"), "g7", "a labelled group keeps its name");
    }
}
