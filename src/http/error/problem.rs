//! The problem+json body (RFC 9457) every error is answered with, and its
//! stable codes and classes.

use serde::Serialize;
use utoipa::ToSchema;

/// An RFC 9457 problem with a stable machine `code` and an error `class`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Problem {
    /// Always `about:blank`: the `code` says what happened.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP status text, e.g. `Conflict`.
    pub title: String,
    /// The HTTP status code, repeated.
    pub status: u16,
    /// What went wrong, for people; may change between versions.
    pub detail: String,
    pub code: ProblemCode,
    pub class: ProblemClass,
}

/// What went wrong, as a stable machine code: program against this. Each is
/// explained, with what a client should do, in docs/troubleshooting.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProblemCode {
    MalformedJson,
    UnsupportedMediaType,
    BodyTooLarge,
    RequestTimeout,
    InvalidBody,
    InvalidQuery,
    InvalidPath,
    MethodNotAllowed,
    BatchSize,
    InvalidReceiptId,
    InvalidFinalizedAt,
    InvalidVisibleAtMs,
    InvalidObservation,
    ObservationTooLarge,
    InvalidTranscriptId,
    InvalidRetryAfter,
    InvalidGroup,
    InvalidPriority,
    InvalidTraceContext,
    InvalidGroupLimits,
    WorkerIdLength,
    InvalidWorkerId,
    LeaseDuration,
    ClaimBatch,
    InvalidWaitMs,
    InvalidClaim,
    ReceiptIdMismatch,
    InvalidLimit,
    InvalidCursor,
    Unauthorized,
    Forbidden,
    CrossSiteRequest,
    HostNotAllowed,
    MisdirectedRequest,
    LeaseConflict,
    LeaseExpired,
    ReceiptNotLeased,
    ReceiptUnknown,
    ReceiptConflict,
    ReceiptLeased,
    ReceiptNotVisible,
    GroupPaused,
    GroupAtLimit,
    NotFound,
    ReceiptNotFound,
    NoActiveWork,
    DeadLetterNotFound,
    GroupNotFound,
    ReceiptHeld,
    ReceiptNotActive,
    ReceiptFinished,
    CountMismatch,
    SelectionTooLarge,
    BulkIncomplete,
    InvalidReason,
    HistoryCursorExpired,
    TooManyStreams,
    InvalidRecord,
    BackendUnavailable,
    TimeLimitExceeded,
    InternalError,
    InvalidRailCode,
}

/// The kind of error: `validation` (fix the request), `conflict` (the
/// receipt's state or lease does not allow it), `not_found`, `auth` (the
/// token, or where the request came from), `capacity` (a limit of the
/// server's, such as open streams, is reached: retry after `Retry-After`),
/// `invalid_record` (a stored value is corrupt; nothing changed),
/// `backend` (retry later) or `internal` (a fault of settled's own, logged
/// with its cause: retry a few times at most, then report it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProblemClass {
    Validation,
    Conflict,
    InvalidRecord,
    Backend,
    NotFound,
    Auth,
    Capacity,
    Internal,
}
