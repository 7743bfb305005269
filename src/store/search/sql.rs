//! The statement a search runs on either backend, and the page made from
//! the rows it returns (see the parent module for the plan).

use super::super::rows::{ReceiptRow, to_i64, to_u64};
use super::super::{Status, StoreResult};
use super::{
    FoundReceipt, ReceiptFilter, SearchKey, SearchOrder, SearchPage, SearchResults, StateFilter,
};
use crate::domain::SettlementFailureCode;

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
    Finished(Status),
    /// Last failed with this code (`receipts_failed`).
    Failed(SettlementFailureCode),
}

/// The columns a search reads, as a [`ReceiptRow`] (no observation, no token).
pub const SEARCH_COLUMNS: &str = "receipt_id, finalized_at, NULL AS observation, status, \
     attempts, row_version, next_visible_at_ms, lease_owner, NULL AS lease_token, \
     lease_until_ms, failure_code, failure_sha256, NULL AS transcript_id, NULL AS skip_reason, \
     finished_at_ms, held_at_ms, NULL AS cancel_reason, receipt_group, priority, \
     NULL AS traceparent, NULL AS tracestate, failure_rail_code";

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
    let ask = Ask {
        filter,
        page,
        now,
        order: &order,
    };
    let mut arms = Vec::new();
    for source in sources {
        for range in ranges(dialect, source) {
            arms.push(arm(&mut b, source, range, ask)?);
        }
    }
    if dialect == Dialect::Postgres && arms.len() > 1 {
        // PostgreSQL merges arms lazily (`Merge Append`) only when each is
        // ordered and limited itself; otherwise it sorts them all.
        for arm in &mut arms {
            *arm = format!("({arm} {order})");
        }
    }
    let sql = format!("{} {order}", arms.join(" UNION ALL "));
    Ok(Some(Statement {
        sql,
        binds: b.binds,
    }))
}

/// One index range of a source: the index and the condition that selects
/// it, repeating the index's own predicate word for word (SQLite uses a
/// partial index only then).
#[derive(Debug, Clone, Copy)]
struct Range {
    index: &'static str,
    condition: &'static str,
    leases: Leases,
}

/// Which rows of a range hold a lease (live or lapsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leases {
    /// Rows with and without one.
    Mixed,
    /// No row holds one.
    Without,
    /// Every row holds one.
    Only,
}

/// The index ranges that hold a source's rows. On PostgreSQL the fresh and
/// retried indexes leave out leased rows (a claim's new row version then
/// adds no entry to them: migrations/postgres/0018_fresh_without_leases.sql),
/// so those sources also read their rows in `receipts_leases`.
fn ranges(dialect: Dialect, source: Source) -> Vec<Range> {
    let range = |index, condition, leases| Range {
        index,
        condition,
        leases,
    };
    match (dialect, source) {
        (Dialect::Sqlite, Source::Fresh) => vec![range(
            "receipts_fresh",
            "status = 'active' AND attempts = 0",
            Leases::Mixed,
        )],
        (Dialect::Sqlite, Source::Retried) => vec![range(
            "receipts_retried",
            "status = 'active' AND attempts > 0",
            Leases::Mixed,
        )],
        (Dialect::Postgres, Source::Fresh) => vec![
            range(
                "receipts_fresh",
                "status = 'active' AND attempts = 0 AND lease_token IS NULL",
                Leases::Without,
            ),
            range("receipts_leases", "attempts = 0", Leases::Only),
        ],
        (Dialect::Postgres, Source::Retried) => vec![
            range(
                "receipts_retried",
                "status = 'active' AND attempts > 0 AND lease_token IS NULL",
                Leases::Without,
            ),
            range("receipts_leases", "attempts > 0", Leases::Only),
        ],
        (_, Source::Leases) => vec![range("receipts_leases", "", Leases::Only)],
        (_, Source::Finished(_)) => vec![range("receipts_by_status", "", Leases::Without)],
        (_, Source::Failed(_)) => vec![range("receipts_failed", "", Leases::Mixed)],
    }
}

/// What a search asks, the same for each of its ranges.
#[derive(Clone, Copy)]
struct Ask<'a> {
    filter: &'a ReceiptFilter,
    page: &'a SearchPage,
    now: i64,
    /// The statement's `ORDER BY … LIMIT`.
    order: &'a str,
}

/// One range's rows after the page's start, as a `SELECT` without order.
fn arm(b: &mut Builder, source: Source, range: Range, ask: Ask<'_>) -> StoreResult<String> {
    let Ask {
        filter,
        page,
        now,
        order,
    } = ask;
    let mut conditions = Vec::new();
    if !range.condition.is_empty() {
        conditions.push(range.condition.to_owned());
    }
    match source {
        Source::Leases => {
            let now = b.push(Bind::Int(now));
            conditions.push(format!("lease_until_ms > {now}"));
        }
        Source::Finished(status) => conditions.push(format!(
            "status = '{}' AND status <> 'active'",
            status.as_str()
        )),
        Source::Failed(code) => {
            let code = b.push(Bind::Text(code.as_str().to_owned()));
            conditions.push(format!(
                "failure_code = {code} AND failure_code IS NOT NULL"
            ));
        }
        Source::Fresh | Source::Retried => {}
    }
    // Active sources skip live leases when a state without them is asked
    // for; stepping over them costs at most the leases handed out.
    let active = matches!(source, Source::Fresh | Source::Retried);
    let skip_leases = active
        && matches!(
            filter.state,
            Some(StateFilter::Pending | StateFilter::Scheduled | StateFilter::RetryScheduled)
        );
    // The leased rows of an active source, apart (PostgreSQL: see `ranges`).
    let leased_part = active && range.leases == Leases::Only;
    match range.leases {
        Leases::Only if leased_part && skip_leases => {
            let now = b.push(Bind::Int(now));
            conditions.push(format!("lease_until_ms <= {now}"));
        }
        Leases::Only if leased_part => {
            conditions.push("lease_until_ms IS NOT NULL".to_owned());
        }
        Leases::Mixed if skip_leases => {
            let now = b.push(Bind::Int(now));
            conditions.push(format!(
                "(lease_until_ms IS NULL OR lease_until_ms <= {now})"
            ));
        }
        _ => {}
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
        Dialect::Sqlite => format!(" INDEXED BY {}", range.index),
        Dialect::Postgres => String::new(),
    };
    let conditions = conditions.join(" AND ");
    if leased_part {
        // The leases are in lease order, so this range is sorted: sort only
        // the keys (in the index), then read each row as the merge asks for
        // it. `finalized_at = k.key_at` (true of the same row) tells the
        // planner that the rows come in the keys' order, so it sorts no more.
        return Ok(format!(
            "SELECT r.* FROM (SELECT receipt_id AS key_id, finalized_at AS key_at \
             FROM receipts WHERE {conditions} {order}) AS k CROSS JOIN LATERAL \
             (SELECT {SEARCH_COLUMNS} FROM receipts \
              WHERE receipt_id = k.key_id AND finalized_at = k.key_at) AS r"
        ));
    }
    Ok(format!(
        "SELECT {SEARCH_COLUMNS} FROM receipts{indexed} WHERE {conditions}"
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
