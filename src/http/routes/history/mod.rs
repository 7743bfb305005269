//! `GET /v1/history`: every history entry in commit order after a cursor,
//! as JSON pages or as a live `text/event-stream` (docs/operators.md,
//! "Follow every outcome: the history feed"). The stream is `stream`.

mod stream;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::StoreError;
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::ApiQuery;
use crate::http::middleware::auth::Caller;
use crate::http::wire::FeedEntry;
use crate::store::{self, FeedPosition, FeedRead, FeedStart, StoreResult};
pub use stream::{Hold, KeepBusy};
use stream::{admit, stream, stream_start, wants_stream};

/// Default and largest page size.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
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
fn page(read: FeedRead) -> Result<(Vec<store::FeedEntry>, FeedPosition), ApiError> {
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
        entries: entries.into_iter().map(Into::into).collect(),
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
