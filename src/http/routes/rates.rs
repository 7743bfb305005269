//! `GET /v1/stats`: rates over the last hour (docs/operators.md, "Rates over
//! the last hour"), from the counts every server adds to the database
//! (`rate_counts`).

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::UnixMs;
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::ApiQuery;
use crate::http::rate_counts::flush;
use crate::http::wire::StatsCounts;
use crate::store::{STATS_MINUTE_MS, minute_of};

/// Minutes served: the last hour.
pub const MAX_MINUTES: u64 = 60;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stats))
}

/// Stats parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// Minutes to return, ending with the current one: 1..=60, default 60.
    #[param(minimum = 1, maximum = 60)]
    pub minutes: Option<u64>,
}

/// One minute of the series.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsMinuteOut {
    /// Start of the minute (server ms, a multiple of 60000).
    pub start_ms: u64,
    #[serde(flatten)]
    pub counts: StatsCounts,
    /// Active receipts (pending, leased, retry scheduled) at the last sample
    /// taken in this minute; null when no server took one (none running).
    #[schema(required = true)]
    pub depth: Option<u64>,
}

/// Per-minute counts, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsOut {
    /// Length of each entry: 60000.
    pub minute_ms: u64,
    /// The server clock when the series was read; the last entry is the
    /// current minute, counted up to about now.
    pub now_ms: u64,
    /// One entry per minute, oldest first, the current (partial) minute
    /// last; a minute nothing was counted in has zero counts.
    pub minutes: Vec<StatsMinuteOut>,
}

/// Rates over the last hour, summed over every server of this database.
///
/// Counts of this server are current; those of other servers of the same
/// database may lag by a few seconds (they add theirs every 2 s).
#[utoipa::path(get, path = "/v1/stats", security(("bearer" = ["reader", "operator"])), operation_id = "v1.stats.get", tag = "operations",
    params(StatsQuery),
    responses(
        (status = 200, description = "The series", body = StatsOut),
        (status = 422, description = "Bad `minutes`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn stats(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<StatsQuery>,
) -> Result<Json<StatsOut>, ApiError> {
    let count = query.minutes.unwrap_or(MAX_MINUTES);
    if count == 0 || count > MAX_MINUTES {
        return Err(ApiError::validation(
            ProblemCode::InvalidQuery,
            "minutes must be 1..=60",
        ));
    }
    // This server's own counts first; a failure leaves them for the next
    // flush and shows in the read below.
    let _ = flush(&app).await;
    let now = app.now();
    let end = minute_of(now.get()) + STATS_MINUTE_MS;
    let start = end.saturating_sub(count * STATS_MINUTE_MS);
    let stored = app
        .store
        .stats(UnixMs::saturating(start), UnixMs::saturating(end))
        .await?;
    let mut stored = stored.into_iter().peekable();
    let minutes = (start..end)
        .step_by(STATS_MINUTE_MS as usize)
        .map(|start_ms| {
            while stored.next_if(|m| m.minute_ms < start_ms).is_some() {}
            let row = stored.next_if(|m| m.minute_ms == start_ms);
            StatsMinuteOut {
                start_ms,
                counts: row.map(|m| StatsCounts::from(m.counts)).unwrap_or_default(),
                depth: row.and_then(|m| m.depth),
            }
        })
        .collect();
    Ok(Json(StatsOut {
        minute_ms: STATS_MINUTE_MS,
        now_ms: now.get(),
        minutes,
    }))
}
