//! What many waiting long polls cost: the database looks they make are
//! bounded (not one per poll per wake-up and per 250 ms), and each still
//! answers close to its `wait_ms`, counted from the request's arrival.

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

/// A store that counts `claim_due` calls, takes `record_delay` longer to
/// record outcomes, and passes everything on.
struct Counting {
    inner: SharedStore,
    claim_due: AtomicU64,
    record_delay: Duration,
}

impl Counting {
    fn new(inner: SharedStore, record_delay: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            claim_due: AtomicU64::new(0),
            record_delay,
        })
    }
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
        tokio::time::sleep(self.record_delay).await;
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
    async fn forget_idle_groups(&self, after: &str, limit: usize) -> StoreResult<SweptGroups> {
        self.inner.forget_idle_groups(after, limit).await
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

/// The service on `store`, on a port of its own: its address, its stop
/// signal and its task.
async fn serve(
    store: Arc<Counting>,
) -> (
    String,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let state = AppState::new(
        store,
        RetryPolicy::default(),
        Arc::new(SystemClock),
        rx.clone(),
    );
    let mut stopped = rx;
    let server = tokio::spawn(settled::server::serve(listener, state, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    (base, stop, server)
}

async fn many_waiting_polls_cost_few_looks_and_keep_their_wait(fresh: Fresh) {
    let polls = 300;
    let wait_ms = 2_000;
    let store = Counting::new(fresh.store.clone(), Duration::ZERO);
    let (base, stop, server) = serve(store.clone()).await;
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

/// A claim's `wait_ms` counts from its arrival, the recording of the
/// outcomes it carries included: outcomes that take 1.5 s to record and a
/// wait of 1 s with nothing due are answered when the recording ends, not
/// 1 s after (which would be at least 2.5 s).
async fn a_claims_wait_counts_from_its_arrival(fresh: Fresh) {
    let store = Counting::new(fresh.store.clone(), Duration::from_millis(1_500));
    let (base, stop, server) = serve(store).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| http.post(format!("{base}{path}")).json(&body).send();
    let created = post(
        "/v1/receipts",
        json!({"receipt_id": "a", "finalized_at": 1}),
    )
    .await
    .unwrap();
    assert_eq!(created.status(), 201);
    let claim = json!({"worker_id": "w", "lease_ms": 60_000, "limit": 1});
    let first: Value = post("/v1/claims", claim)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let held = first["claims"][0].clone();
    assert_eq!(held["receipt_id"], "a", "{first}");
    let started = Instant::now();
    let body = json!({"worker_id": "w", "lease_ms": 60_000, "limit": 1, "wait_ms": 1_000,
        "outcomes": [{"claim": held, "outcome": {"kind": "accepted", "transcript_id": "tx"}}]});
    let answer: Value = post("/v1/claims", body)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        answer["results"][0]["route"]["kind"], "no_action",
        "{answer}"
    );
    assert_eq!(answer["claims"], json!([]), "{answer}");
    assert!(
        took >= Duration::from_millis(1_500) && took < Duration::from_millis(2_400),
        "answered after {took:?}"
    );
    let _ = stop.send(true);
    server.await.unwrap().unwrap();
}

crate::on_every_backend!(
    many_waiting_polls_cost_few_looks_and_keep_their_wait,
    a_claims_wait_counts_from_its_arrival,
);
