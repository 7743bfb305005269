//! What many waiting long polls cost: the database looks they make are
//! bounded (not one per poll per wake-up and per 250 ms), and each still
//! answers close to its `wait_ms`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::{Value, json};
use settled::clock::SystemClock;
use settled::domain::*;
use settled::http::AppState;
use settled::store::*;
use tokio::sync::Notify;

use crate::common::Fresh;

/// A store that counts `claim_due` calls and passes everything on.
struct Counting {
    inner: SharedStore,
    claim_due: AtomicU64,
}

#[async_trait]
impl SettlementOutcomeStore for Counting {
    fn settlement_store_binding(&self) -> SettlementStoreBinding {
        self.inner.settlement_store_binding()
    }
    fn backend(&self) -> BackendKind {
        self.inner.backend()
    }
    fn work_notifier(&self) -> Arc<Notify> {
        self.inner.work_notifier()
    }
    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }
    async fn enqueue(&self, r: &[NewReceipt], now: UnixMs) -> StoreResult<Vec<Enqueued>> {
        self.inner.enqueue(r, now).await
    }
    async fn claim_receipt(
        &self,
        id: &ReceiptId,
        w: &WorkerId,
        now: UnixMs,
        lease: LeaseMs,
    ) -> StoreResult<ReceiptClaim> {
        self.inner.claim_receipt(id, w, now, lease).await
    }
    async fn claim_from(
        &self,
        w: &WorkerId,
        now: UnixMs,
        lease: LeaseMs,
        limit: ClaimLimit,
        only: &[GroupName],
    ) -> StoreResult<DueClaims<Claimed>> {
        self.claim_due.fetch_add(1, Ordering::Relaxed);
        self.inner.claim_from(w, now, lease, limit, only).await
    }
    async fn groups(&self, now: UnixMs, query: &GroupQuery) -> StoreResult<Vec<GroupView>> {
        self.inner.groups(now, query).await
    }
    async fn set_group(&self, g: &GroupName, l: &GroupLimits, now: UnixMs) -> StoreResult<()> {
        self.inner.set_group(g, l, now).await
    }
    async fn record_claimed_outcomes(
        &self,
        items: &[(Claim, Outcome)],
        policy: RetryPolicy,
        now: UnixMs,
    ) -> StoreResult<Vec<StoreResult<Route>>> {
        self.inner.record_claimed_outcomes(items, policy, now).await
    }
    async fn extend_lease(&self, c: &Claim, by: LeaseMs, now: UnixMs) -> StoreResult<Claimed> {
        self.inner.extend_lease(c, by, now).await
    }
    async fn release_lease(&self, c: &Claim, now: UnixMs) -> StoreResult<()> {
        self.inner.release_lease(c, now).await
    }
    async fn receipt(&self, id: &ReceiptId, now: UnixMs) -> StoreResult<Option<ReceiptView>> {
        self.inner.receipt(id, now).await
    }
    async fn dead_letters(
        &self,
        limit: usize,
        after: Option<DeadLetterCursor>,
    ) -> StoreResult<Vec<DeadLetter>> {
        self.inner.dead_letters(limit, after).await
    }
    async fn dead_letter(&self, id: &ReceiptId) -> StoreResult<Option<DeadLetter>> {
        self.inner.dead_letter(id).await
    }
    async fn act(
        &self,
        action: &OperatorAction,
        ids: &[ReceiptId],
        actor: Option<&str>,
        now: UnixMs,
        dry_run: bool,
    ) -> StoreResult<Vec<ActionResult>> {
        self.inner.act(action, ids, actor, now, dry_run).await
    }
    async fn status(&self, now: UnixMs, limit: usize) -> StoreResult<StatusView> {
        self.inner.status(now, limit).await
    }
    async fn purge_finished(&self, before: UnixMs, limit: usize) -> StoreResult<u64> {
        self.inner.purge_finished(before, limit).await
    }
    async fn history_feed(&self, start: FeedStart, limit: usize) -> StoreResult<FeedRead> {
        self.inner.history_feed(start, limit).await
    }
    async fn add_stats(&self, minutes: &[StatsMinute], keep_from_ms: UnixMs) -> StoreResult<()> {
        self.inner.add_stats(minutes, keep_from_ms).await
    }
    async fn stats(&self, from_ms: UnixMs, to_ms: UnixMs) -> StoreResult<Vec<StatsMinute>> {
        self.inner.stats(from_ms, to_ms).await
    }
    async fn find_receipts(
        &self,
        filter: &ReceiptFilter,
        page: &SearchPage,
        now: UnixMs,
    ) -> StoreResult<SearchResults> {
        self.inner.find_receipts(filter, page, now).await
    }
}

async fn many_waiting_polls_cost_few_looks_and_keep_their_wait(fresh: Fresh) {
    let polls = 300;
    let wait_ms = 2_000;
    let store = Arc::new(Counting {
        inner: fresh.store.clone(),
        claim_due: AtomicU64::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        store.clone(),
        RetryPolicy::default(),
        Arc::new(SystemClock),
        rx.clone(),
    );
    let mut stopped = rx;
    let server = tokio::spawn(settled::server::serve(listener, state, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..polls)
        .map(|i| {
            let (http, base) = (http.clone(), base.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let body: Value = http
                    .post(format!("{base}/v1/claims"))
                    .json(&json!({"worker_id": format!("w{i}"), "lease_ms": 60_000, "limit": 1, "wait_ms": wait_ms}))
                    .send()
                    .await
                    .expect("poll")
                    .json()
                    .await
                    .expect("json");
                (body["claims"].as_array().expect("claims").len(), started.elapsed())
            })
        })
        .collect();
    // One receipt in the middle of the wait wakes every poll; one gets it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let created = http
        .post(format!("{base}/v1/receipts"))
        .json(&json!({"receipt_id": "one", "finalized_at": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let mut got = 0;
    let mut longest = Duration::ZERO;
    for task in tasks {
        let (claimed, took) = task.await.unwrap();
        got += claimed;
        longest = longest.max(took);
    }
    let looks = store.claim_due.load(Ordering::Relaxed);
    assert_eq!(got, 1, "exactly one poll claimed the receipt");
    // One look each on arrival, a few after the wake-up and at the deadlines.
    // Before, every poll looked on the wake-up and every 250 ms: ~10 each.
    assert!(
        looks <= polls * 3 / 2,
        "{looks} database looks for {polls} polls"
    );
    // Loose: answers may queue behind each other on a loaded machine, but
    // nothing waits for more than its turn plus one look.
    assert!(
        longest < Duration::from_millis(wait_ms) + Duration::from_secs(10),
        "the slowest poll took {longest:?} for wait_ms {wait_ms}"
    );
    println!("{polls} polls, wait_ms {wait_ms}: {looks} looks, slowest answer {longest:?}");
    let _ = stop.send(true);
    server.await.unwrap().unwrap();
}

crate::on_every_backend!(many_waiting_polls_cost_few_looks_and_keep_their_wait);
