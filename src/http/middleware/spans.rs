//! One OpenTelemetry span per request, when tracing is on (src/telemetry.rs).
//!
//! Handlers note what the span should say (receipt, worker, group, route,
//! conflict code, the producers' trace contexts) with [`note`]; the span
//! itself is built once the response is known, so it can take the right
//! parent: the request's own `traceparent`, else the producer's context of
//! the one receipt the request is about (a claim of one receipt, or an
//! outcome whose claim carries it). Every other producer context the request
//! touched is a link. With tracing off nothing is collected: [`note`] finds
//! no scope and returns.

use std::cell::RefCell;
use std::future::Future;
use std::str::FromStr;
use std::time::SystemTime;

use axum::http::HeaderMap;
use axum::response::Response;
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};

use crate::domain::{Claimed, Route, TraceContext};
use crate::telemetry::Telemetry;

/// Producer contexts linked from one span, at most.
const MAX_LINKS: usize = 128;

tokio::task_local! {
    static FACTS: RefCell<Facts>;
}

/// What the handler of a request tells its span.
#[derive(Debug, Default)]
pub struct Facts {
    receipt_id: Option<String>,
    worker_id: Option<String>,
    group: Option<String>,
    receipts: usize,
    outcome_route: Option<&'static str>,
    conflict_code: Option<String>,
    problem_code: Option<String>,
    traces: Vec<TraceContext>,
}

/// Whether this request is traced (its handler runs in a span's scope).
pub fn active() -> bool {
    FACTS.try_with(|_| ()).is_ok()
}

fn note(change: impl FnOnce(&mut Facts)) {
    let _ = FACTS.try_with(|facts| change(&mut facts.borrow_mut()));
}

/// The request is about these receipts, in this group (when they share one).
fn about<'a>(facts: &mut Facts, ids: impl IntoIterator<Item = (&'a str, &'a str)>) {
    for (id, group) in ids {
        facts.receipts += 1;
        if facts.receipts == 1 {
            facts.receipt_id = Some(id.to_owned());
            facts.group = Some(group.to_owned());
        } else {
            facts.receipt_id = None;
            if facts.group.as_deref() != Some(group) {
                facts.group = None;
            }
        }
    }
}

fn keep_trace(facts: &mut Facts, trace: Option<TraceContext>) {
    if let Some(trace) = trace
        && facts.traces.len() < MAX_LINKS
        && !facts.traces.contains(&trace)
    {
        facts.traces.push(trace);
    }
}

/// Receipts handed out to `worker`.
pub fn note_claimed<'a>(worker: &str, claims: impl IntoIterator<Item = &'a Claimed>) {
    note(|f| {
        f.worker_id = Some(worker.to_owned());
        for c in claims {
            about(f, [(c.receipt_id.as_str(), c.group.as_str())]);
            keep_trace(f, c.trace.clone());
        }
    });
}

/// What a claim sent back (outcome, extension, release) says of itself.
pub struct SentClaim<'a> {
    pub receipt_id: &'a str,
    pub worker_id: &'a str,
    pub group: &'a str,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
}

/// A claim sent back: its receipt, its owner, and the producer's context
/// it carries.
pub fn note_claim(claim: SentClaim<'_>) {
    note(|f| {
        f.worker_id = Some(claim.worker_id.to_owned());
        about(f, [(claim.receipt_id, claim.group)]);
        let trace = claim
            .traceparent
            .and_then(|p| TraceContext::parse(p, claim.tracestate).ok());
        keep_trace(f, trace);
    });
}

/// A receipt enqueued.
pub fn note_enqueued(id: &str, group: &str) {
    note(|f| about(f, [(id, group)]));
}

/// What the server did with an outcome.
pub fn note_route(route: &Route) {
    note(|f| {
        if f.outcome_route.is_none() {
            f.outcome_route = Some(route.kind());
        }
    });
}

/// An error answered (the first of a batch is kept).
pub fn note_problem(code: &str, conflict: bool) {
    note(|f| {
        if conflict && f.conflict_code.is_none() {
            f.conflict_code = Some(code.to_owned());
        }
        if f.problem_code.is_none() {
            f.problem_code = Some(code.to_owned());
        }
    });
}

fn span_context(trace: &TraceContext) -> Option<SpanContext> {
    let flags = u8::from(trace.sampled());
    Some(SpanContext::new(
        TraceId::from_hex(trace.trace_id()).ok()?,
        SpanId::from_hex(trace.parent_id()).ok()?,
        TraceFlags::new(flags),
        true,
        trace
            .tracestate()
            .and_then(|s| TraceState::from_str(s).ok())
            .unwrap_or_default(),
    ))
}

/// What the span of one request is named and says besides the facts.
pub struct RequestLabels<'a> {
    pub method: &'static str,
    pub route: &'a str,
    pub request_id: &'a str,
}

/// The trace context a request's own `traceparent` / `tracestate` headers
/// name, if any.
#[must_use]
pub fn request_parent(headers: &HeaderMap) -> Option<TraceContext> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    TraceContext::from_headers(text("traceparent"), text("tracestate"))
}

/// Run `handle` and export its span; `own_parent` is the request's own
/// context ([`request_parent`]).
pub async fn traced(
    telemetry: &Telemetry,
    own_parent: Option<TraceContext>,
    labels: RequestLabels<'_>,
    handle: impl Future<Output = Response>,
) -> Response {
    let start = SystemTime::now();
    let (response, facts) = FACTS
        .scope(RefCell::new(Facts::default()), async {
            let response = handle.await;
            (response, FACTS.with(RefCell::take))
        })
        .await;
    let end = SystemTime::now();
    // The request's own context, else the one receipt's producer.
    let parent = own_parent.or_else(|| {
        (facts.receipts == 1 && facts.traces.len() == 1).then(|| facts.traces[0].clone())
    });
    let links: Vec<Link> = facts
        .traces
        .iter()
        .filter(|t| parent.as_ref() != Some(*t))
        .filter_map(span_context)
        .map(Link::with_context)
        .collect();
    let status = response.status().as_u16();
    let mut attributes = vec![
        KeyValue::new("http.request.method", labels.method),
        KeyValue::new("http.route", labels.route.to_owned()),
        KeyValue::new("http.response.status_code", i64::from(status)),
        KeyValue::new("settled.request_id", labels.request_id.to_owned()),
    ];
    let optional = [
        ("settled.receipt_id", facts.receipt_id),
        ("settled.worker_id", facts.worker_id),
        ("settled.group", facts.group),
        (
            "settled.outcome.route",
            facts.outcome_route.map(str::to_owned),
        ),
        ("settled.conflict_code", facts.conflict_code),
        ("settled.problem_code", facts.problem_code),
    ];
    attributes.extend(
        optional
            .into_iter()
            .filter_map(|(key, value)| Some(KeyValue::new(key, value?))),
    );
    if facts.receipts > 0 {
        attributes.push(KeyValue::new(
            "settled.receipts",
            i64::try_from(facts.receipts).unwrap_or(i64::MAX),
        ));
    }
    let cx = parent
        .as_ref()
        .and_then(span_context)
        .map_or_else(Context::new, |sc| {
            Context::new().with_remote_span_context(sc)
        });
    let tracer = telemetry.tracer();
    let mut span = tracer
        .span_builder(format!("{} {}", labels.method, labels.route))
        .with_kind(SpanKind::Server)
        .with_start_time(start)
        .with_attributes(attributes)
        .with_links(links)
        .start_with_context(tracer, &cx);
    if status >= 500 {
        span.set_status(Status::error(format!("HTTP {status}")));
    }
    span.end_with_timestamp(end);
    response
}
