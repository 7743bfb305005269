//! Prometheus metrics, one registry per server (so tests can run several).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

mod labels;

use labels::{
    ActionLabels, ClaimResultLabels, GroupLabels, HostLabels, LabelledGroups, OutcomeLabels,
    RequestLabels, RouteLabels, RouteOnlyLabels, StateLabels, seconds_between, wait_histogram,
};

use super::AppState;
use super::error::ApiError;
use crate::domain::{Claim, Claimed, Outcome, Route};
use crate::store::postgres::WriterState;
use crate::store::{Acted, ActionResult, ReceiptState, StatusView};

/// The service's counters, histograms and gauges.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    claims: Counter,
    claim_requests: Family<ClaimResultLabels, Counter>,
    time_in_queue: Family<GroupLabels, Histogram>,
    claim_to_outcome: Family<RouteOnlyLabels, Histogram>,
    labelled_groups: LabelledGroups,
    extensions: Counter,
    spans_dropped: Counter,
    spans_exported: Counter,
    outcomes: Family<OutcomeLabels, Counter>,
    conflicts: Counter,
    actions: Family<ActionLabels, Counter>,
    expiries: Counter,
    receipts: Family<StateLabels, Gauge>,
    scheduled: Gauge,
    held: Gauge,
    oldest_due: Gauge<f64, AtomicU64>,
    dead_letters: Gauge,
    history_streams: Gauge,
    history_streams_refused: Counter,
    history_events: Counter,
    group_leased: Family<GroupLabels, Gauge>,
    group_oldest_due: Family<GroupLabels, Gauge<f64, AtomicU64>>,
    group_paused: Family<GroupLabels, Gauge>,
    postgres_writable: Family<HostLabels, Gauge>,
    postgres_failovers: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

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
             (empty while a group's rate limit held due work back), refused (a claim by id)",
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

impl Metrics {
    /// One finished HTTP request.
    pub fn request(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let (method, route) = (method.to_owned(), route.to_owned());
        self.requests
            .get_or_create(&RequestLabels {
                method: method.clone(),
                route: route.clone(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels { method, route })
            .observe(seconds);
    }

    /// Receipts leased at `now_ms`; those taken over from an expired lease
    /// count as lease expiries too.
    pub fn claimed<'a>(&self, claims: impl IntoIterator<Item = &'a Claimed>, now_ms: u64) {
        for claimed in claims {
            self.claims.inc();
            if claimed.after_expiry {
                self.expiries.inc();
            }
            let group = self.labelled_groups.label(claimed.group.as_str());
            self.time_in_queue
                .get_or_create(&GroupLabels { group })
                .observe(seconds_between(claimed.queued_since_ms, now_ms));
        }
    }

    /// One claim call and what it got.
    pub fn claim_request(&self, result: ClaimResult) {
        let result = match result {
            ClaimResult::Leased => "leased",
            ClaimResult::Empty => "empty",
            ClaimResult::LookAgain => "look_again",
            ClaimResult::Refused => "refused",
        };
        self.claim_requests
            .get_or_create(&ClaimResultLabels { result })
            .inc();
    }

    /// The trace exporter's counters: spans dropped, spans exported.
    #[must_use]
    pub fn trace_counters(&self) -> (Counter, Counter) {
        (self.spans_dropped.clone(), self.spans_exported.clone())
    }

    /// One lease extended.
    pub fn extended(&self) {
        self.extensions.inc();
    }

    /// One committed outcome of `claim`, at `now_ms`.
    pub fn routed(&self, claim: &Claim, outcome: &Outcome, route: &Route, now_ms: u64) {
        let code = match outcome {
            Outcome::Accepted { .. } => "",
            Outcome::Skipped { reason } => reason.as_str(),
            Outcome::Retryable { reason, .. } | Outcome::Permanent { reason } => {
                reason.code.as_str()
            }
        };
        self.outcomes
            .get_or_create(&OutcomeLabels {
                route: route.kind(),
                kind: outcome.kind(),
                code,
            })
            .inc();
        // The token says when its claim was made; it matched the stored one.
        if let Some(at) = claim.lease_token.claimed_at_ms() {
            self.claim_to_outcome
                .get_or_create(&RouteOnlyLabels {
                    route: route.kind(),
                })
                .observe(seconds_between(at, now_ms));
        }
    }

    /// One refused write.
    pub fn conflict(&self) {
        self.conflicts.inc();
    }

    /// One operator's action on one receipt (not counted in a dry run).
    pub fn acted(&self, action: &'static str, result: &ActionResult) {
        let result = match result {
            Ok(Acted::Done) => "done",
            Ok(Acted::Unchanged) => "unchanged",
            Err(_) => "refused",
        };
        self.actions
            .get_or_create(&ActionLabels { action, result })
            .inc();
    }

    /// A history feed stream opened.
    pub fn history_stream_opened(&self) {
        self.history_streams.inc();
    }

    /// A history feed stream refused at a cap.
    pub fn history_stream_refused(&self) {
        self.history_streams_refused.inc();
    }

    /// A history feed stream ended.
    pub fn history_stream_closed(&self) {
        self.history_streams.dec();
    }

    /// One entry sent on a history feed stream.
    pub fn history_event(&self) {
        self.history_events.inc();
    }

    /// Refresh the gauges from a status snapshot (when one could be read)
    /// and the writer's state, and render everything.
    pub fn render(&self, status: Option<&StatusView>, writer: Option<&WriterState>) -> String {
        if let Some(writer) = writer {
            self.postgres_writable.clear();
            self.postgres_writable
                .get_or_create(&HostLabels {
                    host: writer.primary.clone(),
                })
                .set(i64::from(writer.writable));
            // Never past the store's count, whatever scrapes run at once.
            self.postgres_failovers
                .inner()
                .fetch_max(writer.failovers, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(status) = status {
            self.refresh(status);
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    fn refresh(&self, status: &StatusView) {
        for state in ReceiptState::ALL {
            let n = i64::try_from(status.counts.get(state)).unwrap_or(i64::MAX);
            self.receipts
                .get_or_create(&StateLabels {
                    state: state.as_str().to_owned(),
                })
                .set(n);
        }
        self.scheduled
            .set(i64::try_from(status.counts.scheduled).unwrap_or(i64::MAX));
        self.held
            .set(i64::try_from(status.counts.held).unwrap_or(i64::MAX));
        self.oldest_due
            .set(status.oldest_due_age_ms as f64 / 1000.0);
        self.dead_letters
            .set(i64::try_from(status.counts.dead_lettered).unwrap_or(i64::MAX));
        // Only the groups of this snapshot keep a series.
        self.group_leased.clear();
        self.group_oldest_due.clear();
        self.group_paused.clear();
        for g in &status.groups {
            let labels = GroupLabels {
                group: g.group.clone(),
            };
            self.group_leased
                .get_or_create(&labels)
                .set(i64::try_from(g.leased).unwrap_or(i64::MAX));
            self.group_oldest_due
                .get_or_create(&labels)
                .set(g.oldest_due_age_ms as f64 / 1000.0);
            self.group_paused
                .get_or_create(&labels)
                .set(i64::from(g.paused));
        }
    }
}

/// What a claim call got (`settled_claim_requests_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimResult {
    Leased,
    Empty,
    LookAgain,
    Refused,
}

/// Prometheus text exposition (OpenMetrics).
pub async fn metrics(State(app): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let status = app.store.status_at_a_glance(app.now(), 1).await;
    let writer = app.store.writer();
    // Where there may be a failover (PostgreSQL), the scrape must still come
    // through while the database is away, or `settled_postgres_writable 0`
    // could never be read: the receipt gauges keep their last values then.
    let status = match (status, &writer) {
        (Ok(status), _) => Some(status),
        (Err(error), Some(_)) => {
            tracing::warn!(%error, "cannot read the receipt counts for /metrics; showing the last ones");
            None
        }
        (Err(error), None) => return Err(error.into()),
    };
    let body = app.metrics.render(status.as_ref(), writer.as_ref());
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    ))
}

/// Shared handle.
pub type SharedMetrics = Arc<Metrics>;
