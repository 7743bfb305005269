//! What a run did and what it was told: every operation with its answer, the
//! faults with their times, and the final state read back at the end.
//!
//! Times are milliseconds on the harness's monotonic clock since the run
//! started: `sent_ms` before the request left, `answered_ms` after its answer
//! (or error) arrived. The server acted somewhere in between.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// How the server answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// 2xx: acknowledged.
    Ok,
    /// A 4xx with this problem `code`: refused, nothing changed.
    Refused(String),
    /// No answer, or a 5xx: it may or may not have happened.
    Unknown,
}

/// One operation a producer or worker sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    pub receipt: String,
    pub worker: String,
    pub sent_ms: u64,
    pub answered_ms: u64,
    pub answer: Answer,
    pub kind: OpKind,
}

/// What the operation was. `token` names the claim it was sent under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpKind {
    Enqueue,
    /// A claim granted (only granted claims are recorded: a refused or
    /// unanswered claim holds nothing). `lease_ms` as asked.
    Claim {
        token: String,
        row_version: u64,
        lease_ms: u64,
    },
    /// An outcome: `outcome` is the kind sent (`accepted`, `skipped`,
    /// `retryable`, `permanent`); `transcript_id` for `accepted`.
    Outcome {
        token: String,
        outcome: String,
        transcript_id: Option<String>,
    },
    Extend {
        token: String,
        extend_ms: u64,
    },
    Release {
        token: String,
    },
}

/// A fault as injected: `[start_ms, end_ms]`, with what it was.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FaultSpan {
    pub fault: String,
    pub start_ms: u64,
    pub end_ms: u64,
    /// A fault that changes the PostgreSQL writer: when the new primary was
    /// first seen taking writes (recovery is measured from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_ms: Option<u64>,
}

/// One history entry as read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub outcome: String,
    pub worker_id: String,
    pub transcript_id: Option<String>,
    pub route: Option<String>,
}

/// A receipt as read back at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Final {
    pub state: String,
    pub transcript_id: Option<String>,
    pub history: Vec<Entry>,
}

/// A whole run: enough to check it again later (`settled-faults check FILE`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Recording {
    pub scenario: String,
    pub ops: Vec<Op>,
    pub faults: Vec<FaultSpan>,
    /// Every receipt an enqueue was attempted for; `None`: not found (404).
    pub finals: BTreeMap<String, Option<Final>>,
    /// Receipts the server holds in all (`/v1/status` counts).
    pub total_stored: u64,
    pub duration_ms: u64,
    /// The fault kinds the run was to inject (each at least once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expected_faults: Vec<String>,
    /// PostgreSQL replicated asynchronously (`--ha-async`): a failover may
    /// lose acknowledged commits, so lost and settled twice are evidence,
    /// not failures.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub async_replication: bool,
    /// What the harness saw go wrong besides the operations (a replica not
    /// following the primary by the end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// Collects operations from every task of a run.
pub struct Recorder {
    start: Instant,
    ops: Mutex<Vec<Op>>,
    faults: Mutex<Vec<FaultSpan>>,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            ops: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
        }
    }

    /// Milliseconds since the run started.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn op(&self, op: Op) {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    pub fn fault(&self, fault: &str, start_ms: u64) {
        self.span(FaultSpan {
            fault: fault.to_owned(),
            start_ms,
            end_ms: self.now_ms(),
            promoted_ms: None,
        });
    }

    pub fn span(&self, span: FaultSpan) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(span);
    }

    /// What was recorded so far, taken out of the recorder.
    pub fn take_recording(&self, scenario: &str) -> Recording {
        Recording {
            scenario: scenario.to_owned(),
            ops: take_all(&self.ops),
            faults: take_all(&self.faults),
            finals: BTreeMap::new(),
            total_stored: 0,
            duration_ms: self.now_ms(),
            ..Recording::default()
        }
    }
}

/// Everything in `list`, leaving it empty (a panicked writer's items too).
fn take_all<T>(list: &Mutex<Vec<T>>) -> Vec<T> {
    std::mem::take(&mut *list.lock().unwrap_or_else(|p| p.into_inner()))
}
