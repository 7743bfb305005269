//! W3C Trace Context (`traceparent`, `tracestate`) kept with a receipt, so
//! that the worker that settles it can continue the producer's trace.

use thiserror::Error;

/// Longest `traceparent` kept: version 00 is 55 bytes; later versions may
/// append fields, which are kept as sent up to this bound.
pub const MAX_TRACEPARENT_BYTES: usize = 256;
/// Longest `tracestate` kept (the W3C limit vendors must accept).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A producer's trace context: a valid `traceparent` and, optionally, its
/// `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

/// A trace context that is not W3C Trace Context.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum TraceError {
    #[error(
        "traceparent must be W3C Trace Context: VERSION-TRACEID-PARENTID-FLAGS in lower-case hex \
         (00-<32 hex>-<16 hex>-<2 hex>), ids not all zero, version not ff"
    )]
    Traceparent,
    #[error("tracestate must be at most 512 bytes of printable ASCII")]
    Tracestate,
}

fn lower_hex(text: &str, len: usize) -> bool {
    text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TraceContext {
    /// Check a `traceparent` (and its `tracestate`, if any) as the W3C
    /// Trace Context recommendation reads them.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, TraceError> {
        let bad = Err(TraceError::Traceparent);
        // A traceparent is printable ASCII; checking that first also keeps the split
        // below on a character boundary whatever a client sends.
        if traceparent.len() < 55
            || traceparent.len() > MAX_TRACEPARENT_BYTES
            || !traceparent.bytes().all(|b| b.is_ascii_graphic())
        {
            return bad;
        }
        let (head, rest) = traceparent.split_at(55);
        let mut fields = head.split('-');
        let (Some(version), Some(trace_id), Some(parent_id), Some(flags), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return bad;
        };
        let well_formed = lower_hex(version, 2)
            && version != "ff"
            && lower_hex(trace_id, 32)
            && trace_id.bytes().any(|b| b != b'0')
            && lower_hex(parent_id, 16)
            && parent_id.bytes().any(|b| b != b'0')
            && lower_hex(flags, 2);
        // Version 00 has exactly these fields; a later one may add more after a `-`.
        let tail_ok = if version == "00" {
            rest.is_empty()
        } else {
            rest.is_empty() || rest.starts_with('-')
        };
        if !well_formed || !tail_ok {
            return bad;
        }
        let tracestate = match tracestate {
            None => None,
            Some(state)
                if state.len() <= MAX_TRACESTATE_BYTES
                    && state
                        .bytes()
                        .all(|b| (0x20..=0x7e).contains(&b) || b == b'\t') =>
            {
                Some(state.to_owned()).filter(|s| !s.trim().is_empty())
            }
            Some(_) => return Err(TraceError::Tracestate),
        };
        Ok(Self {
            traceparent: traceparent.to_owned(),
            tracestate,
        })
    }

    /// The context of a request's `traceparent` and `tracestate` headers.
    /// As the W3C recommendation asks, an invalid `traceparent` is ignored
    /// (a proxy may have mangled it) and an invalid `tracestate` dropped.
    #[must_use]
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let parent = traceparent?.trim();
        Self::parse(parent, tracestate)
            .or_else(|_| Self::parse(parent, None))
            .ok()
    }

    /// One the store holds: it was parsed before it was written.
    pub(crate) const fn from_stored(traceparent: String, tracestate: Option<String>) -> Self {
        Self {
            traceparent,
            tracestate,
        }
    }

    #[must_use]
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    #[must_use]
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id (32 hex digits).
    #[must_use]
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The producer's span id (16 hex digits).
    #[must_use]
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// Whether the producer sampled its trace (flag bit 0).
    #[must_use]
    pub fn sampled(&self) -> bool {
        u8::from_str_radix(&self.traceparent[53..55], 16).is_ok_and(|f| f & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendation_examples_read_as_written() {
        let t = TraceContext::parse(GOOD, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert!(t.sampled());
        assert_eq!(
            t.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        // A later version may carry more fields.
        assert!(TraceContext::parse(&format!("01{}-extra", &GOOD[2..]), None).is_ok());
    }

    #[test]
    fn malformed_contexts_are_refused() {
        for bad in [
            "",
            &GOOD[..54],
            &format!("{GOOD}-x"),
            &GOOD.to_uppercase(),
            &format!("ff{}", &GOOD[2..]),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            // Not ASCII: the 55th byte falls inside a character (a fuzzer's find, once a panic).
            &format!("{}\u{5ca6d}aB", "Ø".repeat(27)),
            &format!("01{}-\u{e9}", &GOOD[2..]),
            &format!("01{}- x", &GOOD[2..]),
        ] {
            assert_eq!(
                TraceContext::parse(bad, None),
                Err(TraceError::Traceparent),
                "{bad}"
            );
        }
        assert_eq!(
            TraceContext::parse(GOOD, Some("a=\u{7}")),
            Err(TraceError::Tracestate)
        );
        assert_eq!(
            TraceContext::parse(GOOD, Some(&"a".repeat(513))),
            Err(TraceError::Tracestate)
        );
    }
}
