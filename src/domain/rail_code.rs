//! The rail's own word for a failure (`card_declined`, `insufficient_funds`):
//! shown to operators beside the closed failure code, which alone decides
//! retry or dead letter (docs/concepts.md, "Failure codes").

use std::fmt;

/// 1..=64 characters of `[A-Za-z0-9_.:-]`: a token, not prose, so it can be
/// searched for and shown anywhere without escaping.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RailCode(String);

/// Why a rail code was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailCodeError;

impl fmt::Display for RailCodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rail_code must be 1..=64 characters of A-Z, a-z, 0-9, `_`, `.`, `:` and `-`")
    }
}

impl RailCode {
    /// The longest rail code, in characters (all ASCII).
    pub const MAX_LEN: usize = 64;

    /// Check a rail code as a worker sent it.
    pub fn parse(text: &str) -> Result<Self, RailCodeError> {
        let allowed = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b':' | b'-');
        if text.is_empty() || text.len() > Self::MAX_LEN || !text.bytes().all(allowed) {
            return Err(RailCodeError);
        }
        Ok(Self(text.to_owned()))
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rail_codes_are_short_tokens() {
        for good in [
            "card_declined",
            "51",
            "do-not-honor",
            "stripe:card_declined",
            "a.b",
        ] {
            assert_eq!(RailCode::parse(good).unwrap().as_str(), good);
        }
        assert!(RailCode::parse(&"x".repeat(64)).is_ok());
        for bad in ["", "card declined", "é", "a/b", "a\n", &"x".repeat(65)] {
            assert_eq!(RailCode::parse(bad), Err(RailCodeError), "{bad:?}");
        }
    }
}
