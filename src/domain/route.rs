//! What a worker reports, what the store did with it, and how it can fail.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use utoipa::ToSchema;

use super::rail_code::RailCode;
use super::reasons::{SettlementFailureCode, SettlementSkipReason};
use super::text::TranscriptId;

/// A failure as the store keeps it: the code, the SHA-256 of the detail
/// text and the rail's own code, if the worker gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettlementFailureReason {
    /// The failure code.
    pub code: SettlementFailureCode,
    /// Lower-case hex SHA-256 of the worker's detail text (the text itself is never stored).
    pub detail_sha256: String,
    /// The rail's own word for the failure, shown beside `code`.
    pub rail_code: Option<RailCode>,
}

impl SettlementFailureReason {
    /// Digest the free-text detail; only the digest leaves this function.
    #[must_use]
    pub fn new(code: SettlementFailureCode, detail: &str) -> Self {
        use sha2::{Digest, Sha256};
        Self {
            code,
            detail_sha256: hex::encode(Sha256::digest(detail.as_bytes())),
            rail_code: None,
        }
    }

    /// The same failure with the rail's own code.
    #[must_use]
    pub fn with_rail_code(mut self, rail_code: Option<RailCode>) -> Self {
        self.rail_code = rail_code;
        self
    }
}

/// Normalized outcome accepted by durable settlement routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The rail durably accepted the settlement.
    Accepted { transcript_id: TranscriptId },
    /// The observation legitimately requires no settlement work.
    Skipped { reason: SettlementSkipReason },
    /// The observation may succeed when replayed; `retry_after_ms` is the
    /// rail's own wait (its `Retry-After`), if it gave one.
    Retryable {
        reason: SettlementFailureReason,
        retry_after_ms: Option<u64>,
    },
    /// The observation must terminate without replay.
    Permanent { reason: SettlementFailureReason },
}

impl Outcome {
    /// The outcome kind label used in history entries.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Accepted { .. } => "accepted",
            Self::Skipped { .. } => "skipped",
            Self::Retryable { .. } => "retryable",
            Self::Permanent { .. } => "permanent",
        }
    }

    /// The failure carried by a retryable or permanent outcome.
    #[must_use]
    pub const fn failure(&self) -> Option<&SettlementFailureReason> {
        match self {
            Self::Retryable { reason, .. } | Self::Permanent { reason } => Some(reason),
            _ => None,
        }
    }

    /// The rail's wait carried by a retryable outcome.
    #[must_use]
    pub const fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Self::Retryable { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }
}

/// What the server did with an outcome, recorded atomically with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Route {
    /// Finished: the receipt is settled (`accepted`) or skipped; nothing more to do.
    #[schema(title = "NoActionRoute")]
    NoAction,
    /// The failure will be retried: the receipt is due again at `next_visible_at_ms`.
    #[schema(title = "RetryScheduledRoute")]
    RetryScheduled {
        /// The receipt's `attempts` now: invocations failed so far, this one
        /// included (1 after the first failure). Equals this outcome's history
        /// `attempt`; the next claim carries it as `attempts`.
        attempt: u32,
        /// When the receipt is due again (server ms).
        next_visible_at_ms: u64,
    },
    /// The receipt failed for good and waits in the dead letters for an operator.
    #[schema(title = "DeadLetteredRoute")]
    DeadLettered {
        /// Total invocations, this last one included (the dead letter's `attempts`).
        attempts: u32,
    },
}

/// A route as it arrives, read as one flat object: serde buffers an
/// internally tagged enum before reading it, and with serde_json's
/// `arbitrary_precision` (which keeps observation numbers exact) a buffered
/// number no longer reads as an integer.
#[derive(Deserialize)]
struct RouteWire {
    kind: String,
    attempt: Option<u32>,
    next_visible_at_ms: Option<u64>,
    attempts: Option<u32>,
}

impl<'de> Deserialize<'de> for Route {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let wire = RouteWire::deserialize(deserializer)?;
        let missing = |field| D::Error::missing_field(field);
        match wire.kind.as_str() {
            "no_action" => Ok(Self::NoAction),
            "retry_scheduled" => Ok(Self::RetryScheduled {
                attempt: wire.attempt.ok_or_else(|| missing("attempt"))?,
                next_visible_at_ms: wire
                    .next_visible_at_ms
                    .ok_or_else(|| missing("next_visible_at_ms"))?,
            }),
            "dead_lettered" => Ok(Self::DeadLettered {
                attempts: wire.attempts.ok_or_else(|| missing("attempts"))?,
            }),
            other => Err(D::Error::unknown_variant(
                other,
                &["no_action", "retry_scheduled", "dead_lettered"],
            )),
        }
    }
}

impl Route {
    /// The route kind label used in history entries.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::NoAction => "no_action",
            Self::RetryScheduled { .. } => "retry_scheduled",
            Self::DeadLettered { .. } => "dead_lettered",
        }
    }
}

/// Bounded class for settlement routing failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorClass {
    /// Persistence backend failure.
    Backend,
    /// Lease, version, or terminal-state conflict.
    Conflict,
    /// Invalid or overflowing durable data.
    InvalidRecord,
    /// A broken invariant of settled's own: a bug, not an outage.
    Internal,
}

/// Why the store refused a claim (an outcome, extension or release). Each
/// kind has its own problem code; a worker's answer to all of them is the
/// same (the lease is lost: drop the work), an operator's is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictKind {
    /// The claim is not the receipt's current lease: claimed again, or
    /// altered (a forged token, owner, version or attempt count).
    LeaseMismatch,
    /// The claim is still the current lease, but its deadline has passed.
    LeaseExpired,
    /// The receipt holds no lease (waiting for a claim, released, or retrying).
    NotLeased,
    /// The receipt is settled, skipped, canceled or dead-lettered.
    Finished,
    /// No receipt has this id.
    UnknownReceipt,
}

/// What a backend failure says about the database server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendFault {
    /// The server answered: a statement failed, a timeout, an invariant.
    Answered,
    /// The connection failed (refused, reset, timed out): the server may be gone.
    Connection,
    /// The server said it takes no writes on this connection (a standby or a
    /// demoted primary): a failover, not an outage.
    WriterLost,
}

/// The driver's own error behind a backend failure, kept as its `source()`
/// for logs and debugging. Errors compare by their text: the driver's types
/// are not comparable, and a failure is told apart by `detail` and `fault`.
#[derive(Debug, Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

impl Cause {
    /// The driver's error itself.
    #[must_use]
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.0.as_ref()
    }
}

/// Failure returned by the durable settlement store.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    #[error("settlement routing backend failure: {detail}")]
    Backend {
        detail: String,
        /// What kind of failure, where it tells the store where to look.
        fault: BackendFault,
        /// The driver's error, when the failure came from one.
        #[source]
        cause: Option<Cause>,
    },
    #[error("settlement routing conflict: {detail}")]
    Conflict { kind: ConflictKind, detail: String },
    #[error("invalid settlement routing record: {detail}")]
    InvalidRecord { detail: String },
    /// An invariant of settled's own failed (an answer missing or of the
    /// wrong kind): retrying will not help, unlike a backend failure.
    #[error("settlement routing invariant failed: {detail}")]
    Internal { detail: String },
}

impl StoreError {
    /// Return the stable class suitable for bounded telemetry.
    #[must_use]
    pub const fn class(&self) -> StoreErrorClass {
        match self {
            Self::Backend { .. } => StoreErrorClass::Backend,
            Self::Conflict { .. } => StoreErrorClass::Conflict,
            Self::InvalidRecord { .. } => StoreErrorClass::InvalidRecord,
            Self::Internal { .. } => StoreErrorClass::Internal,
        }
    }

    /// A conflict with a message a client may read.
    pub fn conflict(kind: ConflictKind, detail: impl Into<String>) -> Self {
        Self::Conflict {
            kind,
            detail: detail.into(),
        }
    }

    /// An overflow or corrupt row.
    pub fn invalid_record(detail: impl Into<String>) -> Self {
        Self::InvalidRecord {
            detail: detail.into(),
        }
    }

    /// A broken invariant of settled's own; the detail goes to the log only.
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::Internal {
            detail: detail.into(),
        }
    }

    /// A database failure; the detail goes to the log only.
    pub fn backend(detail: impl Into<String>) -> Self {
        Self::backend_fault(BackendFault::Answered, detail)
    }

    /// A database failure of a given kind; the detail goes to the log only.
    pub fn backend_fault(fault: BackendFault, detail: impl Into<String>) -> Self {
        Self::Backend {
            detail: detail.into(),
            fault,
            cause: None,
        }
    }

    /// A database failure the driver reported as `cause` (its text is the detail).
    pub fn backend_caused(
        fault: BackendFault,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            detail: cause.to_string(),
            fault,
            cause: Some(Cause(std::sync::Arc::new(cause))),
        }
    }
}

/// Opaque identity of one durable writer (one database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SettlementStoreBinding([u8; 32]);

impl SettlementStoreBinding {
    /// Construct a binding from a backend-generated digest.
    #[must_use]
    pub const fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// Return the backend-generated digest.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, 64 characters.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;
