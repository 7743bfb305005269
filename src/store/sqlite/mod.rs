//! SQLite backend: one synchronous writer connection owned by a group-commit
//! thread (see [`group_commit`]), a small pool of sqlx readers, WAL with
//! `synchronous=FULL` so every acknowledged commit is durable.

mod act;
mod claim;
mod enqueue;
mod feed;
mod group_commit;
mod groups;
mod lease;
mod lookup;
mod open;
mod outcome;
mod read;
mod search;
mod stats;
mod values;

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::sqlite::SqlitePool;
use tokio::sync::Notify;

use super::fair::Turn;
use super::rules;
use crate::domain::{
    Claim, ClaimLimit, Claimed, GroupLimits, GroupName, LeaseMs, Outcome, ReceiptId, RetryPolicy,
    Route, SettlementStoreBinding, UnixMs, WorkerId,
};
use crate::store::{
    Acted, ActionResult, BackendKind, DeadLetter, DeadLetterCursor, DueClaims, Enqueued, FeedRead,
    FeedStart, GroupQuery, GroupView, NewReceipt, OperatorAction, ReceiptClaim, ReceiptFilter,
    ReceiptView, SearchPage, SearchResults, SettlementOutcomeStore, StatsMinute, StatusView,
    StoreResult, SweptGroups,
};
use enqueue::EnqueueItem;
use group_commit::Writer;
use lease::{ExtendItem, ReleaseItem};
use outcome::OutcomeItem;

/// The SQLite store.
pub struct SqliteStore {
    writer: Writer,
    reader: SqlitePool,
    binding: SettlementStoreBinding,
    notify: Arc<Notify>,
    /// Where the next claim's turn over the groups starts after.
    turn: Turn,
}

#[async_trait]
impl SettlementOutcomeStore for SqliteStore {
    fn settlement_store_binding(&self) -> SettlementStoreBinding {
        self.binding
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Sqlite
    }

    fn work_notifier(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM store_identity")
            .fetch_one(&self.reader)
            .await?;
        Ok(())
    }

    async fn enqueue(&self, receipts: &[NewReceipt], now_ms: UnixMs) -> StoreResult<Vec<Enqueued>> {
        let now = now_ms.as_i64();
        let items = receipts
            .iter()
            .map(|receipt| EnqueueItem {
                receipt: receipt.clone(),
                now,
            })
            .collect();
        let results = self.writer.enqueue(items).await?;
        if results.contains(&Enqueued::Created) {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn claim_receipt(
        &self,
        receipt_id: &ReceiptId,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        let now = now_ms.as_i64();
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let (id, worker) = (receipt_id.clone(), worker_id.clone());
        let found = self
            .writer
            .solo(move |conn| claim::claim_receipt(conn, &id, &worker, now, until))
            .await?;
        Ok(found)
    }

    async fn claim_from(
        &self,
        worker_id: &WorkerId,
        now_ms: UnixMs,
        lease_ms: LeaseMs,
        limit: ClaimLimit,
        only: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        let now = now_ms.as_i64();
        let until = rules::lease_deadline(now_ms, lease_ms.get())?;
        let (worker, only, turn) = (worker_id.clone(), only.to_vec(), self.turn.clone());
        self.writer
            .solo(move |conn| claim::claim_due(conn, &worker, now, until, limit, &only, &turn))
            .await
    }

    async fn groups(&self, now_ms: UnixMs, query: &GroupQuery) -> StoreResult<Vec<GroupView>> {
        groups::list(&self.reader, now_ms.as_i64(), query).await
    }

    async fn set_group(
        &self,
        group: &GroupName,
        limits: &GroupLimits,
        now_ms: UnixMs,
    ) -> StoreResult<()> {
        let now = now_ms.as_i64();
        let (group, limits) = (group.clone(), *limits);
        self.writer
            .solo(move |conn| groups::set_limits(conn, &group, &limits, now))
            .await?;
        // Resumed or raised: waiting claims look again.
        self.notify.notify_waiters();
        Ok(())
    }

    async fn forget_idle_groups(&self, after: &str, limit: usize) -> StoreResult<SweptGroups> {
        let after = after.to_owned();
        self.writer
            .solo(move |conn| groups::forget_idle(conn, &after, limit))
            .await
    }

    async fn record_claimed_outcomes(
        &self,
        outcomes: &[(Claim, Outcome)],
        policy: RetryPolicy,
        observed_at_ms: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        let items = outcomes
            .iter()
            .map(|(claim, input)| OutcomeItem {
                claim: claim.clone(),
                input: input.clone(),
                policy,
                observed_at_ms,
            })
            .collect();
        let results = self.writer.outcomes(items).await?;
        if results
            .iter()
            .any(|r| matches!(r, Ok(Route::RetryScheduled { .. })))
        {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        extend_ms: LeaseMs,
        now_ms: UnixMs,
    ) -> StoreResult<Claimed> {
        let until = rules::lease_deadline(now_ms, extend_ms.get())?;
        self.writer
            .extend(ExtendItem {
                claim: claim.clone(),
                now_ms,
                until,
            })
            .await
    }

    async fn release_lease(&self, claim: &Claim, now_ms: UnixMs) -> StoreResult<()> {
        self.writer
            .release(ReleaseItem {
                claim: claim.clone(),
                now_ms,
            })
            .await?;
        self.notify.notify_waiters();
        Ok(())
    }

    async fn receipt(
        &self,
        receipt_id: &ReceiptId,
        now_ms: UnixMs,
    ) -> StoreResult<Option<ReceiptView>> {
        read::view(&self.reader, receipt_id.as_str(), now_ms.as_i64()).await
    }

    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        read::dead_letters(&self.reader, limit, after).await
    }

    async fn dead_letter(&self, receipt_id: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        let mut conn = self.reader.acquire().await?;
        read::row(&mut conn, receipt_id.as_str())
            .await?
            .map_or(Ok(None), |r| r.dead_letter())
    }

    async fn act(
        &self,
        action: &OperatorAction,
        receipt_ids: &[ReceiptId],
        actor: Option<&str>,
        now_ms: UnixMs,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        let now = now_ms.as_i64();
        let (op, ids, who) = (
            action.clone(),
            receipt_ids.to_vec(),
            actor.map(str::to_owned),
        );
        let results = self
            .writer
            .solo(move |conn| act::act(conn, &op, &ids, who.as_deref(), now, dry_run))
            .await?;
        if action.may_make_due() && results.contains(&Ok(Acted::Done)) && !dry_run {
            self.notify.notify_waiters();
        }
        Ok(results)
    }

    async fn status(&self, now_ms: UnixMs, limit: usize) -> StoreResult<StatusView> {
        read::status(&self.reader, now_ms.as_i64(), limit).await
    }

    async fn purge_finished(&self, finished_before_ms: UnixMs, limit: usize) -> StoreResult<u64> {
        let before = finished_before_ms.as_i64();
        self.writer
            .solo(move |conn| feed::purge(conn, before, limit))
            .await
    }

    async fn history_feed(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
        let mut tx = self.reader.begin().await?;
        let read = super::feed::read(&mut feed::Reader(&mut tx), start, limit).await?;
        tx.commit().await?;
        Ok(read)
    }

    async fn add_stats(&self, minutes: &[StatsMinute], keep_from_ms: UnixMs) -> StoreResult<()> {
        let keep_from = keep_from_ms.as_i64();
        let minutes = minutes.to_vec();
        self.writer
            .background(move |conn| stats::add(conn, &minutes, keep_from))
            .await
    }

    async fn stats(&self, from_ms: UnixMs, to_ms: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        stats::read(&self.reader, from_ms.as_i64(), to_ms.as_i64()).await
    }

    async fn find_receipts(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now_ms: UnixMs,
    ) -> StoreResult<SearchResults> {
        search::find(&self.reader, filter, page, now_ms.as_i64()).await
    }
}

#[cfg(test)]
mod act_tests;
#[cfg(test)]
mod background_tests;
#[cfg(test)]
mod merge_tests;
#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod plan_tests;
#[cfg(test)]
mod test_support;
