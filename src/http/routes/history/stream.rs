//! The live `text/event-stream` of `GET /v1/history`.
//!
//! A stream answers its first read before it starts, so a bad or expired
//! cursor and an unreachable database are problem+json like any error. Then
//! it reads on from the last entry it sent, waking on the store's work
//! notifier and at least every [`STREAM_POLL`] (entries written by another
//! replica, or by an outcome that made no work due, wake nothing here), and
//! ends when the server shuts down. The request time limit
//! (`middleware::time_limit`) bounds only the time to the response head, and
//! the compression layer leaves `text/event-stream` alone, so neither cuts or
//! holds back the stream; the connection counts as busy while it streams, so
//! the idle timeout and the connection cap leave it open too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use super::{detached, page, parse_start};
use crate::http::AppState;
use crate::http::error::{ApiError, ProblemCode};
use crate::http::middleware::auth::Caller;
use crate::http::middleware::metrics::SharedMetrics;
use crate::http::middleware::stream_cap::{RETRY_AFTER_S, Refused, Slot};
use crate::http::wire::FeedEntry;
use crate::store::{self, FeedPosition, FeedStart};

/// Entries a stream reads per store call.
const STREAM_BATCH: usize = 500;
/// Longest an idle stream waits before looking for new entries again.
pub const STREAM_POLL: Duration = Duration::from_millis(500);
/// How often an idle stream sends a comment, so that proxies keep it open.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

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

/// Whether the client asked for `text/event-stream`.
pub fn wants_stream(headers: &HeaderMap) -> bool {
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
pub fn stream_start(headers: &HeaderMap, after: Option<&str>) -> Result<FeedStart, ApiError> {
    match headers.get("last-event-id") {
        Some(value) if !value.is_empty() => parse_start(Some(value.to_str().map_err(|_| {
            ApiError::validation(ProblemCode::InvalidCursor, "Last-Event-ID is not a cursor")
        })?)),
        _ => parse_start(after),
    }
}

/// A place for one more stream under the caps, or the 429 that refuses it.
pub fn admit(app: &AppState, caller: Option<&Caller>) -> Result<Slot, ApiError> {
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
    pending: VecDeque<store::FeedEntry>,
    /// Set once the stream sent its last event.
    done: bool,
    _open: Open,
}

pub async fn stream(
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
                let entry = FeedEntry::from(entry);
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
                tokio::time::sleep(crate::http::REQUEST_TIMEOUT / 2).await;
                Some((Ok::<_, Infallible>(Bytes::from_static(b"x")), n + 1))
            });
            Body::from_stream(chunks)
        };
        let router = axum::Router::new()
            .route("/", axum::routing::get(slow_body))
            .layer(axum::middleware::from_fn(
                crate::http::middleware::time_limit,
            ));
        let request = axum::http::Request::get("/").body(Body::empty()).unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::OK);
        let started = tokio::time::Instant::now();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(&body[..], b"xxx");
        assert!(started.elapsed() > crate::http::REQUEST_TIMEOUT);
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
