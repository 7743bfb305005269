//! `GET /v1/history`: every history entry in commit order after a cursor,
//! as JSON pages or as a live `text/event-stream` (docs/operators.md,
//! "Follow every outcome: the history feed").
//!
//! A stream answers its first read before it starts, so a bad or expired
//! cursor and an unreachable database are problem+json like any error. Then
//! it reads on from the last entry it sent, waking on the store's work
//! notifier and at least every [`STREAM_POLL`] (entries written by another
//! replica, or by an outcome that made no work due, wake nothing here), and
//! ends when the server shuts down. The request time limit (`time_limit` in
//! this module's parent) bounds only the time to the response head, and the
//! compression layer leaves `text/event-stream` alone, so neither cuts or
//! holds back the stream; the connection counts as busy while it streams, so
//! the idle timeout and the connection cap leave it open too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::auth::Caller;
use super::error::{ApiError, Problem, ProblemCode};
use super::extract::ApiQuery;
use super::metrics::SharedMetrics;
use super::streams::{RETRY_AFTER_S, Refused, Slot};
use crate::domain::StoreError;
use crate::store::{FeedEntry, FeedPosition, FeedRead, FeedStart, StoreResult};

/// Default and largest page size.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
/// Entries a stream reads per store call.
const STREAM_BATCH: usize = 500;
/// Longest an idle stream waits before looking for new entries again.
pub const STREAM_POLL: Duration = Duration::from_millis(500);
/// How often an idle stream sends a comment, so that proxies keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// `after=latest`: start at the newest entry, with only what comes later.
const LATEST: &str = "latest";

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(history))
}

/// Where to start, and the page size.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FeedQuery {
    /// Continue after this position: a `next_cursor` of a page, the `cursor`
    /// of an entry (an event's `id`), or `latest` for only entries committed
    /// from now on. Absent: from the oldest entry still retained. A stream's
    /// `Last-Event-ID` header, when sent, takes its place.
    pub after: Option<String>,
    /// JSON pages only, instead of `after`: the newest `limit` entries up to
    /// and including this position (a `cursor`, a `next_cursor`, or `latest`
    /// for the newest entry), oldest first; `next_cursor` is the position
    /// given, to pass as `after` to continue with no gap and no repeat.
    pub before: Option<String>,
    /// JSON pages: 1..=1000, default 100. A stream sends everything.
    pub limit: Option<usize>,
}

/// A page of the feed, oldest entry first.
#[derive(Debug, Serialize, ToSchema)]
pub struct FeedPage {
    pub entries: Vec<FeedEntry>,
    /// Always present: pass as `after` for the next page. The last entry's
    /// `cursor`, or the position asked for when there was nothing new.
    pub next_cursor: String,
}

/// Set by the server on every request: marks the request's connection as
/// busy for as long as the returned guard lives, so that the idle timeout
/// and the connection cap (src/server/connections.rs) leave a stream open.
#[derive(Clone)]
pub struct KeepBusy(pub Arc<dyn Hold>);

/// What [`KeepBusy`] holds: the request's connection.
pub trait Hold: Send + Sync {
    /// Busy until the guard is dropped.
    fn hold(self: Arc<Self>) -> Box<dyn Send + Sync>;
}

fn parse_start(text: Option<&str>) -> Result<FeedStart, ApiError> {
    match text {
        None => Ok(FeedStart::Beginning),
        Some(LATEST) => Ok(FeedStart::Latest),
        Some(text) => text.parse().map(FeedStart::After).map_err(|_| {
            ApiError::validation(
                ProblemCode::InvalidCursor,
                "after (or Last-Event-ID) must be a `cursor` or `next_cursor` from this feed, \
                 or `latest`",
            )
        }),
    }
}

/// A read's entries and where to continue, or the problem a reader must see.
fn page(read: FeedRead) -> Result<(Vec<FeedEntry>, FeedPosition), ApiError> {
    match read {
        FeedRead::Page { entries, next } => Ok((entries, next)),
        FeedRead::Expired { horizon } => Err(ApiError::gone(
            ProblemCode::HistoryCursorExpired,
            format!(
                "retention deleted entries after this cursor before they were read (up to \
                 {horizon}); start again without `after` and reconcile the gap from the \
                 receipts themselves"
            ),
        )),
        FeedRead::Ahead { tip } => Err(ApiError::validation(
            ProblemCode::InvalidCursor,
            format!(
                "this cursor is past the newest entry of this store ({tip}): it did not come \
                 from this store's feed"
            ),
        )),
    }
}

/// Whether the client asked for `text/event-stream`.
fn wants_stream(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().any(|value| {
        value.to_str().is_ok_and(|text| {
            text.split(',').any(|range| {
                let media = range.split(';').next().unwrap_or("").trim();
                media.eq_ignore_ascii_case("text/event-stream")
            })
        })
    })
}

/// The stream's start: `Last-Event-ID` (what an `EventSource` resends when
/// it reconnects) before `after`.
fn stream_start(headers: &HeaderMap, after: Option<&str>) -> Result<FeedStart, ApiError> {
    match headers.get("last-event-id") {
        Some(value) if !value.is_empty() => parse_start(Some(value.to_str().map_err(|_| {
            ApiError::validation(ProblemCode::InvalidCursor, "Last-Event-ID is not a cursor")
        })?)),
        _ => parse_start(after),
    }
}

/// Follow every history entry (outcomes, releases, redrives) in commit order.
///
/// As JSON pages (`Accept: application/json`, the default): entries after
/// `after`, at most `limit`, and the `next_cursor` to pass as `after` next.
/// As a live stream (`Accept: text/event-stream`): one event per entry, `id`
/// its cursor and `data` the entry as JSON, with a comment every 15 s while
/// idle; resume with `Last-Event-ID` (or `after`). Nothing is skipped or
/// repeated across pages or resumes, whichever replica committed what.
///
/// Retention (`--retain-finished`) deletes finished receipts with their history: a
/// cursor behind an entry it deleted gets 410 `history_cursor_expired`.
///
/// Streams are capped (`--max-streams` in all, `--max-streams-per-caller` per
/// token; without tokens every caller is one): a stream past a cap is
/// answered 429 `too_many_streams` with `Retry-After` at once, and JSON
/// pages are answered as usual meanwhile.
#[utoipa::path(get, path = "/v1/history", security(("bearer" = ["reader", "operator"])), operation_id = "v1.history.list", tag = "history",
    params(
        FeedQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Streams: the `id` of the last event received; takes the place of `after`"),
    ),
    responses(
        (status = 200, description = "A page (JSON), or the live stream (`text/event-stream`: `id: <cursor>` and `data: <FeedEntry JSON>` per entry)",
            content(
                (FeedPage = "application/json"),
                (String = "text/event-stream", example = json!("id: 0-42\ndata: {\"cursor\":\"0-42\",\"receipt_id\":\"r-1\",\"attempt\":1,\"outcome\":\"accepted\",\"transcript_id\":\"tx-9\",\"worker_id\":\"worker-a\",\"observed_at_ms\":1764460830000,\"route\":\"no_action\"}\n\n")),
            )),
        (status = 410, description = "Retention deleted entries after this cursor before they were read (`history_cursor_expired`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad limit or cursor", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "A stream past `--max-streams` or `--max-streams-per-caller` (`too_many_streams`, class `capacity`); JSON pages are still answered",
            headers(("Retry-After" = u64, description = "Seconds to wait before asking for a stream again")),
            body = Problem, content_type = "application/problem+json"),
    ))]
async fn history(
    State(app): State<AppState>,
    keep_busy: Option<Extension<KeepBusy>>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<FeedQuery>,
) -> Result<Response, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::validation(
            ProblemCode::InvalidLimit,
            "limit must be 1..=1000",
        ));
    }
    if wants_stream(&headers) {
        if query.before.is_some() {
            return Err(ApiError::validation(
                ProblemCode::InvalidQuery,
                "`before` reads JSON pages only; a stream starts `after` a position",
            ));
        }
        let start = stream_start(&headers, query.after.as_deref())?;
        let slot = admit(&app, caller.as_ref().map(|Extension(c)| c))?;
        return stream(app, start, slot, keep_busy.map(|Extension(k)| k)).await;
    }
    let start = match (query.after.as_deref(), query.before.as_deref()) {
        (Some(_), Some(_)) => {
            return Err(ApiError::validation(
                ProblemCode::InvalidQuery,
                "give `after` or `before`, not both",
            ));
        }
        (None, Some(before)) => match parse_start(Some(before))? {
            FeedStart::Latest => FeedStart::UpToLatest,
            FeedStart::After(position) => FeedStart::UpTo(position),
            other => other,
        },
        (after, None) => parse_start(after)?,
    };
    let (entries, next) = page(app.checked(detached(&app, start, limit).await)?)?;
    Ok(Json(FeedPage {
        entries,
        next_cursor: next.to_string(),
    })
    .into_response())
}

/// One feed read on a task of its own, so that a client going away (which
/// drops a stream, or a handler, wherever it waits) never drops the read in
/// the middle of its database transaction: on PostgreSQL that could hand
/// the pool a connection still inside the read-only transaction, and a
/// later write on it would fail ("cannot execute … in a read-only
/// transaction"; seen with streams dropped mid-read).
async fn detached(app: &AppState, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
    let store = app.store.clone();
    tokio::spawn(async move { store.history_feed(start, limit).await })
        .await
        .unwrap_or_else(|e| {
            Err(StoreError::backend(format!(
                "the history feed read failed: {e}"
            )))
        })
}

/// A place for one more stream under the caps, or the 429 that refuses it.
fn admit(app: &AppState, caller: Option<&Caller>) -> Result<Slot, ApiError> {
    app.streams.admit(caller).map_err(|refused| {
        app.metrics.history_stream_refused();
        let detail = match refused {
            Refused::Total(n) => format!(
                "this server has {n} event streams open, its limit (--max-streams); read the \
                 feed as JSON pages meanwhile, or try the stream again later"
            ),
            Refused::PerCaller(n) => format!(
                "this token has {n} event streams open, its limit (--max-streams-per-caller); \
                 close one, or read the feed as JSON pages"
            ),
        };
        ApiError::at_capacity(ProblemCode::TooManyStreams, detail, RETRY_AFTER_S)
    })
}

/// Counts an open stream, holds its place under the caps, and keeps its
/// connection busy, while it lives.
struct Open {
    metrics: SharedMetrics,
    _slot: Slot,
    _busy: Option<Box<dyn Send + Sync>>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.history_stream_closed();
    }
}

/// A stream between two events.
struct Follow {
    app: AppState,
    position: FeedPosition,
    pending: VecDeque<FeedEntry>,
    /// Set once the stream sent its last event.
    done: bool,
    _open: Open,
}

async fn stream(
    app: AppState,
    start: FeedStart,
    slot: Slot,
    keep_busy: Option<KeepBusy>,
) -> Result<Response, ApiError> {
    let (entries, position) = page(app.checked(detached(&app, start, STREAM_BATCH).await)?)?;
    app.metrics.history_stream_opened();
    let open = Open {
        metrics: app.metrics.clone(),
        _slot: slot,
        _busy: keep_busy.map(|k| k.0.hold()),
    };
    let follow = Follow {
        app,
        position,
        pending: entries.into(),
        done: false,
        _open: open,
    };
    let events = futures_util::stream::unfold(follow, Follow::next_event);
    let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE));
    // Tell nginx-like proxies not to buffer the stream.
    Ok(([("x-accel-buffering", HeaderValue::from_static("no"))], sse).into_response())
}

impl Follow {
    /// The next event, waiting for one; `None` ends the stream.
    async fn next_event(mut self) -> Option<(Result<Event, Infallible>, Self)> {
        if self.done {
            return None;
        }
        loop {
            if let Some(entry) = self.pending.pop_front() {
                let data = serde_json::to_string(&entry).unwrap_or_default();
                self.app.metrics.history_event();
                let event = Event::default().id(entry.cursor).data(data);
                return Some((Ok(event), self));
            }
            if self.app.shutting_down() {
                return None;
            }
            // Listen before reading, so that a commit between the read and
            // the wait still wakes this stream.
            let notify = self.app.store.work_notifier();
            let woken = notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let read = detached(&self.app, FeedStart::After(self.position), STREAM_BATCH).await;
            match read.map(page) {
                Ok(Ok((entries, next))) if !entries.is_empty() => {
                    self.position = next;
                    self.pending = entries.into();
                    continue;
                }
                Ok(Ok(_)) => {}
                Ok(Err(problem)) => {
                    // Retention overtook this stream: say so, and end it.
                    self.done = true;
                    let problem = serde_json::to_string(&problem.problem()).unwrap_or_default();
                    return Some((Ok(Event::default().event("error").data(problem)), self));
                }
                Err(error) => {
                    tracing::warn!(%error, "history stream: reading failed; will try again");
                }
            }
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(STREAM_POLL) => {}
                () = self.app.shutdown_signal() => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request time limit bounds the time to the response head only: a
    /// body that streams on for longer than the limit is not cut.
    #[tokio::test(start_paused = true)]
    async fn the_time_limit_does_not_cut_a_streamed_body() {
        use axum::body::{Body, Bytes};
        use tower::ServiceExt;

        let slow_body = || async {
            let chunks = futures_util::stream::unfold(0, |n| async move {
                if n == 3 {
                    return None;
                }
                tokio::time::sleep(super::super::REQUEST_TIMEOUT / 2).await;
                Some((Ok::<_, Infallible>(Bytes::from_static(b"x")), n + 1))
            });
            Body::from_stream(chunks)
        };
        let router = axum::Router::new()
            .route("/", axum::routing::get(slow_body))
            .layer(axum::middleware::from_fn(super::super::time_limit));
        let request = axum::http::Request::get("/").body(Body::empty()).unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::OK);
        let started = tokio::time::Instant::now();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(&body[..], b"xxx");
        assert!(started.elapsed() > super::super::REQUEST_TIMEOUT);
    }

    #[test]
    fn streams_are_asked_for_by_accept() {
        let mut headers = HeaderMap::new();
        assert!(!wants_stream(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!wants_stream(&headers));
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json;q=0.5, Text/Event-Stream; q=1"),
        );
        assert!(wants_stream(&headers));
    }

    #[test]
    fn last_event_id_takes_the_place_of_after() {
        let mut headers = HeaderMap::new();
        let at = |tx, id| FeedStart::After(FeedPosition { tx, id });
        assert_eq!(stream_start(&headers, Some("0-3")).unwrap(), at(0, 3));
        headers.insert("last-event-id", HeaderValue::from_static(""));
        assert_eq!(stream_start(&headers, None).unwrap(), FeedStart::Beginning);
        headers.insert("last-event-id", HeaderValue::from_static("5-9"));
        assert_eq!(stream_start(&headers, Some("0-3")).unwrap(), at(5, 9));
        headers.insert("last-event-id", HeaderValue::from_static("nine"));
        assert!(stream_start(&headers, None).is_err());
        assert_eq!(parse_start(Some("latest")).unwrap(), FeedStart::Latest);
    }
}
