//! The reference model: the rules of docs/concepts.md as a map of receipts, written
//! independently of the stores it judges.

use std::collections::BTreeMap;

use serde_json::Value;
use settled::domain::*;
use settled::store::{
    DeadLetter, Enqueued, FailureView, HistoryEntry, LeaseView, NewReceipt, ReceiptState,
    ReceiptView,
};

#[derive(Debug, Clone)]
pub enum Status {
    Active,
    Settled(String),
    Skipped(SettlementSkipReason),
    Dead {
        attempts: u32,
        code: SettlementFailureCode,
        sha: String,
        at: u64,
    },
}

#[derive(Debug, Clone)]
pub struct Row {
    pub finalized_at: u64,
    pub observation: Option<Value>,
    pub status: Status,
    pub attempts: u32,
    pub row_version: u64,
    pub next_visible: Option<u64>,
    pub lease: Option<(String, String, u64)>,
    pub last_failure: Option<(SettlementFailureCode, String)>,
    pub history: Vec<HistoryEntry>,
    pub priority: i64,
}

pub type Answer<T> = Result<T, StoreErrorClass>;
pub const CONFLICT: StoreErrorClass = StoreErrorClass::Conflict;

#[derive(Default)]
pub struct Model {
    pub rows: BTreeMap<String, Row>,
}

pub fn entry(attempt: u32, outcome: &str, worker: &str, at: u64) -> HistoryEntry {
    HistoryEntry {
        attempt,
        outcome: outcome.into(),
        code: None,
        detail_sha256: None,
        rail_code: None,
        transcript_id: None,
        reason: None,
        worker_id: worker.into(),
        observed_at_ms: at,
        route: None,
        actor: None,
        note: None,
        retry_after_ms: None,
    }
}

impl Row {
    pub fn state(&self, now: u64) -> ReceiptState {
        match &self.status {
            Status::Active if self.lease.as_ref().is_some_and(|l| l.2 > now) => {
                ReceiptState::Leased
            }
            Status::Active if self.attempts == 0 => ReceiptState::Pending,
            Status::Active => ReceiptState::RetryScheduled,
            Status::Settled(_) => ReceiptState::Settled,
            Status::Skipped(_) => ReceiptState::Skipped,
            Status::Dead { .. } => ReceiptState::DeadLettered,
        }
    }

    pub fn claimable(&self, now: u64) -> bool {
        matches!(self.status, Status::Active)
            && self.next_visible.is_some_and(|v| v <= now)
            && self.lease.as_ref().is_none_or(|l| l.2 <= now)
    }

    /// The six-field compare-and-swap plus an unexpired lease.
    pub fn matches(&self, c: &Claim, now: u64) -> bool {
        matches!(self.status, Status::Active)
            && c.finalized_at == self.finalized_at
            && self.attempts == c.attempts
            && c.row_version == self.row_version
            && self.lease.as_ref().is_some_and(|(owner, token, until)| {
                c.lease_owner == owner.as_str()
                    && c.lease_token == token.as_str()
                    && c.lease_until_ms == *until
            })
            && now < c.lease_until_ms.get()
    }

    pub fn dead_letter(&self, id: &str) -> Option<DeadLetter> {
        let Status::Dead {
            attempts,
            code,
            sha,
            at,
        } = &self.status
        else {
            return None;
        };
        Some(DeadLetter {
            receipt_id: id.into(),
            finalized_at: self.finalized_at,
            attempts: *attempts,
            code: *code,
            detail_sha256: sha.clone(),
            last_failure: FailureView {
                code: *code,
                detail_sha256: sha.clone(),
                rail_code: None,
            },
            dead_lettered_at_ms: *at,
            group: "default".into(),
        })
    }

    pub fn view(&self, id: &str, now: u64) -> ReceiptView {
        let state = self.state(now);
        ReceiptView {
            receipt_id: id.into(),
            finalized_at: self.finalized_at,
            state,
            attempts: self.attempts,
            row_version: self.row_version,
            next_visible_at_ms: self.next_visible,
            held_at_ms: None,
            cancel_reason: None,
            lease: self
                .lease
                .as_ref()
                .filter(|_| state == ReceiptState::Leased)
                .map(|(owner, _, until)| LeaseView {
                    owner: owner.clone(),
                    until_ms: *until,
                }),
            last_failure: self
                .last_failure
                .clone()
                .map(|(code, detail_sha256)| FailureView {
                    code,
                    detail_sha256,
                    rail_code: None,
                }),
            transcript_id: match &self.status {
                Status::Settled(t) => Some(t.clone()),
                _ => None,
            },
            skip_reason: match &self.status {
                Status::Skipped(r) => Some(*r),
                _ => None,
            },
            dead_letter: self.dead_letter(id),
            observation: self.observation.clone(),
            history: self.history.clone(),
            group: "default".into(),
            priority: self.priority,
        }
    }
}

impl Model {
    pub fn enqueue(&mut self, r: &NewReceipt, now: u64) -> Enqueued {
        let id = r.receipt_id.as_str();
        if let Some(row) = self.rows.get(id) {
            let null = |o: &Option<Value>| o.clone().filter(|v| !v.is_null());
            let same = row.finalized_at == r.finalized_at
                && null(&row.observation) == null(&r.observation)
                && row.priority == r.priority.get();
            return if same {
                Enqueued::Existing
            } else {
                Enqueued::Conflict
            };
        }
        let row = Row {
            finalized_at: r.finalized_at,
            observation: r.observation.clone(),
            status: Status::Active,
            attempts: 0,
            row_version: 0,
            next_visible: Some(r.visible_at_ms.map_or(now, UnixMs::get)),
            lease: None,
            last_failure: None,
            history: Vec::new(),
            priority: r.priority.get(),
        };
        self.rows.insert(id.into(), row);
        Enqueued::Created
    }

    /// The claim the model expects, with the store's token.
    pub fn lease(&mut self, id: &str, worker: &str, now: u64, lease: u64, token: &str) -> Claimed {
        let row = self.rows.get_mut(id).unwrap();
        let after_expiry = row.lease.is_some();
        let due = row.next_visible.unwrap();
        let queued_since_ms = row.lease.as_ref().map_or(due, |l| l.2.max(due));
        row.row_version += 1;
        row.lease = Some((worker.into(), token.into(), now + lease));
        Claimed {
            claim: Claim {
                receipt_id: ReceiptId::parse(id).unwrap(),
                finalized_at: U63::try_from(row.finalized_at).unwrap(),
                attempts: row.attempts,
                row_version: U63::try_from(row.row_version).unwrap(),
                lease_owner: WorkerId::parse(worker).unwrap(),
                lease_token: LeaseToken::parse(token).unwrap(),
                lease_until_ms: U63::try_from(now + lease).unwrap(),
            },
            observation: row.observation.clone(),
            group: GroupName::default_group(),
            priority: Priority::parse(row.priority).unwrap(),
            after_expiry,
            queued_since_ms,
            trace: None,
        }
    }

    pub fn due(&self, now: u64, limit: usize) -> Vec<String> {
        let mut due: Vec<_> = self.rows.iter().filter(|(_, r)| r.claimable(now)).collect();
        // Highest priority first, then oldest due (docs/groups.md).
        due.sort_by_key(|(id, r)| (std::cmp::Reverse(r.priority), r.next_visible, (*id).clone()));
        due.into_iter()
            .take(limit)
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn record(
        &mut self,
        c: &Claim,
        input: &Outcome,
        p: RetryPolicy,
        now: u64,
    ) -> Answer<Route> {
        let Some(row) = self.rows.get_mut(c.receipt_id.as_str()) else {
            return Err(CONFLICT);
        };
        let failure = input.failure().map(|f| (f.code, f.detail_sha256.clone()));
        if !row.matches(c, now) {
            // Only an identical dead-letter decision, under the claim that
            // made it, is answered again.
            if let Status::Dead {
                attempts,
                code,
                sha,
                ..
            } = &row.status
            {
                let same = failure.as_ref() == Some(&(*code, sha.clone()))
                    && c.row_version == row.row_version
                    && c.finalized_at == row.finalized_at
                    && c.attempts + 1 == *attempts;
                if same {
                    return Ok(Route::DeadLettered {
                        attempts: *attempts,
                    });
                }
            }
            return Err(CONFLICT);
        }
        let invocation = c.attempts + 1;
        let mut h = entry(invocation, input.kind(), c.lease_owner.as_str(), now);
        h.code = failure.as_ref().map(|f| f.0);
        // Recorded as the worker reported it, whatever the route.
        h.retry_after_ms = input.retry_after_ms();
        h.detail_sha256 = failure.as_ref().map(|f| f.1.clone());
        row.lease = None;
        let route = match input {
            Outcome::Accepted { transcript_id } => {
                h.transcript_id = Some(transcript_id.as_str().into());
                row.status = Status::Settled(transcript_id.as_str().into());
                row.next_visible = None;
                Route::NoAction
            }
            Outcome::Skipped { reason } => {
                h.reason = Some(*reason);
                row.status = Status::Skipped(*reason);
                row.next_visible = None;
                Route::NoAction
            }
            Outcome::Retryable { reason, .. }
                if matches!(
                    reason.code,
                    SettlementFailureCode::Rpc | SettlementFailureCode::Backend
                ) && c.attempts < p.max_retries() =>
            {
                // The longer of the backoff and the rail's wait, never beyond the cap.
                let wait = (p.initial_backoff_ms()
                    * u64::from(p.backoff_multiplier()).pow(c.attempts))
                .max(input.retry_after_ms().unwrap_or(0))
                .min(p.backoff_cap_ms());
                row.attempts = invocation;
                row.next_visible = Some(now + wait);
                row.last_failure = failure.clone();
                Route::RetryScheduled {
                    attempt: invocation,
                    next_visible_at_ms: now + wait,
                }
            }
            Outcome::Retryable { reason, .. } | Outcome::Permanent { reason } => {
                row.status = Status::Dead {
                    attempts: invocation,
                    code: reason.code,
                    sha: reason.detail_sha256.clone(),
                    at: now,
                };
                row.attempts = invocation;
                row.next_visible = None;
                row.last_failure = failure.clone();
                Route::DeadLettered {
                    attempts: invocation,
                }
            }
        };
        h.route = Some(route.kind().into());
        row.history.push(h);
        Ok(route)
    }

    pub fn extend(&mut self, c: &Claim, extend: u64, now: u64) -> Answer<Claimed> {
        let row = self
            .rows
            .get_mut(c.receipt_id.as_str())
            .filter(|r| r.matches(c, now))
            .ok_or(CONFLICT)?;
        row.lease.as_mut().unwrap().2 = now + extend;
        Ok(Claimed {
            claim: Claim {
                lease_until_ms: U63::try_from(now + extend).unwrap(),
                ..c.clone()
            },
            observation: row.observation.clone(),
            group: GroupName::default_group(),
            priority: Priority::parse(row.priority).unwrap(),
            after_expiry: false,
            queued_since_ms: row.next_visible.unwrap(),
            trace: None,
        })
    }

    pub fn release(&mut self, c: &Claim, now: u64) -> Answer<()> {
        let row = self
            .rows
            .get_mut(c.receipt_id.as_str())
            .filter(|r| r.matches(c, now))
            .ok_or(CONFLICT)?;
        row.lease = None;
        row.next_visible = Some(now);
        row.history
            .push(entry(c.attempts, "released", c.lease_owner.as_str(), now));
        Ok(())
    }

    pub fn redrive(&mut self, id: &str, now: u64) -> Option<ReceiptView> {
        let row = self.rows.get_mut(id)?;
        let Status::Dead { attempts, .. } = row.status else {
            return None;
        };
        row.status = Status::Active;
        row.attempts = 0;
        row.next_visible = Some(now);
        row.history
            .push(entry(attempts, "redrive", "operator", now));
        Some(row.view(id, now))
    }
}
