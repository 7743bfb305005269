//! `POST /v1/bulk/{action}`: redrive, hold, unhold or cancel many receipts
//! at once, named or selected by a filter, in transactions of up to 500
//! (docs/operators.md, "Act on many receipts").

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::domain::{ReceiptId, UnixMs};
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::middleware::auth::Caller;
use crate::http::routes::actions::{actor, parse_reason, refusal};
use crate::http::routes::receipts::search::FilterIn;
use crate::http::wire;
use crate::store::search::SCAN_BUDGET;
use crate::store::{Acted, ActionResult, OperatorAction, ReceiptFilter, SearchOrder, SearchPage};

/// Most receipts one bulk request names.
pub const MAX_BULK_IDS: usize = 1000;
/// Receipts per transaction of a bulk action: short transactions, so that
/// claims and outcomes never wait long behind one (tens of ms), yet few
/// enough commits that 10 000 receipts finish in seconds beside busy
/// workers (100 per transaction would take about 26 s there; 500 take 4 s).
const CHUNK: usize = 500;
/// A bulk action starts no chunk after this long, well within the request
/// time limit: what it did is answered, never cut off.
const BULK_BUDGET: std::time::Duration = std::time::Duration::from_secs(15);
/// Receipt ids a dry run shows.
const SAMPLE: usize = 20;
/// Most receipts a filter may select for one bulk action.
pub const MAX_SELECTED: usize = 10_000;
/// Most pages of `GET /v1/receipts` a selection reads.
const MAX_SELECT_PAGES: usize = 200;

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(bulk))
}

/// A bulk action: which receipts, and how careful to be.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkIn {
    /// The receipts to act on: 1..=1000 ids, each judged on its own. Give
    /// either this or `filter`.
    pub receipt_ids: Option<Vec<String>>,
    /// Select the receipts with the filters of `GET /v1/receipts` instead
    /// (at most 10 000; `expect_count` is then required, except in a dry run).
    pub filter: Option<FilterIn>,
    /// Judge every receipt and report what would happen, changing nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// The number of receipts the operator expects to act on (as a dry run
    /// reported it); a selection of any other size is refused (409
    /// `count_mismatch`) with nothing changed.
    pub expect_count: Option<u64>,
    /// For `hold` (optional) and `cancel` (required): recorded in history.
    pub reason: Option<String>,
}

/// What a bulk action did, or in a dry run would do, to one receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkItemStatus {
    /// Changed (in a dry run: would be), with a history entry.
    Done,
    /// Already so: nothing written.
    Unchanged,
    /// Refused: see `error`; nothing changed.
    Refused,
}

/// One receipt of a bulk action.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkItem {
    pub receipt_id: String,
    pub status: BulkItemStatus,
    /// Why it was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Problem>,
}

/// The outcome of a bulk action, item by item in the order given.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkOut {
    pub action: BulkAction,
    pub dry_run: bool,
    /// How many receipts were named or selected.
    pub matched: u64,
    pub done: u64,
    pub unchanged: u64,
    pub refused: u64,
    /// Every receipt's result (a dry run: what would happen).
    pub results: Vec<BulkItem>,
    /// A dry run only: up to 20 of the receipts that would change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<Vec<String>>,
    /// Whether every receipt matched was judged. `false` when the action
    /// stopped part-way (its 15 s time budget ran out, or the database
    /// failed after some receipts were done): `results` holds the receipts
    /// done, in order, and `remaining_receipt_ids` the others.
    pub complete: bool,
    /// When not complete: the receipts not reached, in order. Send them as
    /// `receipt_ids` (up to 1000 at a time) to finish the action.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_receipt_ids: Option<Vec<String>>,
    /// When not complete: why it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Problem>,
}

/// The operator actions a bulk request can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    Redrive,
    Hold,
    Unhold,
    Cancel,
}

impl BulkAction {
    fn parse(text: &str) -> Result<Self, ApiError> {
        serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|_| {
            ApiError::not_found(
                ProblemCode::NotFound,
                "no such action: use redrive, hold, unhold or cancel",
            )
        })
    }

    fn with(self, reason: Option<String>) -> Result<OperatorAction, ApiError> {
        Ok(match self {
            Self::Redrive | Self::Unhold if reason.is_some() => {
                return Err(ApiError::validation(
                    ProblemCode::InvalidReason,
                    "only hold and cancel take a reason",
                ));
            }
            Self::Redrive => OperatorAction::Redrive,
            Self::Unhold => OperatorAction::Unhold,
            Self::Hold => OperatorAction::Hold {
                reason: parse_reason(reason, false)?,
            },
            Self::Cancel => OperatorAction::Cancel {
                reason: parse_reason(reason, true)?.unwrap_or_default(),
            },
        })
    }
}

/// Redrive, hold, unhold or cancel many receipts at once.
///
/// The receipts are named (`receipt_ids`, up to 1000) or selected with the
/// filters of `GET /v1/receipts` (`filter`, up to 10 000, oldest first).
/// Every receipt is judged on its own, as the single-receipt action would
/// judge it, and answered item by item. The receipts are changed in
/// transactions of up to 500: a crash part-way leaves each receipt either
/// changed, with its history entry, or untouched, and a request repeated
/// after it finds the changed ones `unchanged` (hold, unhold) or refused
/// (redrive, cancel), never changed twice. Use `dry_run` first to see what
/// would happen, and `expect_count` so that a list other than the one
/// reviewed is refused.
#[utoipa::path(post, path = "/v1/bulk/{action}", security(("bearer" = ["operator"])), operation_id = "v1.bulk.act", tag = "operator actions",
    params(("action" = BulkAction, Path, description = "redrive, hold, unhold or cancel")),
    request_body = BulkIn,
    responses(
        (status = 200, description = "Each receipt's result", body = BulkOut),
        (status = 404, description = "No such action", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`expect_count` differs (`count_mismatch`); nothing changed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid ids, filter, size or reason; a filter selecting too much (`selection_too_large`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn bulk(
    State(app): State<AppState>,
    caller: Option<Extension<Caller>>,
    ApiPath(action): ApiPath<String>,
    ApiJson(body): ApiJson<BulkIn>,
) -> Result<Json<BulkOut>, ApiError> {
    let started = std::time::Instant::now();
    let kind = BulkAction::parse(&action)?;
    let action = kind.with(body.reason)?;
    let now = app.now();
    let ids = match (body.receipt_ids, body.filter) {
        (Some(ids), None) => named(&ids)?,
        (None, Some(filter)) => {
            if body.expect_count.is_none() && !body.dry_run {
                return Err(ApiError::validation(
                    ProblemCode::InvalidBody,
                    "a filter needs expect_count: run it with dry_run first and send the count \
                     it reported",
                ));
            }
            select(&app, &filter.parse()?, now).await?
        }
        _ => {
            return Err(ApiError::validation(
                ProblemCode::InvalidBody,
                "give either receipt_ids or filter",
            ));
        }
    };
    let matched = ids.len() as u64;
    if let Some(expected) = body.expect_count.filter(|n| *n != matched) {
        return Err(ApiError::conflict(
            ProblemCode::CountMismatch,
            format!(
                "{matched} receipts were selected, not the {expected} expected; nothing changed"
            ),
        ));
    }
    let mut results: Vec<ActionResult> = Vec::with_capacity(ids.len());
    let mut stopped = None;
    for chunk in ids.chunks(CHUNK) {
        if !results.is_empty() && started.elapsed() >= BULK_BUDGET {
            stopped = Some(ApiError::at_capacity(
                ProblemCode::BulkIncomplete,
                format!(
                    "the action stopped after {} of {} receipts, at its time limit of {} s; \
                     send remaining_receipt_ids to finish it",
                    results.len(),
                    ids.len(),
                    BULK_BUDGET.as_secs()
                ),
                0,
            ));
            break;
        }
        // Each chunk is stamped with the time it commits: its history
        // entries, `held_at_ms` and `finished_at_ms` keep commit order with
        // the rest of each receipt's history.
        let now = app.now();
        match app.checked(
            app.store
                .act(&action, chunk, actor(caller.as_ref()), now, body.dry_run)
                .await,
        ) {
            Ok(acted) => results.extend(acted),
            // Nothing done yet: the failure is the answer.
            Err(error) if results.is_empty() => return Err(error),
            // Part done: the answer says what, and why it stopped.
            Err(error) => {
                stopped = Some(error);
                break;
            }
        }
    }
    if !body.dry_run {
        for result in &results {
            app.metrics.acted(action.name(), result);
        }
    }
    let mut out = summarize(kind, body.dry_run, &ids, results);
    if let Some(stopped) = stopped {
        tracing::warn!(action = action.name(), done = out.results.len(), of = ids.len(), reason = %stopped.problem().detail, "bulk action stopped part-way");
        out.complete = false;
        out.remaining_receipt_ids = Some(
            ids[out.results.len()..]
                .iter()
                .map(|id| id.as_str().to_owned())
                .collect(),
        );
        out.stopped = Some(stopped.problem());
    }
    Ok(Json(out))
}

/// The receipts named, parsed.
fn named(ids: &[String]) -> Result<Vec<ReceiptId>, ApiError> {
    if ids.is_empty() || ids.len() > MAX_BULK_IDS {
        return Err(ApiError::validation(
            ProblemCode::BatchSize,
            "receipt_ids must hold 1..=1000 ids",
        ));
    }
    ids.iter().map(|id| wire::parse_receipt_id(id)).collect()
}

/// The receipts `filter` selects at `now`, oldest first, read page by page
/// (each page a bounded read): at most [`MAX_SELECTED`], and at most
/// [`MAX_SELECT_PAGES`] pages, so that a filter that must examine most of a
/// large table is refused rather than left running.
async fn select(
    app: &AppState,
    filter: &ReceiptFilter,
    now: UnixMs,
) -> Result<Vec<ReceiptId>, ApiError> {
    let mut ids = Vec::new();
    let mut page = SearchPage {
        order: SearchOrder::Oldest,
        limit: 500,
        after: None,
    };
    for _ in 0..MAX_SELECT_PAGES {
        let found = app.store.find_receipts(filter, &page, now).await?;
        for receipt in found.receipts {
            ids.push(ReceiptId::from_stored(receipt.receipt_id));
        }
        if ids.len() > MAX_SELECTED {
            return Err(too_broad(format!(
                "the filter selects more than {MAX_SELECTED} receipts: narrow it (state, code, \
                 a finalized range) and act in parts"
            )));
        }
        match found.next {
            None => return Ok(ids),
            Some(next) => page.after = Some(next),
        }
    }
    Err(too_broad(format!(
        "the filter examined {} receipts without reaching the end: narrow it with state, code \
         or a finalized range",
        MAX_SELECT_PAGES * SCAN_BUDGET
    )))
}

fn too_broad(detail: String) -> ApiError {
    ApiError::validation(ProblemCode::SelectionTooLarge, detail)
}

fn summarize(
    action: BulkAction,
    dry_run: bool,
    ids: &[ReceiptId],
    results: Vec<ActionResult>,
) -> BulkOut {
    let items: Vec<BulkItem> = ids
        .iter()
        .zip(results)
        .map(|(id, result)| {
            let (status, error) = match result {
                Ok(Acted::Done) => (BulkItemStatus::Done, None),
                Ok(Acted::Unchanged) => (BulkItemStatus::Unchanged, None),
                Err(refused) => (BulkItemStatus::Refused, Some(refusal(refused).problem())),
            };
            BulkItem {
                receipt_id: id.as_str().to_owned(),
                status,
                error,
            }
        })
        .collect();
    let count = |s: BulkItemStatus| items.iter().filter(|i| i.status == s).count() as u64;
    let sample = dry_run.then(|| {
        items
            .iter()
            .filter(|i| i.status == BulkItemStatus::Done)
            .take(SAMPLE)
            .map(|i| i.receipt_id.clone())
            .collect()
    });
    BulkOut {
        action,
        dry_run,
        matched: ids.len() as u64,
        done: count(BulkItemStatus::Done),
        unchanged: count(BulkItemStatus::Unchanged),
        refused: count(BulkItemStatus::Refused),
        results: items,
        sample,
        complete: true,
        remaining_receipt_ids: None,
        stopped: None,
    }
}
