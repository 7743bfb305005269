//! Groups (docs/groups.md): operators list them with their figures and set
//! each one's limits at run time.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::{GroupLimits, GroupName, Rate, UnixMs};
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::wire;
use crate::http::wire::GroupView;
use crate::store::GroupQuery;

/// Default and largest page size.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get_one, put_limits))
}

/// Page parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GroupPageQuery {
    /// 1..=1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` of the previous page: list the groups named after it.
    pub after: Option<String>,
}

/// A page of groups, by name.
#[derive(Debug, Serialize, ToSchema)]
pub struct GroupsOut {
    pub groups: Vec<GroupView>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// List the groups with their limits, depth, live leases and oldest due
/// age. Every group named by a receipt or given limits is listed (`default`
/// always), until it is forgotten while idle (`--forget-idle-groups`).
#[utoipa::path(get, path = "/v1/groups", security(("bearer" = ["reader", "operator"])), operation_id = "v1.groups.list", tag = "groups",
    params(GroupPageQuery),
    responses(
        (status = 200, description = "A page", body = GroupsOut),
        (status = 422, description = "Bad limit or cursor", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<GroupPageQuery>,
) -> Result<Json<GroupsOut>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::validation(
            ProblemCode::InvalidLimit,
            "limit must be 1..=1000",
        ));
    }
    let after = match query.after.as_deref() {
        None => String::new(),
        Some(after) => wire::parse_group(after)
            .map_err(|_| {
                ApiError::validation(
                    ProblemCode::InvalidCursor,
                    "after must be a `next` value from a previous page",
                )
            })?
            .as_str()
            .to_owned(),
    };
    let query = GroupQuery {
        limit,
        after,
        exact: false,
        depth: true,
    };
    let groups = app.store.groups(app.now(), &query).await?;
    let next = (groups.len() == limit)
        .then(|| groups.last().map(|g| g.group.clone()))
        .flatten();
    let groups = groups.into_iter().map(Into::into).collect();
    Ok(Json(GroupsOut { groups, next }))
}

/// One group with its limits and figures.
#[utoipa::path(get, path = "/v1/groups/{group}", security(("bearer" = ["reader", "operator"])), operation_id = "v1.groups.get", tag = "groups",
    params(("group" = String, Path, description = "Group name (1..=128 UTF-8 bytes, no control characters)", min_length = 1, max_length = 128)),
    responses(
        (status = 200, description = "The group", body = GroupView),
        (status = 404, description = "No receipt named this group and no limits were set on it, or it was forgotten while idle", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad group name", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_one(
    State(app): State<AppState>,
    ApiPath(group): ApiPath<String>,
) -> Result<Json<GroupView>, ApiError> {
    let group = wire::parse_group(&group)?;
    one(&app, &group, app.now()).await
}

/// One group's view at `now`.
async fn one(app: &AppState, group: &GroupName, now: UnixMs) -> Result<Json<GroupView>, ApiError> {
    app.store
        .groups(
            now,
            &GroupQuery {
                limit: 1,
                after: group.as_str().to_owned(),
                exact: true,
                depth: true,
            },
        )
        .await?
        .pop()
        .map(|group| Json(group.into()))
        .ok_or_else(|| ApiError::not_found(ProblemCode::GroupNotFound, "unknown group"))
}

/// A group's limits, as an operator sets them: each absent one is lifted.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupLimitsIn {
    /// Claim nothing from the group while true; due times are kept, so
    /// resuming needs no redrive. Default false.
    #[serde(default)]
    pub paused: bool,
    /// At most this many live leases in the group (0..=1000000000; 0 claims
    /// nothing). Absent or null: no cap.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000_000)]
    pub max_leased: Option<u64>,
    /// Claims per second as a token bucket. Absent or null: no rate limit.
    #[serde(default)]
    pub rate: Option<Rate>,
}

impl GroupLimitsIn {
    pub fn parse(self) -> Result<GroupLimits, ApiError> {
        let bad = |detail: &str| ApiError::validation(ProblemCode::InvalidGroupLimits, detail);
        if self.max_leased.is_some_and(|m| m > 1_000_000_000) {
            return Err(bad("max_leased must be 0..=1000000000"));
        }
        let rate = self
            .rate
            .map(|r| Rate::new(r.per_second, r.burst))
            .transpose()
            .map_err(bad)?;
        Ok(GroupLimits {
            paused: self.paused,
            max_leased: self.max_leased,
            rate,
        })
    }
}

/// Set a group's limits (creating the group if no receipt named it yet).
/// They hold across every replica from the next claim on; a claim that a
/// limit stops returns fewer receipts, never an error.
#[utoipa::path(put, path = "/v1/groups/{group}", security(("bearer" = ["operator"])), operation_id = "v1.groups.put", tag = "groups",
    params(("group" = String, Path, description = "Group name (1..=128 UTF-8 bytes, no control characters)", min_length = 1, max_length = 128)),
    request_body = GroupLimitsIn,
    responses(
        (status = 200, description = "The group with its new limits", body = GroupView),
        (status = 422, description = "Bad group name or limits", body = Problem, content_type = "application/problem+json"),
    ))]
async fn put_limits(
    State(app): State<AppState>,
    ApiPath(group): ApiPath<String>,
    ApiJson(body): ApiJson<GroupLimitsIn>,
) -> Result<Json<GroupView>, ApiError> {
    let group = wire::parse_group(&group)?;
    let limits = body.parse()?;
    let now = app.now();
    app.store.set_group(&group, &limits, now).await?;
    one(&app, &group, now).await
}
