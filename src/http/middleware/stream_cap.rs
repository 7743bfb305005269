//! Caps on open event streams (`GET /v1/history` as `text/event-stream`),
//! in all and per caller (docs/operators.md, "Limits"). A stream holds its
//! connection for as long as it is open, so without a cap a reader could
//! hold every connection the server allows and lock out workers, producers
//! and health checks. The caps sit well below `--max-connections`, so that
//! room is always left for ordinary requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::http::middleware::auth::Caller;

/// Default of `--max-streams`.
pub const MAX_STREAMS: usize = 64;
/// Default of `--max-streams-per-caller`.
pub const MAX_STREAMS_PER_CALLER: usize = 16;
/// What a refused stream is told to wait before trying again, in seconds.
pub const RETRY_AFTER_S: u64 = 10;

/// How many streams may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// In all.
    pub total: usize,
    /// Per token (without tokens, every caller is one caller).
    pub per_caller: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            total: MAX_STREAMS,
            per_caller: MAX_STREAMS_PER_CALLER,
        }
    }
}

/// Which cap refused a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total(usize),
    PerCaller(usize),
}

/// Whose stream it is: a token's key, `None` without a token.
type CallerKey = Option<[u8; 8]>;

/// The streams open on one server.
#[derive(Debug, Default)]
pub struct Streams {
    limits: StreamLimits,
    /// Open in all, and per caller.
    open: Mutex<(usize, HashMap<CallerKey, usize>)>,
}

/// Held for as long as one admitted stream is open.
#[derive(Debug)]
pub struct Slot {
    streams: Arc<Streams>,
    key: CallerKey,
}

impl Streams {
    #[must_use]
    pub fn new(limits: StreamLimits) -> Self {
        Self {
            limits,
            open: Mutex::default(),
        }
    }

    /// Admit one more stream for `caller`, or say which cap it would pass.
    pub fn admit(self: &Arc<Self>, caller: Option<&Caller>) -> Result<Slot, Refused> {
        let key = caller.map(Caller::key);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.0 >= self.limits.total {
            return Err(Refused::Total(self.limits.total));
        }
        let mine = open.1.entry(key).or_insert(0);
        if *mine >= self.limits.per_caller {
            return Err(Refused::PerCaller(self.limits.per_caller));
        }
        *mine += 1;
        open.0 += 1;
        Ok(Slot {
            streams: self.clone(),
            key,
        })
    }

    /// Streams open now.
    #[must_use]
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).0
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .streams
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.0 = open.0.saturating_sub(1);
        if let Some(mine) = open.1.get_mut(&self.key) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                open.1.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::middleware::auth::Tokens;

    #[test]
    fn each_cap_refuses_past_it_and_a_closed_stream_frees_its_place() {
        let tokens =
            Tokens::parse(&["reader:aaaaaaaaaaaaaaaa", "reader:bbbbbbbbbbbbbbbb"]).unwrap();
        let (a, b) = (
            tokens.caller_of("aaaaaaaaaaaaaaaa").unwrap(),
            tokens.caller_of("bbbbbbbbbbbbbbbb").unwrap(),
        );
        let streams = Arc::new(Streams::new(StreamLimits {
            total: 3,
            per_caller: 2,
        }));
        let first = streams.admit(Some(&a)).unwrap();
        let _second = streams.admit(Some(&a)).unwrap();
        assert_eq!(streams.admit(Some(&a)).unwrap_err(), Refused::PerCaller(2));
        let _third = streams.admit(Some(&b)).unwrap();
        assert_eq!(streams.admit(Some(&b)).unwrap_err(), Refused::Total(3));
        assert_eq!(streams.open(), 3);
        drop(first);
        assert_eq!(streams.open(), 2);
        let _again = streams.admit(Some(&a)).unwrap();
        // Two tokens of one role are two callers; no token is one caller.
        assert_eq!(streams.admit(None).unwrap_err(), Refused::Total(3));
    }
}
