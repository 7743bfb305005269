//! Finding receipts (`GET /v1/receipts`): the filter, the page asked for,
//! and the plan both backends run, so that they answer alike.
//!
//! Every page walks ranges of indexes in `(finalized_at, receipt_id)` order
//! (migrations/sqlite/0004_counts.sql, 0010_failure_codes.sql): the partial
//! indexes `receipts_fresh`, `receipts_retried` and `receipts_by_status`
//! hold every row exactly once in that order (on PostgreSQL, the first two
//! only the rows without a lease: migrations/postgres/0018), `receipts_leases`
//! holds the leases and `receipts_failed` the rows that failed, by code. The
//! state, the failure code and the `finalized_at` range are index ranges;
//! the other filters are checked on the rows those ranges yield, at most
//! [`SCAN_BUDGET`] of them per page, so a page costs the same whatever the
//! table holds. A page cut short by that bound still carries a cursor.
//!
//! [`ReceiptFilter`] says which receipts, apart from paging, so that other
//! features (actions on many receipts) can select with it too.

use super::rows::{ReceiptRow, to_u64};
use super::{FailureView, LeaseView, ReceiptState, Status, StoreResult};
use crate::domain::{Priority, RailCode, SettlementFailureCode, WorkerId};

/// Rows examined per page at most when a filter is checked row by row.
pub const SCAN_BUDGET: usize = 1000;

/// Which receipts a state filter selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateFilter {
    /// Never attempted and not leased: due now or scheduled for later (as
    /// `pending` in `/v1/status`).
    Pending,
    /// The `pending` receipts not due yet (`next_visible_at_ms` ahead).
    Scheduled,
    /// Held by a live lease.
    Leased,
    /// Failed at least once, not leased, waiting for the next attempt.
    RetryScheduled,
    Settled,
    Skipped,
    DeadLettered,
    /// Canceled by an operator.
    Canceled,
}

impl StateFilter {
    /// The snake_case label.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Scheduled => "scheduled",
            Self::Leased => "leased",
            Self::RetryScheduled => "retry_scheduled",
            Self::Settled => "settled",
            Self::Skipped => "skipped",
            Self::DeadLettered => "dead_lettered",
            Self::Canceled => "canceled",
        }
    }

    /// Every state filter.
    pub const ALL: [Self; 8] = [
        Self::Pending,
        Self::Scheduled,
        Self::Leased,
        Self::RetryScheduled,
        Self::Settled,
        Self::Skipped,
        Self::DeadLettered,
        Self::Canceled,
    ];
}

/// A half-open range `[from, to)`; either end may be open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Range {
    pub from: Option<u64>,
    pub to: Option<u64>,
}

impl Range {
    /// Whether `value` lies in the range.
    #[must_use]
    pub fn contains(&self, value: u64) -> bool {
        self.from.is_none_or(|f| value >= f) && self.to.is_none_or(|t| value < t)
    }

    /// Whether either end is set.
    #[must_use]
    pub const fn is_bounded(&self) -> bool {
        self.from.is_some() || self.to.is_some()
    }

    /// Whether `from` is not before `to` (the range is empty).
    #[must_use]
    pub fn is_inverted(&self) -> bool {
        matches!((self.from, self.to), (Some(f), Some(t)) if f >= t)
    }

    fn text(&self) -> String {
        let end = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
        format!("{}..{}", end(self.from), end(self.to))
    }
}

/// Which receipts to find; every condition set must hold. Separate from
/// paging so that actions on many receipts can select with it too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiptFilter {
    pub state: Option<StateFilter>,
    /// The last failure's code.
    pub code: Option<SettlementFailureCode>,
    /// The worker holding a live lease (only leased receipts have one).
    pub owner: Option<WorkerId>,
    /// Receipt ids starting with these bytes.
    pub prefix: Option<String>,
    /// `finalized_at`, Unix seconds.
    pub finalized: Range,
    /// `finished_at_ms`, server ms (only finished receipts have one).
    pub finished_ms: Range,
    /// Held by an operator (`true`) or not (`false`); only active receipts
    /// can be held.
    pub held: Option<bool>,
    /// The receipt's group.
    pub group: Option<String>,
    /// The receipt's priority.
    pub priority: Option<Priority>,
    /// The last failure's rail code (checked row by row: no index holds it).
    pub rail_code: Option<RailCode>,
}

impl ReceiptFilter {
    /// Whether `row` matches at `now` (ms).
    pub fn matches(&self, row: &ReceiptRow, now: i64) -> StoreResult<bool> {
        let state = row.state(now)?;
        let state_ok = match self.state {
            None => true,
            Some(StateFilter::Pending) => state == ReceiptState::Pending,
            Some(StateFilter::Scheduled) => {
                state == ReceiptState::Pending && row.next_visible_at_ms.is_some_and(|v| v > now)
            }
            Some(StateFilter::Leased) => state == ReceiptState::Leased,
            Some(StateFilter::RetryScheduled) => state == ReceiptState::RetryScheduled,
            Some(StateFilter::Settled) => state == ReceiptState::Settled,
            Some(StateFilter::Skipped) => state == ReceiptState::Skipped,
            Some(StateFilter::DeadLettered) => state == ReceiptState::DeadLettered,
            Some(StateFilter::Canceled) => state == ReceiptState::Canceled,
        };
        let is_held = row.status == Status::Active && row.held_at_ms.is_some();
        let held_ok = self.held.is_none_or(|h| h == is_held);
        let code_ok = self
            .code
            .is_none_or(|c| row.failure_code.as_deref() == Some(c.as_str()));
        let owner_ok = self.owner.as_ref().is_none_or(|o| {
            state == ReceiptState::Leased && row.lease_owner.as_deref() == Some(o.as_str())
        });
        let prefix_ok = self
            .prefix
            .as_deref()
            .is_none_or(|p| row.receipt_id.starts_with(p));
        let finalized_ok = self
            .finalized
            .contains(to_u64(row.finalized_at, "finalized_at")?);
        let finished_ok = !self.finished_ms.is_bounded()
            || row
                .finished_at_ms
                .is_some_and(|f| u64::try_from(f).is_ok_and(|f| self.finished_ms.contains(f)));
        let group_ok = self.group.as_deref().is_none_or(|g| row.receipt_group == g);
        let priority_ok = self.priority.is_none_or(|p| row.priority == p.stored());
        let rail_ok = self
            .rail_code
            .as_ref()
            .is_none_or(|r| row.failure_rail_code.as_deref() == Some(r.as_str()));
        Ok(state_ok
            && code_ok
            && owner_ok
            && prefix_ok
            && finalized_ok
            && finished_ok
            && held_ok
            && group_ok
            && priority_ok
            && rail_ok)
    }

    /// The filter as canonical text: equal filters, equal text.
    #[must_use]
    pub fn canonical(&self) -> String {
        // The group and the priority are appended only when set, so that
        // cursors handed out before they existed stay valid.
        let group = self
            .group
            .as_deref()
            .map_or_else(String::new, |g| format!(";group={}", hex::encode(g)));
        let priority = self
            .priority
            .map_or_else(String::new, |p| format!(";priority={p}"));
        let rail_code = self
            .rail_code
            .as_ref()
            .map_or_else(String::new, |r| format!(";rail_code={}", r.as_str()));
        format!(
            "state={};code={};owner={};prefix={};finalized={};finished_ms={};held={}",
            self.state.map_or("", StateFilter::as_str),
            self.code.map_or("", SettlementFailureCode::as_str),
            self.owner
                .as_ref()
                .map_or_else(String::new, |o| hex::encode(o.as_str())),
            self.prefix.as_deref().map_or_else(String::new, hex::encode),
            self.finalized.text(),
            self.finished_ms.text(),
            self.held.map_or("", |h| if h { "true" } else { "false" }),
        ) + &group
            + &priority
            + &rail_code
    }

    /// The index ranges that can hold a match (none: nothing can match).
    /// A failure code is one range of `receipts_failed`, which holds only
    /// rows that failed once; every other filter is then checked on its rows.
    #[must_use]
    pub fn sources(&self) -> Vec<Source> {
        let by_state = self.state_sources();
        match self.code {
            Some(code) if !by_state.is_empty() => vec![Source::Failed(code)],
            _ => by_state,
        }
    }

    fn state_sources(&self) -> Vec<Source> {
        let finished = [
            Source::Finished(Status::Settled),
            Source::Finished(Status::Skipped),
            Source::Finished(Status::DeadLettered),
            Source::Finished(Status::Canceled),
        ];
        if self.owner.is_some() {
            return match self.state {
                None | Some(StateFilter::Leased) if !self.finished_ms.is_bounded() => {
                    vec![Source::Leases]
                }
                _ => Vec::new(),
            };
        }
        // Only active receipts can be held: a finished range or `held=true`
        // leaves out one side.
        let active_ok = !self.finished_ms.is_bounded();
        if self.held == Some(true) {
            return match self.state {
                _ if !active_ok => Vec::new(),
                None => vec![Source::Fresh, Source::Retried],
                Some(StateFilter::Pending | StateFilter::Scheduled) => vec![Source::Fresh],
                Some(StateFilter::Leased) => vec![Source::Leases],
                Some(StateFilter::RetryScheduled) => vec![Source::Retried],
                Some(_) => Vec::new(),
            };
        }
        match self.state {
            None if active_ok => [Source::Fresh, Source::Retried]
                .into_iter()
                .chain(finished)
                .collect(),
            None => finished.to_vec(),
            Some(_) if !active_ok && !self.state.is_some_and(finished_state) => Vec::new(),
            Some(StateFilter::Pending | StateFilter::Scheduled) => vec![Source::Fresh],
            Some(StateFilter::Leased) => vec![Source::Leases],
            Some(StateFilter::RetryScheduled) => vec![Source::Retried],
            Some(StateFilter::Settled) => vec![finished[0]],
            Some(StateFilter::Skipped) => vec![finished[1]],
            Some(StateFilter::DeadLettered) => vec![finished[2]],
            Some(StateFilter::Canceled) => vec![finished[3]],
        }
    }

    /// Whether some condition is checked row by row after the index range
    /// (so that a page may need to examine more rows than it returns).
    #[must_use]
    pub fn checks_rows(&self) -> bool {
        if self.rail_code.is_some() {
            return true;
        }
        if self.code.is_some() {
            return self.state.is_some()
                || self.owner.is_some()
                || self.prefix.is_some()
                || self.finished_ms.is_bounded()
                || self.held.is_some()
                || self.group.is_some()
                || self.priority.is_some();
        }
        self.state == Some(StateFilter::Scheduled)
            || self.prefix.is_some()
            || self.finished_ms.is_bounded()
            || self.held.is_some()
            || self.group.is_some()
            || self.priority.is_some()
    }

    /// Rows a page of `limit` reads at most, from all its index ranges together.
    #[must_use]
    pub fn budget(&self, limit: usize) -> usize {
        if self.checks_rows() {
            SCAN_BUDGET.max(limit + 1)
        } else {
            limit + 1
        }
    }
}

const fn finished_state(state: StateFilter) -> bool {
    matches!(
        state,
        StateFilter::Settled
            | StateFilter::Skipped
            | StateFilter::DeadLettered
            | StateFilter::Canceled
    )
}

/// Page order by `(finalized_at, receipt_id)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SearchOrder {
    /// Latest `finalized_at` first (ties: greatest id first).
    #[default]
    Newest,
    /// Earliest `finalized_at` first (ties: smallest id first).
    Oldest,
}

/// A position in `(finalized_at, receipt_id)` order; a page starts after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SearchKey {
    pub finalized_at: u64,
    pub receipt_id: String,
}

/// Which page to return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchPage {
    pub order: SearchOrder,
    /// Receipts returned at most (at least 1).
    pub limit: usize,
    /// Start after this key (in `order`), or at the start.
    pub after: Option<SearchKey>,
}

/// A receipt as a search returns it (never its lease token or observation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundReceipt {
    pub receipt_id: String,
    /// Its group (docs/groups.md).
    pub group: String,
    /// Its priority within the group.
    pub priority: i64,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: u64,
    pub state: ReceiptState,
    /// As in a receipt's view.
    pub attempts: u32,
    /// When the receipt is next due (server ms); null once finished.
    pub next_visible_at_ms: Option<u64>,
    /// The live lease, while one holds the receipt.
    pub lease: Option<LeaseView>,
    /// The last failure, once there was one.
    pub last_failure: Option<FailureView>,
    /// When it finished (settled, skipped, dead-lettered or canceled), server ms.
    pub finished_at_ms: Option<u64>,
    /// Since when an operator holds it (server ms).
    pub held_at_ms: Option<u64>,
}

/// One page of a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchResults {
    pub receipts: Vec<FoundReceipt>,
    /// Where the next page starts; `None` only when no receipt is left.
    pub next: Option<SearchKey>,
}

mod sql;

pub use sql::{Bind, Dialect, SEARCH_COLUMNS, Source, Statement, assemble, statement};

#[cfg(test)]
#[path = "search_tests.rs"]
mod tests;
