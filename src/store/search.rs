//! Finding receipts (`GET /v1/receipts`): the filter, the page asked for,
//! and the plan both backends run, so that they answer alike.
//!
//! Every page walks ranges of indexes in `(finalized_at, receipt_id)` order
//! (migrations/sqlite/0004_counts.sql, 0010_failure_codes.sql): the partial
//! indexes `receipts_fresh`, `receipts_retried` and `receipts_by_status`
//! hold every row exactly once in that order, `receipts_leases` holds the
//! live leases and `receipts_failed` the rows that failed, by code. The
//! state, the failure code and the `finalized_at` range are index ranges;
//! the other filters are checked on the rows those ranges yield, at most
//! [`SCAN_BUDGET`] of them per page, so a page costs the same whatever the
//! table holds. A page cut short by that bound still carries a cursor.
//!
//! [`ReceiptFilter`] says which receipts, apart from paging, so that other
//! features (actions on many receipts) can select with it too.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::rows::{ReceiptRow, to_i64, to_u64};
use super::{FailureView, LeaseView, ReceiptState, StoreResult};
use crate::domain::{Priority, SettlementFailureCode, WorkerId};

/// Rows examined per page at most when a filter is checked row by row.
pub const SCAN_BUDGET: usize = 1000;

/// Which receipts a state filter selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
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
        let is_held = row.status == "active" && row.held_at_ms.is_some();
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
        Ok(state_ok
            && code_ok
            && owner_ok
            && prefix_ok
            && finalized_ok
            && finished_ok
            && held_ok
            && group_ok
            && priority_ok)
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
            Source::Finished("settled"),
            Source::Finished("skipped"),
            Source::Finished("dead_lettered"),
            Source::Finished("canceled"),
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FoundReceipt {
    pub receipt_id: String,
    /// Its group (docs/groups.md).
    pub group: String,
    /// Its priority within the group.
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: i64,
    /// The producer's `finalized_at` (Unix seconds).
    pub finalized_at: u64,
    pub state: ReceiptState,
    /// As in a receipt's view.
    pub attempts: u32,
    /// When the receipt is next due (server ms); null once finished.
    pub next_visible_at_ms: Option<u64>,
    /// The live lease, while one holds the receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// The last failure, once there was one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<FailureView>,
    /// When it finished (settled, skipped, dead-lettered or canceled), server ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    /// Since when an operator holds it (server ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_at_ms: Option<u64>,
}

/// One page of a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchResults {
    pub receipts: Vec<FoundReceipt>,
    /// Where the next page starts; `None` only when no receipt is left.
    pub next: Option<SearchKey>,
}

/// One index range a search reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Active, never attempted (`receipts_fresh`).
    Fresh,
    /// Active, attempted (`receipts_retried`).
    Retried,
    /// Live leases (`receipts_leases`), sorted: their number is bounded by
    /// the leases handed out, not by the receipts stored.
    Leases,
    /// Finished with this status (`receipts_by_status`).
    Finished(&'static str),
    /// Last failed with this code (`receipts_failed`).
    Failed(SettlementFailureCode),
}

/// The columns a search reads, as a [`ReceiptRow`] (no observation, no token).
pub const SEARCH_COLUMNS: &str = "receipt_id, finalized_at, NULL AS observation, status, \
     attempts, row_version, next_visible_at_ms, lease_owner, NULL AS lease_token, \
     lease_until_ms, failure_code, failure_sha256, NULL AS transcript_id, NULL AS skip_reason, \
     finished_at_ms, held_at_ms, NULL AS cancel_reason, receipt_group, priority, \
     NULL AS traceparent, NULL AS tracestate";

/// A value bound to a search statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    Int(i64),
    Text(String),
}

/// A statement and its values, in placeholder order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub sql: String,
    pub binds: Vec<Bind>,
}

/// How a backend spells placeholders and forces an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `?N`, and `INDEXED BY` so that SQLite fails rather than scans.
    Sqlite,
    /// `$N`.
    Postgres,
}

struct Builder {
    dialect: Dialect,
    binds: Vec<Bind>,
}

impl Builder {
    fn push(&mut self, value: Bind) -> String {
        self.binds.push(value);
        match self.dialect {
            Dialect::Sqlite => format!("?{}", self.binds.len()),
            Dialect::Postgres => format!("${}", self.binds.len()),
        }
    }
}

/// The one statement reading the first `budget` rows of every source
/// merged, in page order; `None` when no source can hold a match. The
/// sources are `UNION ALL` arms under one `ORDER BY … LIMIT`: each arm is an
/// index range already in that order, so both databases merge them lazily
/// and stop after `budget` rows in all (SQLite: `MERGE (UNION ALL)`;
/// PostgreSQL: `Merge Append` under `Limit`, checked with `EXPLAIN ANALYZE`).
pub fn statement(
    dialect: Dialect,
    filter: &ReceiptFilter,
    page: &SearchPage,
    now: i64,
    budget: usize,
) -> StoreResult<Option<Statement>> {
    let sources = filter.sources();
    if sources.is_empty() {
        return Ok(None);
    }
    let mut b = Builder {
        dialect,
        binds: Vec::new(),
    };
    let direction = match page.order {
        SearchOrder::Oldest => "ASC",
        SearchOrder::Newest => "DESC",
    };
    // A literal, not a parameter: a plan cached for any limit could sort
    // every row instead of merging.
    let order = format!("ORDER BY finalized_at {direction}, receipt_id {direction} LIMIT {budget}");
    let several = sources.len() > 1;
    let mut arms = Vec::new();
    for source in sources {
        let arm = arm(&mut b, source, filter, page, now)?;
        arms.push(match dialect {
            // PostgreSQL merges arms lazily (`Merge Append`) only when each
            // is ordered and limited itself; otherwise it sorts them all.
            Dialect::Postgres if several => format!("({arm} {order})"),
            _ => arm,
        });
    }
    let sql = format!("{} {order}", arms.join(" UNION ALL "));
    Ok(Some(Statement {
        sql,
        binds: b.binds,
    }))
}

/// One source's rows after the page's start, as a `SELECT` without order.
fn arm(
    b: &mut Builder,
    source: Source,
    filter: &ReceiptFilter,
    page: &SearchPage,
    now: i64,
) -> StoreResult<String> {
    // Each predicate repeats its index's own word for word (SQLite uses a
    // partial index only then).
    let (index, mut conditions) = match source {
        Source::Fresh => (
            "receipts_fresh",
            vec!["status = 'active' AND attempts = 0".to_owned()],
        ),
        Source::Retried => (
            "receipts_retried",
            vec!["status = 'active' AND attempts > 0".to_owned()],
        ),
        Source::Leases => {
            let now = b.push(Bind::Int(now));
            ("receipts_leases", vec![format!("lease_until_ms > {now}")])
        }
        Source::Finished(status) => (
            "receipts_by_status",
            vec![format!("status = '{status}' AND status <> 'active'")],
        ),
        Source::Failed(code) => {
            let code = b.push(Bind::Text(code.as_str().to_owned()));
            (
                "receipts_failed",
                vec![format!(
                    "failure_code = {code} AND failure_code IS NOT NULL"
                )],
            )
        }
    };
    // Active sources skip live leases when a state without them is asked
    // for; stepping over them costs at most the leases handed out.
    let skip_leases = matches!(source, Source::Fresh | Source::Retried)
        && matches!(
            filter.state,
            Some(StateFilter::Pending | StateFilter::Scheduled | StateFilter::RetryScheduled)
        );
    if skip_leases {
        let now = b.push(Bind::Int(now));
        conditions.push(format!(
            "(lease_until_ms IS NULL OR lease_until_ms <= {now})"
        ));
    }
    if let (Source::Leases, Some(owner)) = (source, &filter.owner) {
        let owner = b.push(Bind::Text(owner.as_str().to_owned()));
        conditions.push(format!("lease_owner = {owner}"));
    }
    // One end of the range is the cursor when there is one, otherwise the
    // filter's bound: either way one index range, never a scan from the
    // filter's bound up to the cursor.
    let (start, end) = match page.order {
        SearchOrder::Oldest => (filter.finalized.from, filter.finalized.to),
        SearchOrder::Newest => (filter.finalized.to, filter.finalized.from),
    };
    let (after_op, before_op, bound_op) = match page.order {
        SearchOrder::Oldest => (">", ">=", "<"),
        SearchOrder::Newest => ("<", "<", ">="),
    };
    if let Some(after) = &page.after {
        let at = b.push(Bind::Int(to_i64(after.finalized_at, "cursor")?));
        let id = b.push(Bind::Text(after.receipt_id.clone()));
        conditions.push(format!(
            "(finalized_at, receipt_id) {after_op} ({at}, {id})"
        ));
    } else if let Some(start) = start {
        let start = b.push(Bind::Int(to_i64(start, "finalized range")?));
        conditions.push(format!("finalized_at {before_op} {start}"));
    }
    if let Some(end) = end {
        let end = b.push(Bind::Int(to_i64(end, "finalized range")?));
        conditions.push(format!("finalized_at {bound_op} {end}"));
    }
    let indexed = match b.dialect {
        Dialect::Sqlite => format!(" INDEXED BY {index}"),
        Dialect::Postgres => String::new(),
    };
    Ok(format!(
        "SELECT {SEARCH_COLUMNS} FROM receipts{indexed} WHERE {}",
        conditions.join(" AND ")
    ))
}

fn key(row: &ReceiptRow) -> StoreResult<SearchKey> {
    Ok(SearchKey {
        finalized_at: to_u64(row.finalized_at, "finalized_at")?,
        receipt_id: row.receipt_id.clone(),
    })
}

fn found(row: &ReceiptRow, now: i64) -> StoreResult<FoundReceipt> {
    let view = row.view(now, Vec::new())?;
    Ok(FoundReceipt {
        receipt_id: view.receipt_id,
        group: view.group,
        priority: view.priority,
        finalized_at: view.finalized_at,
        state: view.state,
        attempts: view.attempts,
        next_visible_at_ms: view.next_visible_at_ms,
        lease: view.lease,
        last_failure: view.last_failure,
        held_at_ms: view.held_at_ms,
        finished_at_ms: row
            .finished_at_ms
            .map(|f| to_u64(f, "finished_at_ms"))
            .transpose()?,
    })
}

/// The page from the rows [`statement`] read (the first `budget` in page
/// order): the matches kept up to `limit`, and where the next page starts.
pub fn assemble(
    filter: &ReceiptFilter,
    page: &SearchPage,
    now: i64,
    budget: usize,
    rows: Vec<ReceiptRow>,
) -> StoreResult<SearchResults> {
    // A full read may have left rows behind.
    let more = rows.len() >= budget;
    let mut merged = Vec::with_capacity(rows.len());
    for row in rows {
        merged.push((key(&row)?, row));
    }
    let mut receipts = Vec::new();
    let mut last_examined = None;
    let mut rest = merged.into_iter();
    for (key, row) in rest.by_ref() {
        last_examined = Some(key);
        if filter.matches(&row, now)? {
            if receipts.len() == page.limit {
                // A further match: the page is full and the next one is not empty.
                return Ok(SearchResults {
                    next: Some(page_end(&receipts)),
                    receipts,
                });
            }
            receipts.push(found(&row, now)?);
        }
    }
    let next = if more {
        // The budget ran out: go on after the last row examined.
        last_examined
    } else {
        None
    };
    Ok(SearchResults { receipts, next })
}

fn page_end(receipts: &[FoundReceipt]) -> SearchKey {
    let last = receipts.last().expect("a full page has a last receipt");
    SearchKey {
        finalized_at: last.finalized_at,
        receipt_id: last.receipt_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_reads_only_the_indexes_that_can_hold_it() {
        let with = |state| ReceiptFilter {
            state,
            ..ReceiptFilter::default()
        };
        // Two active indexes, and one status range per finished state.
        assert_eq!(with(None).sources().len(), 6);
        let held = ReceiptFilter {
            held: Some(true),
            ..ReceiptFilter::default()
        };
        assert_eq!(held.sources(), [Source::Fresh, Source::Retried]);
        assert_eq!(
            with(Some(StateFilter::Scheduled)).sources(),
            [Source::Fresh]
        );
        let owner = ReceiptFilter {
            owner: Some(WorkerId::parse("w").unwrap()),
            state: Some(StateFilter::Pending),
            ..ReceiptFilter::default()
        };
        assert!(owner.sources().is_empty());
        let finished = ReceiptFilter {
            finished_ms: Range {
                from: Some(1),
                to: None,
            },
            ..ReceiptFilter::default()
        };
        assert_eq!(finished.sources().len(), 4);
        let finished_pending = ReceiptFilter {
            state: Some(StateFilter::Pending),
            ..finished
        };
        assert!(finished_pending.sources().is_empty());
        let code = ReceiptFilter {
            code: Some(SettlementFailureCode::Rpc),
            ..ReceiptFilter::default()
        };
        assert_eq!(code.sources(), [Source::Failed(SettlementFailureCode::Rpc)]);
        assert!(!code.checks_rows());
        let code_and_owner_pending = ReceiptFilter {
            owner: Some(WorkerId::parse("w").unwrap()),
            state: Some(StateFilter::Pending),
            ..code
        };
        assert!(code_and_owner_pending.sources().is_empty());
    }

    #[test]
    fn the_cursor_bounds_the_range_instead_of_the_filter() {
        let filter = ReceiptFilter {
            finalized: Range {
                from: Some(10),
                to: Some(20),
            },
            ..ReceiptFilter::default()
        };
        let page = SearchPage {
            order: SearchOrder::Newest,
            limit: 5,
            after: Some(SearchKey {
                finalized_at: 15,
                receipt_id: "r".into(),
            }),
        };
        let s = statement(Dialect::Sqlite, &filter, &page, 0, 6)
            .unwrap()
            .unwrap();
        assert!(
            s.sql.contains("(finalized_at, receipt_id) < (?1, ?2)"),
            "{}",
            s.sql
        );
        assert!(s.sql.contains("finalized_at >= ?3"), "{}", s.sql);
        assert!(!s.sql.contains("finalized_at < ?"), "{}", s.sql);
        assert_eq!(s.sql.matches(" UNION ALL ").count(), 5, "{}", s.sql);
    }
}
