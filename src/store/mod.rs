//! The store: one trait, one implementation per backend.

pub mod actions;
pub mod carried;
mod connect;
mod error;
mod explain;
pub mod fair;
mod feed;
mod group_list;
mod idle_groups;
mod new_receipt;
pub mod postgres;
mod row_status;
mod rows;
mod rules;
pub mod search;
pub mod sqlite;
mod stats;
mod status;
mod views;
mod walk;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

pub use actions::{Acted, ActionRefusal, ActionResult, OperatorAction};
pub use carried::{ClaimAsk, Reported};
pub use connect::{OpenError, open_store};
pub use fair::DueClaims;
pub use feed::{BadFeedPosition, FeedEntry, FeedPosition, FeedRead, FeedStart};
pub use group_list::{GLANCE_GROUPS, GroupQuery};
pub use idle_groups::{PAGE as IDLE_GROUPS_PAGE, SweptGroups};
pub use new_receipt::{Enqueued, NewReceipt};
pub use row_status::Status;
pub use search::{ReceiptFilter, SearchOrder, SearchPage, SearchResults};
pub use stats::{STATS_KEEP_MS, STATS_MINUTE_MS, StatsCounts, StatsMinute, minute_of};
pub use views::*;

use crate::domain::{
    Claim, ClaimLimit, Claimed, GroupLimits, GroupName, LeaseMs, Outcome, ReceiptId, RetryPolicy,
    Route, SettlementStoreBinding, StoreError, UnixMs, WorkerId,
};

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

/// What claiming one receipt by id found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptClaim {
    /// Leased to the caller (boxed: it is many times the other answers).
    Claimed(Box<Claimed>),
    /// A live lease holds it.
    Leased,
    /// It is not visible yet (`next_visible_at_ms` in the future).
    NotYetVisible,
    /// An operator holds it.
    Held,
    /// Its group's limits do not let it be claimed now (`paused`: the
    /// group is paused; otherwise a cap or a rate holds it back).
    GroupLimited { paused: bool },
    /// Unknown, or finished (settled, skipped, dead-lettered).
    NoActiveWork,
}

/// Position after which a dead-letter page starts: `(finalized_at, receipt_id)`.
pub type DeadLetterCursor = (u64, String);

/// Which database this server stores receipts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Sqlite,
    Postgres,
}

impl BackendKind {
    /// `sqlite` or `postgres`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// Atomic leased store for settlement receipts and their outcomes.
///
/// Every method takes the server clock as an argument (`now_ms`, a
/// [`UnixMs`]: a time the database can hold, so no backend checks one), so
/// that the store never reads a clock of its own and tests can drive time.
#[async_trait]
pub trait SettlementOutcomeStore: Send + Sync {
    /// Identify the durable writer that owns this outcome store.
    fn settlement_store_binding(&self) -> SettlementStoreBinding;

    /// Which backend this is.
    fn backend(&self) -> BackendKind;

    /// Signalled after a commit that may have made work due (enqueue, release, redrive).
    fn work_notifier(&self) -> Arc<Notify>;

    /// Database reachable, migrated, and taking writes.
    async fn ping(&self) -> StoreResult<()>;

    /// Which database server this replica writes to, where there may be
    /// several (PostgreSQL); `None` where there is one file (SQLite).
    fn writer(&self) -> Option<postgres::WriterState> {
        None
    }

    /// The database server's clock in Unix ms, where the database has one that
    /// every replica shares (PostgreSQL); `None` where the server's own clock
    /// is the only one (SQLite, one process).
    async fn database_clock_ms(&self) -> StoreResult<Option<u64>> {
        Ok(None)
    }

    /// Store receipts, each judged on its own, in one durable transaction.
    async fn enqueue(&self, receipts: &[NewReceipt], now_ms: UnixMs) -> StoreResult<Vec<Enqueued>>;

    /// Claim one receipt by id.
    async fn claim_receipt(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim>;

    /// Claim up to `limit` due receipts of the groups in `only` (empty: every
    /// group), spread over the groups round robin, oldest due first within a
    /// group, within each group's limits (docs/groups.md); all or nothing.
    async fn claim_from(
        &self,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
        only: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>>;

    /// The groups `query` asks for, by name, with their limits and figures
    /// at `now_ms`.
    async fn groups(&self, now_ms: UnixMs, query: &GroupQuery) -> StoreResult<Vec<GroupView>>;

    /// Set a group's limits, creating the group if it is new. Takes effect
    /// at the next claim of every replica.
    async fn set_group(
        &self,
        group: &GroupName,
        limits: &GroupLimits,
        now_ms: UnixMs,
    ) -> StoreResult<()>;

    /// One page of a sweep of the group rows named after `after` (`""`: from
    /// the first), at most `limit`: forget those of idle groups, with no
    /// limits set and no active receipt (docs/groups.md).
    async fn forget_idle_groups(&self, after: &str, limit: usize) -> StoreResult<SweptGroups>;

    /// Atomically commit outcomes for exact, unexpired claims, each judged on
    /// its own, in one durable transaction.
    ///
    /// `observed_at_ms` is both the lease-validity check time and the base for
    /// any retry visibility deadline.
    async fn record_claimed_outcomes(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>>;

    /// Record `outcomes` as [`Self::record_claimed_outcomes`] does at
    /// `ask.now_ms`, then claim as [`Self::claim_from`] does (src/store/carried.rs).
    /// `Err`: nothing was recorded, unless the answer of its commit was lost.
    async fn record_and_claim(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        ask: ClaimAsk<'_>,
    ) -> StoreResult<Reported> {
        carried::one_after_the_other(self, outcomes, policy, ask).await
    }

    /// Move the lease deadline to `now + extend_ms`; same token and version.
    async fn extend_lease(
        &self,
        claim: &Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    ) -> StoreResult<Claimed>;

    /// Give the lease back: due again at once, attempts unchanged.
    async fn release_lease(&self, claim: &Claim, now_ms: UnixMs) -> StoreResult<()>;

    /// A receipt's state and history.
    async fn receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>>;

    /// A page of dead letters ordered by `(finalized_at, receipt_id)`.
    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>>;

    /// One dead letter.
    async fn dead_letter(&self, receipt_id: &ReceiptId) -> StoreResult<Option<DeadLetter>>;

    /// Do an operator's action to each receipt, each judged on its own (see
    /// [`actions::judge`]), with a history entry naming `actor` for each one
    /// changed, in one durable transaction. A dry run judges and changes
    /// nothing.
    async fn act(
        &self,
        action: &OperatorAction,
        receipt_ids: &[ReceiptId],
        actor: Option<&str>,
        now_ms: UnixMs,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>>;

    /// Counts per state, the oldest due age, and up to `limit` receipts per
    /// state (the groups are added by [`Self::status_at_a_glance`]).
    async fn status(&self, now_ms: UnixMs, limit: usize) -> StoreResult<StatusView>;

    /// Delete up to `limit` settled or skipped receipts (and their history)
    /// that finished before `finished_before_ms`; returns how many. Active
    /// work and dead letters are never touched.
    async fn purge_finished(&self, finished_before_ms: UnixMs, limit: usize) -> StoreResult<u64>;

    /// Whether this replica does the upkeep shared by all replicas of the
    /// store (retention passes, vacuum) now: one of them does at a time.
    fn does_upkeep(&self) -> bool {
        true
    }

    /// Where another replica takes this replica's claims and outcomes
    /// (src/http/middleware/forward.rs); `None`: this one serves them.
    fn forward_to(&self) -> Option<String> {
        None
    }

    // The history feed (GET /v1/history).

    /// Up to `limit` history entries after `start` in commit order, across
    /// replicas: once a position is returned, no entry ever appears before
    /// it. `Expired` when retention deleted entries after `start` that the
    /// caller never read; `purge_finished` records how far it deleted.
    async fn history_feed(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead>;

    // Rates over the last hour (`GET /v1/stats`, src/store/stats.rs).

    /// Add one server's counts to the per-minute series, in one transaction:
    /// counters add to what is stored (so calls and servers sum up), a
    /// minute's `depth` becomes the latest sample given (`None` keeps it);
    /// then minutes before `keep_from_ms` are deleted.
    async fn add_stats(&self, minutes: &[StatsMinute], keep_from_ms: UnixMs) -> StoreResult<()>;

    /// The stored minutes with `minute_ms` in `[from_ms, to_ms)`, oldest first.
    async fn stats(&self, from_ms: UnixMs, to_ms: UnixMs) -> StoreResult<Vec<StatsMinute>>;

    // Find receipts (`GET /v1/receipts`, src/store/search.rs).

    /// A page of the receipts matching `filter` at `now_ms`, in
    /// `(finalized_at, receipt_id)` order, from one snapshot. Examines a
    /// bounded number of index entries: the page may hold fewer than
    /// `page.limit` receipts while `next` is set; `next` is `None` only when
    /// no match is left.
    async fn find_receipts(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: UnixMs,
    ) -> StoreResult<SearchResults>;
}

/// Convenience wrappers kept out of the trait so it stays small and object-safe.
impl<'a> dyn SettlementOutcomeStore + 'a {
    /// Commit one outcome (see [`SettlementOutcomeStore::record_claimed_outcomes`]).
    pub async fn record_claimed_outcome(
        &self,
        claim: &Claim,
        outcome: &Outcome,
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Route> {
        let items = [(claim.clone(), outcome.clone())];
        let mut results = self
            .record_claimed_outcomes(&items, policy, observed_at_ms)
            .await?;
        results
            .pop()
            .unwrap_or_else(|| Err(StoreError::internal("no result")))
    }

    /// Extend many leases, each judged on its own (see
    /// [`SettlementOutcomeStore::extend_lease`]). They are queued together,
    /// so each backend's write coalescing merges them into few commits
    /// (SQLite: groups of up to 512 requests; PostgreSQL: an idle writer task
    /// takes one alone, the rest queue and merge), not one per lease.
    pub async fn extend_leases(
        &self,
        items: &[(Claim, LeaseMs)],
        now_ms: UnixMs,
    ) -> Vec<StoreResult<Claimed>> {
        futures_util::future::join_all(
            items
                .iter()
                .map(|(claim, extend_ms)| self.extend_lease(claim, *extend_ms, now_ms)),
        )
        .await
    }

    /// Claim up to `limit` due receipts of every group (see
    /// [`SettlementOutcomeStore::claim_from`]).
    pub async fn claim_due(
        &self,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
    ) -> StoreResult<Vec<Claimed>> {
        let due = self
            .claim_from(worker_id, now_ms, lease_ms, limit, &[])
            .await?;
        Ok(due.claims)
    }

    /// Put a dead letter back to work with attempts 0; `None` when it is not
    /// dead-lettered.
    pub async fn redrive(
        &self,
        receipt_id: &ReceiptId,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>> {
        let ids = std::slice::from_ref(receipt_id);
        let done = self
            .act(&OperatorAction::Redrive, ids, None, now_ms, false)
            .await?;
        if done.first() != Some(&Ok(Acted::Done)) {
            return Ok(None);
        }
        self.receipt(receipt_id, now_ms).await
    }

    /// [`SettlementOutcomeStore::status`] with the first groups' figures,
    /// read side by side (each is a snapshot of its own, as before).
    pub async fn status_at_a_glance(
        &self,
        now_ms: UnixMs,
        limit: usize,
    ) -> StoreResult<StatusView> {
        let glance = GroupQuery::at_a_glance();
        let (status, groups) =
            tokio::join!(self.status(now_ms, limit), self.groups(now_ms, &glance));
        let mut status = status?;
        status.groups = groups?;
        Ok(status)
    }

    /// Enqueue one receipt.
    pub async fn enqueue_one(&self, receipt: &NewReceipt, now_ms: UnixMs) -> StoreResult<Enqueued> {
        let mut results = self.enqueue(std::slice::from_ref(receipt), now_ms).await?;
        results
            .pop()
            .ok_or_else(|| StoreError::internal("no result"))
    }
}

/// A shared store handle, as the HTTP layer holds it.
pub type SharedStore = Arc<dyn SettlementOutcomeStore>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_store_trait_is_object_safe() {
        fn accepts_trait_object(_store: &dyn SettlementOutcomeStore) {}
        let _ = accepts_trait_object;
    }
}
