//! Every metric, registered once with its name, help text and unit: what
//! `/metrics` lists.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::Metrics;
use super::labels::{
    ActionLabels, ClaimResultLabels, GroupLabels, HostLabels, LabelledGroups, OutcomeLabels,
    RequestLabels, RouteLabels, RouteOnlyLabels, StateLabels, wait_histogram,
};

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("settled");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_25, 2.0, 18))
        });
        registry.register_with_unit(
            "http_request_duration",
            "HTTP request latency",
            Unit::Seconds,
            latency.clone(),
        );
        let claims = Counter::default();
        registry.register("claims", "Receipts leased to workers", claims.clone());
        let claim_requests = Family::<ClaimResultLabels, Counter>::default();
        registry.register(
            "claim_requests",
            "Claim calls by result: leased (one receipt or more), empty, look_again \
             (empty while a group's rate limit held due work back), refused (a claim by id), \
             failed (the claim met an error)",
            claim_requests.clone(),
        );
        let time_in_queue = Family::<GroupLabels, Histogram>::new_with_constructor(wait_histogram);
        registry.register_with_unit(
            "time_in_queue",
            "From a receipt being claimable (due, or its lease expired) to its claim, per group \
             (the first 100 groups seen; the rest under group=\"\")",
            Unit::Seconds,
            time_in_queue.clone(),
        );
        let claim_to_outcome =
            Family::<RouteOnlyLabels, Histogram>::new_with_constructor(wait_histogram);
        registry.register_with_unit(
            "claim_to_outcome",
            "From a claim to its committed outcome, by route",
            Unit::Seconds,
            claim_to_outcome.clone(),
        );
        let extensions = Counter::default();
        registry.register(
            "lease_extensions",
            "Leases extended (heartbeats answered with a new lease_until_ms)",
            extensions.clone(),
        );
        let spans_dropped = Counter::default();
        registry.register(
            "trace_spans_dropped",
            "Trace spans dropped: the export queue was full or the collector did not take them \
             (0 while tracing is off)",
            spans_dropped.clone(),
        );
        let spans_exported = Counter::default();
        registry.register(
            "trace_spans_exported",
            "Trace spans delivered to the OTLP collector",
            spans_exported.clone(),
        );
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "outcomes",
            "Outcomes committed, by route, outcome kind and code (failure code or skip reason; \
             empty for accepted)",
            outcomes.clone(),
        );
        let conflicts = Counter::default();
        registry.register(
            "conflicts",
            "Writes refused as conflicts (stale, forged or late)",
            conflicts.clone(),
        );
        let actions = Family::<ActionLabels, Counter>::default();
        registry.register(
            "operator_actions",
            "Operators' actions on receipts, by action and result (done, unchanged, refused)",
            actions.clone(),
        );
        let expiries = Counter::default();
        registry.register(
            "lease_expiries",
            "Leases found expired when their receipt was claimed again",
            expiries.clone(),
        );
        let receipts = Family::<StateLabels, Gauge>::default();
        registry.register("receipts", "Receipts by state", receipts.clone());
        // Not a `state` label: pending already counts these, and the states
        // must keep adding up to every receipt.
        let scheduled = Gauge::default();
        registry.register(
            "scheduled_receipts",
            "Pending receipts not due yet (visible_at_ms ahead)",
            scheduled.clone(),
        );
        let held = Gauge::default();
        registry.register(
            "held_receipts",
            "Active receipts an operator holds (counted in their state too)",
            held.clone(),
        );
        let oldest_due = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "oldest_due_age",
            "Age of the oldest claimable receipt",
            Unit::Seconds,
            oldest_due.clone(),
        );
        let dead_letters = Gauge::default();
        registry.register(
            "dead_letters",
            "Receipts waiting in the dead-letter queue",
            dead_letters.clone(),
        );
        let history_streams = Gauge::default();
        registry.register(
            "history_streams",
            "History feed streams (GET /v1/history as text/event-stream) open now",
            history_streams.clone(),
        );
        let history_streams_refused = Counter::default();
        registry.register(
            "history_streams_refused",
            "History feed streams refused at a stream cap (--max-streams, --max-streams-per-caller)",
            history_streams_refused.clone(),
        );
        let history_events = Counter::default();
        registry.register(
            "history_stream_events",
            "History entries sent on feed streams",
            history_events.clone(),
        );
        // Per group: the first GLANCE_GROUPS by name (a bound on the labels).
        let group_leased = Family::<GroupLabels, Gauge>::default();
        registry.register(
            "group_leased",
            "Live leases per group (the first 100 groups by name)",
            group_leased.clone(),
        );
        let group_oldest_due = Family::<GroupLabels, Gauge<f64, AtomicU64>>::default();
        registry.register_with_unit(
            "group_oldest_due_age",
            "Age of the oldest claimable receipt per group (the first 100 groups by name)",
            Unit::Seconds,
            group_oldest_due.clone(),
        );
        let group_paused = Family::<GroupLabels, Gauge>::default();
        registry.register(
            "group_paused",
            "1 while an operator has paused the group (the first 100 groups by name)",
            group_paused.clone(),
        );
        // PostgreSQL only: no series on SQLite.
        let postgres_writable = Family::<HostLabels, Gauge>::default();
        registry.register(
            "postgres_writable",
            "1 while the PostgreSQL host in use (label host) takes this replica's writes, 0 while \
             it looks for the primary",
            postgres_writable.clone(),
        );
        let postgres_failovers = Counter::default();
        registry.register(
            "postgres_failovers",
            "Times this replica moved its connections to a new PostgreSQL writer",
            postgres_failovers.clone(),
        );
        Self {
            registry,
            postgres_writable,
            postgres_failovers,
            group_leased,
            group_oldest_due,
            group_paused,
            requests,
            latency,
            claims,
            claim_requests,
            time_in_queue,
            claim_to_outcome,
            labelled_groups: LabelledGroups::default(),
            extensions,
            spans_dropped,
            spans_exported,
            outcomes,
            conflicts,
            actions,
            expiries,
            receipts,
            scheduled,
            held,
            oldest_due,
            dead_letters,
            history_streams,
            history_streams_refused,
            history_events,
        }
    }
}
