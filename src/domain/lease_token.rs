//! The lease's secret, as the server makes it and a worker sends it back.

use thiserror::Error;

/// Largest lease token a worker may send back, in bytes.
pub const MAX_LEASE_TOKEN_BYTES: usize = 256;

/// A lease's secret: 1..=256 bytes, no control characters. The server makes
/// them (32 hex digits of OS randomness); any other value can only fail the
/// compare-and-swap.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(String);

/// A lease token out of bounds.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("lease_token must be 1..=256 bytes, no control characters")]
pub struct LeaseTokenLength;

impl LeaseToken {
    /// Check the bound.
    pub fn parse(value: &str) -> Result<Self, LeaseTokenLength> {
        if value.is_empty()
            || value.len() > MAX_LEASE_TOKEN_BYTES
            || value.chars().any(char::is_control)
        {
            return Err(LeaseTokenLength);
        }
        Ok(Self(value.to_owned()))
    }

    /// One the store holds: it made it.
    pub(crate) const fn from_stored(value: String) -> Self {
        Self(value)
    }

    /// A new unpredictable token for a claim made at `claimed_at_ms`: 128
    /// bits from the OS as hex, then `.` and the claim time. The time rides
    /// in the token so that an outcome can tell how long its claim took
    /// (`/metrics`) without another column on the hot path; it is trusted
    /// only once the token has matched the stored one.
    pub fn generate(claimed_at_ms: u64) -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(Self(format!("{}.{claimed_at_ms}", hex::encode(bytes))))
    }

    /// When the claim that made this token was made (server ms), if the
    /// token says so (tokens made by earlier releases carry none).
    #[must_use]
    pub fn claimed_at_ms(&self) -> Option<u64> {
        let (secret, at) = self.0.split_once('.')?;
        if secret.len() != 32 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        at.parse().ok()
    }

    /// The token as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<LeaseToken> for String {
    fn from(token: LeaseToken) -> Self {
        token.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_tokens_are_bounded_and_generated_unpredictable() {
        assert_eq!(LeaseToken::parse(""), Err(LeaseTokenLength));
        assert_eq!(LeaseToken::parse("a\0b"), Err(LeaseTokenLength));
        assert!(LeaseToken::parse(&"t".repeat(MAX_LEASE_TOKEN_BYTES)).is_ok());
        assert_eq!(
            LeaseToken::parse(&"t".repeat(MAX_LEASE_TOKEN_BYTES + 1)),
            Err(LeaseTokenLength)
        );
        let (a, b) = (
            LeaseToken::generate(1_764_460_800_000).unwrap(),
            LeaseToken::generate(1_764_460_800_000).unwrap(),
        );
        assert_eq!(a.as_str().len(), 32 + 1 + 13);
        assert_ne!(a, b);
        assert_eq!(a.claimed_at_ms(), Some(1_764_460_800_000));
        // An earlier release's token, or one a worker made up, says nothing.
        assert_eq!(
            LeaseToken::parse(&"a".repeat(32)).unwrap().claimed_at_ms(),
            None
        );
        assert_eq!(LeaseToken::parse("abc.12").unwrap().claimed_at_ms(), None);
    }
}
