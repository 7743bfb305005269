//! Workers claim due receipts under a lease: a batch (optionally waiting for
//! work) or one receipt by id.

use std::pin::Pin;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::{Notify, futures::Notified};
use tokio::time::Instant;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::outcomes::Parsed;
use crate::domain::{ClaimLimit, Claimed, GroupName, LeaseMs, WorkerId};
use crate::http::AppState;
use crate::http::error::{ApiError, Problem, ProblemCode};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::long_polls::FALLBACK_POLL;
use crate::http::middleware::metrics::ClaimResult;
use crate::http::middleware::spans;
use crate::http::wire::{
    self, ClaimBody, MAX_BATCH_ITEMS, MAX_WAIT_MS, OutcomeRequest, OutcomeResult,
};
use crate::store::{ClaimAsk, DueClaims, ReceiptClaim};

/// Routes of this module.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(claim_batch))
        .routes(routes!(claim_one))
}

/// Claim parameters for a batch.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimsIn {
    /// Who claims: 1..=128 UTF-8 bytes, no control characters. Becomes the
    /// claim's `lease_owner`.
    #[schema(min_length = 1, max_length = 128)]
    pub worker_id: String,
    /// How long the lease lasts: 1..=86400000 ms.
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub lease_ms: u64,
    /// The most receipts to claim, 1..=1024. Required, there is no default:
    /// ask for what this worker can settle within one lease (1 claims one
    /// receipt at a time).
    #[schema(minimum = 1, maximum = 1024)]
    pub limit: usize,
    /// 0..=20000: wait up to this long for work when none is due (0 or absent: no wait).
    #[serde(default)]
    #[schema(maximum = 20_000)]
    pub wait_ms: Option<u64>,
    /// Claim only from these groups (1..=100 names; absent: every group).
    #[serde(default)]
    #[schema(min_items = 1, max_items = 100)]
    pub groups: Option<Vec<String>>,
    /// Outcomes of this worker's earlier claims, recorded before it claims
    /// (0..=1024 items): each judged on its own exactly as
    /// `POST /v1/outcomes` judges it, all of them in one durable commit,
    /// answered in `results`. A worker reports what it finished and asks for
    /// more work in one round trip.
    #[serde(default)]
    #[schema(value_type = Option<Vec<OutcomeRequest>>, max_items = 1024)]
    pub outcomes: Option<Vec<Box<RawValue>>>,
}

/// Most groups one claim may name.
const MAX_CLAIM_GROUPS: usize = 100;

/// Claimed receipts, spread over the groups with due work round robin
/// (each group's oldest due first); empty when nothing is due.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimsOut {
    pub claims: Vec<ClaimBody>,
    /// Present when a group's rate limit held due work back: a claim after
    /// this many ms may get more (a long poll waits for it itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub look_again_ms: Option<u64>,
    /// One result per item of the request's `outcomes`, in order, as
    /// `POST /v1/outcomes` answers them; present when the request had
    /// `outcomes`. The outcomes are recorded before the claim is made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<OutcomeResult>>,
    /// Why the claim failed after the request's `outcomes` were recorded
    /// (`claims` is then empty): the `results` stand, and a new claim may
    /// be made at once. Without `outcomes` a failed claim is the request's
    /// error status instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_error: Option<Problem>,
}

/// Claim up to `limit` due receipts, after recording the outcomes sent along.
///
/// With `wait_ms` the call waits up to that long (counted from its arrival,
/// recording its `outcomes` included) and returns as soon as it has claimed
/// something; it is woken when work is enqueued, released or redriven.
///
/// With `outcomes` the request first records them as `POST /v1/outcomes`
/// does, then claims. Anything malformed in the claim's own fields is a
/// 422 that records nothing. A claim that fails once the outcomes are
/// recorded answers 200 with `results` and `claim_error`; an error status
/// means nothing was recorded (unless the answer was lost at the commit).
/// The store may make the outcomes and the claim one transaction
/// (PostgreSQL does), never letting a failed claim undo the outcomes. A request sent
/// again after its answer was lost records nothing twice: each outcome
/// already recorded is refused on its own (409 `receipt_finished`,
/// `receipt_not_leased` for a retry already scheduled, or `lease_conflict`
/// once the receipt was claimed again; the same `dead_lettered` route for a
/// dead letter) and `GET /v1/receipts/{id}` shows what was recorded.
#[utoipa::path(post, path = "/v1/claims", security(("bearer" = ["worker", "operator"])), operation_id = "v1.claims.create", tag = "claims",
    request_body = ClaimsIn,
    responses(
        (status = 200, description = "Claims, possibly none", body = ClaimsOut),
        (status = 422, description = "A bound is broken", body = Problem, content_type = "application/problem+json"),
    ))]
async fn claim_batch(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<ClaimsIn>,
) -> Result<Json<ClaimsOut>, ApiError> {
    // The wait counts from the request, the outcomes' recording included,
    // so that the whole call stays within its promised bound.
    let arrived = Instant::now();
    let worker = wire::parse_worker_id(&body.worker_id)?;
    let lease = LeaseMs::try_from(body.lease_ms)?;
    let limit = ClaimLimit::try_from(body.limit)?;
    let wait_ms = body.wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(ApiError::validation(
            ProblemCode::InvalidWaitMs,
            "wait_ms must be 0..=20000",
        ));
    }
    let only = match body.groups {
        None => Vec::new(),
        Some(names) if names.is_empty() || names.len() > MAX_CLAIM_GROUPS => {
            return Err(ApiError::validation(
                ProblemCode::InvalidGroup,
                "groups must name 1..=100 groups",
            ));
        }
        Some(names) => names
            .iter()
            .map(|g| wire::parse_group(g))
            .collect::<Result<Vec<_>, _>>()?,
    };
    if let Some(items) = &body.outcomes
        && items.len() > MAX_BATCH_ITEMS
    {
        return Err(ApiError::validation(
            ProblemCode::BatchSize,
            "outcomes holds 0..=1024 items",
        ));
    }
    // The outcomes and the first look, as one store call (one transaction
    // where the store can); any later look of a long poll claims alone.
    let notifier = app.store.work_notifier();
    let (results, first) = match body.outcomes.map(Parsed::of) {
        Some(parsed) if !parsed.pairs.is_empty() => {
            let wake_up = armed(&notifier);
            let started = Instant::now();
            let ask = ClaimAsk {
                worker_id: &worker,
                now_ms: app.now(),
                lease_ms: lease,
                limit,
                only: &only,
            };
            let reported = app
                .store
                .record_and_claim(&parsed.pairs, app.policy, ask)
                .await?;
            let first = reported.claimed.map(|due| Looked {
                started,
                due,
                wake_up,
            });
            (Some(parsed.answer(&app, reported.results)), Some(first))
        }
        Some(parsed) => (Some(parsed.answer(&app, Vec::new())), None),
        None => (None, None),
    };
    let deadline = arrived + Duration::from_millis(wait_ms);
    let claimed = match first {
        Some(Err(e)) => Err(e.into()),
        first => {
            let ask = (lease, limit, &only[..]);
            let first = first.and_then(Result::ok);
            claim_waiting(&app, &notifier, &worker, ask, deadline, first).await
        }
    };
    if claimed.is_err() {
        app.metrics.claim_request(ClaimResult::Failed);
    }
    let (due, claim_error) = match claimed {
        Ok(due) => (due, None),
        Err(e) if results.is_some() => {
            let problem = e.problem();
            tracing::warn!(code = ?problem.code, detail = %problem.detail,
                "a claim failed after the outcomes sent with it were recorded");
            (DueClaims::default(), Some(problem))
        }
        Err(e) => return Err(e),
    };
    Ok(Json(ClaimsOut {
        claims: due.claims.into_iter().map(ClaimBody::from).collect(),
        look_again_ms: due.look_again_ms,
        results,
        claim_error,
    }))
}

/// A registration for wake-ups, made before a look so that work made due
/// between the look and the wait is not missed.
fn armed(notifier: &Notify) -> Pin<Box<Notified<'_>>> {
    let mut wake_up = Box::pin(notifier.notified());
    wake_up.as_mut().enable();
    wake_up
}

/// A look made before the wait: when it began, what it found, and the
/// wake-ups since just before it.
struct Looked<'n> {
    started: Instant,
    due: DueClaims<Claimed>,
    wake_up: Pin<Box<Notified<'n>>>,
}

/// Claim, waiting until `deadline` for work when none is due; `first`: a
/// look already made.
async fn claim_waiting<'n>(
    app: &AppState,
    notifier: &'n Notify,
    worker: &WorkerId,
    (lease, limit, only): (LeaseMs, ClaimLimit, &[GroupName]),
    deadline: Instant,
    mut first: Option<Looked<'n>>,
) -> Result<DueClaims<Claimed>, ApiError> {
    let waits = app.waits.clone();
    let mut waiting = None;
    // Since when a look by any poll that found nothing makes this poll's
    // next look pointless; `None` before its first look.
    let mut woken: Option<Instant> = None;
    loop {
        // Registered before the look, so that work made due between the
        // look and the wait is not missed.
        let (mut looked, mut wake_up) = match first.take() {
            Some(Looked {
                started,
                due,
                wake_up,
            }) => (Some((started, due)), wake_up),
            None => (None, armed(notifier)),
        };
        let mut turn = None;
        let look = match woken {
            None => true,
            Some(woken) => {
                // A repeat look waits for its turn, but never past the deadline.
                turn = waits.turn(deadline).await;
                turn.is_some() && !waits.looked_empty_since(woken)
            }
        };
        let mut due = DueClaims::default();
        if look {
            let started;
            (started, due) = match looked.take() {
                Some(looked) => looked,
                None => (
                    Instant::now(),
                    app.store
                        .claim_from(worker, app.now(), lease, limit, only)
                        .await?,
                ),
            };
            // Only a look at every group, that no limit held back, tells
            // the other polls that nothing is due.
            if due.claims.is_empty() && only.is_empty() && !due.held_back {
                waits.found_nothing(started);
            }
        }
        drop(turn);
        let now = Instant::now();
        if !due.claims.is_empty() || now >= deadline || app.shutting_down() {
            app.metrics.claimed(&due.claims, app.now().get());
            spans::note_claimed(worker.as_str(), &due.claims);
            app.metrics.claim_request(if !due.claims.is_empty() {
                ClaimResult::Leased
            } else if due.look_again_ms.is_some() {
                ClaimResult::LookAgain
            } else {
                ClaimResult::Empty
            });
            return Ok(due);
        }
        // A rate limit says when a token comes: look again then.
        let look_again = due
            .look_again_ms
            .map_or(waits.fallback_interval(), Duration::from_millis);
        if waiting.is_none() {
            waiting = Some(waits.enter());
        }
        // Woken by new work, only a look begun after the wake-up has seen it;
        // woken by the timer (work coming due by the clock, or the deadline),
        // a look begun one fallback period ago is recent enough.
        let timer = tokio::select! {
            () = wake_up.as_mut() => false,
            () = tokio::time::sleep_until(deadline.min(now + look_again.min(waits.fallback_interval()))) => true,
            () = app.shutdown_signal() => false,
        };
        let at = Instant::now();
        woken = Some(if timer {
            at.checked_sub(FALLBACK_POLL).unwrap_or(at)
        } else {
            at
        });
    }
}

/// Claim parameters for one receipt.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimOneIn {
    /// Who claims: 1..=128 UTF-8 bytes, no control characters. Becomes the
    /// claim's `lease_owner`.
    #[schema(min_length = 1, max_length = 128)]
    pub worker_id: String,
    /// How long the lease lasts: 1..=86400000 ms.
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub lease_ms: u64,
}

/// Claim one receipt by id.
#[utoipa::path(post, path = "/v1/receipts/{id}/claim", security(("bearer" = ["worker", "operator"])), operation_id = "v1.receipts.claim", tag = "claims",
    params(("id" = String, Path, description = "Receipt id (1..=512 UTF-8 bytes, no control characters)", min_length = 1, max_length = 512)),
    request_body = ClaimOneIn,
    responses(
        (status = 200, description = "Claimed", body = ClaimBody),
        (status = 404, description = "Unknown, or no active work (finished)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Held by a live lease, or not yet visible", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bound is broken", body = Problem, content_type = "application/problem+json"),
    ))]
async fn claim_one(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ClaimOneIn>,
) -> Result<Json<ClaimBody>, ApiError> {
    let id = wire::parse_receipt_id(&id)?;
    let worker = wire::parse_worker_id(&body.worker_id)?;
    let lease = LeaseMs::try_from(body.lease_ms)?;
    let answer = app
        .store
        .claim_receipt(&id, &worker, app.now(), lease)
        .await?;
    app.metrics.claim_request(match answer {
        ReceiptClaim::Claimed(_) => ClaimResult::Leased,
        _ => ClaimResult::Refused,
    });
    match answer {
        ReceiptClaim::Claimed(claim) => {
            app.metrics.claimed([&*claim], app.now().get());
            spans::note_claimed(worker.as_str(), [&*claim]);
            Ok(Json((*claim).into()))
        }
        ReceiptClaim::Leased => Err(ApiError::conflict(
            ProblemCode::ReceiptLeased,
            "a live lease holds this receipt",
        )),
        ReceiptClaim::Held => Err(ApiError::conflict(
            ProblemCode::ReceiptHeld,
            "an operator holds this receipt: it is not claimable until unheld",
        )),
        ReceiptClaim::GroupLimited { paused: true } => Err(ApiError::conflict(
            ProblemCode::GroupPaused,
            "this receipt's group is paused: it is not claimable until resumed",
        )),
        ReceiptClaim::GroupLimited { paused: false } => Err(ApiError::conflict(
            ProblemCode::GroupAtLimit,
            "this receipt's group is at its max_leased or rate limit: try again later",
        )),
        ReceiptClaim::NotYetVisible => Err(ApiError::conflict(
            ProblemCode::ReceiptNotVisible,
            "this receipt is not due yet",
        )),
        ReceiptClaim::NoActiveWork => Err(ApiError::not_found(
            ProblemCode::NoActiveWork,
            "unknown receipt, or it has no active work",
        )),
    }
}
