//! Operators and readers find receipts by state, failure, lease owner, id
//! prefix and time ranges, a page at a time (docs/operators.md, "Find
//! receipts").

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::{
    IdError, ReceiptId, SettlementClaimValidationError, SettlementFailureCode, WorkerId,
    check_id_text,
};
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::ApiQuery;
use crate::http::wire::{FoundReceipt, SearchOrder, StateFilter};
use crate::store::search::{Range, SearchKey};
use crate::store::{self, ReceiptFilter, SearchPage};

/// Default and largest page size.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(find))
}

/// Filters and paging. Every filter given must hold; unknown parameters are refused.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FindQuery {
    /// `pending` (never attempted, not leased: due now or scheduled),
    /// `scheduled` (the pending ones not due yet), `leased`,
    /// `retry_scheduled`, `settled`, `skipped`, `dead_lettered` or `canceled`.
    pub state: Option<StateFilter>,
    /// The last failure's code.
    pub code: Option<SettlementFailureCode>,
    /// The worker holding a live lease (so only leased receipts match).
    #[param(min_length = 1, max_length = 128)]
    pub owner: Option<String>,
    /// Receipt ids starting with these bytes (no control characters).
    #[param(min_length = 1, max_length = 512)]
    pub prefix: Option<String>,
    /// `finalized_at` at or after (Unix seconds).
    pub finalized_from: Option<u64>,
    /// `finalized_at` before (Unix seconds).
    pub finalized_to: Option<u64>,
    /// Finished (settled, skipped, dead-lettered, canceled) at or after (server ms).
    pub finished_from_ms: Option<u64>,
    /// Finished before (server ms).
    pub finished_to_ms: Option<u64>,
    /// `true`: only receipts an operator holds; `false`: only those not held.
    pub held: Option<bool>,
    /// Only receipts of this group (docs/groups.md).
    #[param(min_length = 1, max_length = 128)]
    pub group: Option<String>,
    /// Only receipts of this priority (-1000..=1000).
    #[param(minimum = -1000, maximum = 1000)]
    pub priority: Option<i64>,
    /// The last failure's rail code, e.g. `card_declined` (1..=64
    /// characters of `[A-Za-z0-9_.:-]`).
    #[param(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.:-]{1,64}$")]
    pub rail_code: Option<String>,
    /// `newest` (default) or `oldest` `finalized_at` first.
    pub order: Option<SearchOrder>,
    /// Receipts per page: 1..=500, default 50.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page, with the same filters and order.
    pub cursor: Option<String>,
}

/// The filters of `GET /v1/receipts`, as a JSON object: which receipts a
/// bulk action selects.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterIn {
    pub state: Option<StateFilter>,
    pub code: Option<SettlementFailureCode>,
    pub owner: Option<String>,
    pub prefix: Option<String>,
    pub finalized_from: Option<u64>,
    pub finalized_to: Option<u64>,
    pub finished_from_ms: Option<u64>,
    pub finished_to_ms: Option<u64>,
    pub held: Option<bool>,
    pub group: Option<String>,
    pub priority: Option<i64>,
    pub rail_code: Option<String>,
}

/// A page of receipts.
#[derive(Debug, Serialize, ToSchema)]
pub struct FoundReceipts {
    pub receipts: Vec<FoundReceipt>,
    /// Pass as `cursor` for the next page; null only when no match is left.
    /// A page may hold fewer than `limit` receipts (even none) while this is
    /// set: each page examines a bounded number of receipts.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

fn invalid(detail: impl Into<String>) -> ApiError {
    ApiError::validation(ProblemCode::InvalidQuery, detail)
}

fn range(from: Option<u64>, to: Option<u64>, names: (&str, &str)) -> Result<Range, ApiError> {
    for (value, name) in [(from, names.0), (to, names.1)] {
        if value.is_some_and(|v| i64::try_from(v).is_err()) {
            return Err(invalid(format!("{name} must be at most {}", i64::MAX)));
        }
    }
    let range = Range { from, to };
    if range.is_inverted() {
        return Err(invalid(format!(
            "{} must be less than {} (from is inclusive, to exclusive)",
            names.0, names.1
        )));
    }
    Ok(range)
}

impl FilterIn {
    /// The filter, refusing every bad value as `GET /v1/receipts` refuses it.
    pub fn parse(self) -> Result<ReceiptFilter, ApiError> {
        let owner = self
            .owner
            .as_deref()
            .map(WorkerId::parse)
            .transpose()
            .map_err(|e| match e {
                SettlementClaimValidationError::WorkerIdText => ApiError::validation(
                    ProblemCode::InvalidWorkerId,
                    "owner must not contain control characters",
                ),
                _ => {
                    ApiError::validation(ProblemCode::WorkerIdLength, "owner must be 1..=128 bytes")
                }
            })?;
        // A prefix of ids, not an id: `.` is a fine start of one.
        let prefix = self
            .prefix
            .as_deref()
            .map(|p| check_id_text(p).map(|()| p.to_owned()))
            .transpose()
            .map_err(|e: IdError| ApiError::bad_id(ProblemCode::InvalidReceiptId, "prefix", e))?;
        Ok(ReceiptFilter {
            state: self.state.map(Into::into),
            code: self.code,
            owner,
            prefix,
            finalized: range(
                self.finalized_from,
                self.finalized_to,
                ("finalized_from", "finalized_to"),
            )?,
            finished_ms: range(
                self.finished_from_ms,
                self.finished_to_ms,
                ("finished_from_ms", "finished_to_ms"),
            )?,
            held: self.held,
            group: self
                .group
                .as_deref()
                .map(crate::http::wire::parse_group)
                .transpose()?
                .map(|g| g.as_str().to_owned()),
            priority: self
                .priority
                .map(crate::http::wire::parse_priority)
                .transpose()?,
            rail_code: self
                .rail_code
                .as_deref()
                .map(crate::http::wire::parse_rail_code)
                .transpose()?,
        })
    }
}

impl FindQuery {
    /// The filter, refusing every bad value: the query's filters read as a
    /// bulk action's `filter` is.
    pub fn filter(&self) -> Result<ReceiptFilter, ApiError> {
        FilterIn {
            state: self.state,
            code: self.code,
            owner: self.owner.clone(),
            prefix: self.prefix.clone(),
            finalized_from: self.finalized_from,
            finalized_to: self.finalized_to,
            finished_from_ms: self.finished_from_ms,
            finished_to_ms: self.finished_to_ms,
            held: self.held,
            group: self.group.clone(),
            priority: self.priority,
            rail_code: self.rail_code.clone(),
        }
        .parse()
    }

    /// The page, refusing a bad limit or a cursor of another query.
    pub fn page(&self, filter: &ReceiptFilter) -> Result<SearchPage, ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::validation(
                ProblemCode::InvalidLimit,
                "limit must be 1..=500",
            ));
        }
        let order = self.order.unwrap_or_default().into();
        let after = self
            .cursor
            .as_deref()
            .map(|c| decode_cursor(c, filter, order))
            .transpose()?;
        Ok(SearchPage {
            order,
            limit,
            after,
        })
    }
}

/// What a cursor is bound to: the filter and the order, hashed.
fn fingerprint(filter: &ReceiptFilter, order: store::SearchOrder) -> String {
    let order = match order {
        store::SearchOrder::Newest => "newest",
        store::SearchOrder::Oldest => "oldest",
    };
    let digest = Sha256::digest(format!("{};order={order}", filter.canonical()));
    hex::encode(&digest[..8])
}

/// `FINALIZED_AT.HEX_ID.FINGERPRINT`: opaque to clients.
fn encode_cursor(key: &SearchKey, filter: &ReceiptFilter, order: store::SearchOrder) -> String {
    format!(
        "{}.{}.{}",
        key.finalized_at,
        hex::encode(&key.receipt_id),
        fingerprint(filter, order)
    )
}

fn decode_cursor(
    text: &str,
    filter: &ReceiptFilter,
    order: store::SearchOrder,
) -> Result<SearchKey, ApiError> {
    let bad = || {
        ApiError::validation(
            ProblemCode::InvalidCursor,
            "cursor must be a `next_cursor` value from a previous page",
        )
    };
    let mut parts = text.split('.');
    let (Some(at), Some(id), Some(print), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let finalized_at: u64 = at.parse().map_err(|_| bad())?;
    if i64::try_from(finalized_at).is_err() {
        return Err(bad());
    }
    let id = String::from_utf8(hex::decode(id).map_err(|_| bad())?).map_err(|_| bad())?;
    let receipt_id = ReceiptId::parse(&id).map_err(|_| bad())?;
    if print != fingerprint(filter, order) {
        return Err(ApiError::validation(
            ProblemCode::InvalidCursor,
            "this cursor belongs to a query with other filters or another order: send it with \
             the same filters and order as the page it came from, or start again without it",
        ));
    }
    Ok(SearchKey {
        finalized_at,
        receipt_id: receipt_id.as_str().to_owned(),
    })
}

/// Find receipts: newest (or oldest) `finalized_at` first, a page at a time.
///
/// Each page examines a bounded number of receipts, so it costs the same
/// however many are stored; a page may therefore hold fewer than `limit`
/// receipts, even none, while `next_cursor` is set. Follow `next_cursor`
/// until it is null. A leased receipt shows its owner and deadline, never
/// its token.
#[utoipa::path(get, path = "/v1/receipts", security(("bearer" = ["reader", "operator"])), operation_id = "v1.receipts.find", tag = "receipts",
    params(FindQuery),
    responses(
        (status = 200, description = "A page", body = FoundReceipts),
        (status = 422, description = "Unknown parameter, bad value, inverted range, bad limit, or a cursor of another query", body = Problem, content_type = "application/problem+json"),
    ))]
async fn find(
    State(app): State<AppState>,
    ApiQuery(query): ApiQuery<FindQuery>,
) -> Result<Json<FoundReceipts>, ApiError> {
    let filter = query.filter()?;
    let page = query.page(&filter)?;
    let found = app.store.find_receipts(&filter, &page, app.now()).await?;
    let next_cursor = found
        .next
        .map(|key| encode_cursor(&key, &filter, page.order));
    Ok(Json(FoundReceipts {
        receipts: found.receipts.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_other_queries() {
        let filter = ReceiptFilter {
            state: Some(store::search::StateFilter::Pending),
            ..ReceiptFilter::default()
        };
        let key = SearchKey {
            finalized_at: 7,
            receipt_id: "a.b/é%2F".into(),
        };
        let cursor = encode_cursor(&key, &filter, store::SearchOrder::Newest);
        assert_eq!(
            decode_cursor(&cursor, &filter, store::SearchOrder::Newest).unwrap(),
            key
        );
        assert!(decode_cursor(&cursor, &filter, store::SearchOrder::Oldest).is_err());
        let other = ReceiptFilter {
            state: Some(store::search::StateFilter::Scheduled),
            ..ReceiptFilter::default()
        };
        assert!(decode_cursor(&cursor, &other, store::SearchOrder::Newest).is_err());
        for bad in ["", "garbage", "1.zz.00", "1.61", "1.00.x.y"] {
            assert!(decode_cursor(bad, &filter, store::SearchOrder::Newest).is_err());
        }
    }
}
