//! Prometheus metrics, one registry per server (so tests can run several).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

mod labels;
mod register;

use labels::{
    ActionLabels, ClaimResultLabels, GroupLabels, HostLabels, LabelledGroups, OutcomeLabels,
    RequestLabels, RouteLabels, RouteOnlyLabels, StateLabels, seconds_between,
};

use crate::domain::{Claim, Claimed, Outcome, Route};
use crate::http::AppState;
use crate::http::error::ApiError;
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
            ClaimResult::Failed => "failed",
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
    /// The claim itself failed (the database's error), whether the request
    /// answered it as its status or, after recording its outcomes, as
    /// `claim_error`.
    Failed,
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
