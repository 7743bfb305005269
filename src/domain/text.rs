//! Bounded text fields: receipt ids and transcript ids.

use thiserror::Error;

/// Largest receipt id or transcript id, in UTF-8 bytes.
pub const MAX_ID_BYTES: usize = 512;

/// Why an id was refused.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum IdError {
    #[error("must be 1..=512 UTF-8 bytes")]
    Length,
    #[error("must not contain control characters")]
    ControlCharacter,
    #[error("must not be `.` or `..` (they cannot be addressed in a URL path)")]
    Dots,
}

/// Check text bounded as an id is (1..=512 bytes, no control characters),
/// e.g. a prefix of receipt ids; `.` and `..` are fine there.
pub fn check_id_text(value: &str) -> Result<(), IdError> {
    check_id(value, false)
}

fn check_id(value: &str, addressed_in_paths: bool) -> Result<(), IdError> {
    if value.is_empty() || value.len() > MAX_ID_BYTES {
        return Err(IdError::Length);
    }
    if value.chars().any(char::is_control) {
        return Err(IdError::ControlCharacter);
    }
    // URL clients normalize `.` and `..` away: such an id could never be
    // looked up.
    if addressed_in_paths && (value == "." || value == "..") {
        return Err(IdError::Dots);
    }
    Ok(())
}

macro_rules! bounded_id {
    ($(#[$doc:meta])* $name:ident, addressed_in_paths: $paths:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Check the bounds.
            pub fn parse(value: &str) -> Result<Self, IdError> {
                check_id(value, $paths)?;
                Ok(Self(value.to_owned()))
            }

            /// The id as text.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

bounded_id!(
    /// A receipt id: 1..=512 UTF-8 bytes, no control characters, not `.`
    /// or `..`.
    ReceiptId,
    addressed_in_paths: true
);
bounded_id!(
    /// A rail transcript id: 1..=512 UTF-8 bytes, no control characters.
    TranscriptId,
    addressed_in_paths: false
);

/// Ids compare with the text they hold.
macro_rules! compares_with_text {
    ($($name:ty),*) => {$(
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    )*};
}

compares_with_text!(
    ReceiptId,
    TranscriptId,
    super::WorkerId,
    super::LeaseToken,
    super::GroupName
);

impl std::fmt::Display for ReceiptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl ReceiptId {
    /// One the store holds: it was parsed before it was written.
    pub(crate) const fn from_stored(value: String) -> Self {
        Self(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_in_bytes_at_both_edges() {
        assert_eq!(ReceiptId::parse(""), Err(IdError::Length));
        assert!(ReceiptId::parse(&"r".repeat(512)).is_ok());
        assert_eq!(ReceiptId::parse(&"r".repeat(513)), Err(IdError::Length));
        // 256 two-byte characters are 512 bytes; one more is over.
        assert!(ReceiptId::parse(&"\u{e9}".repeat(256)).is_ok());
        assert_eq!(
            ReceiptId::parse(&"\u{e9}".repeat(257)),
            Err(IdError::Length)
        );
        assert!(TranscriptId::parse(&"\u{1F600}".repeat(128)).is_ok());
        assert_eq!(
            TranscriptId::parse(&"\u{1F600}".repeat(129)),
            Err(IdError::Length)
        );
    }

    #[test]
    fn ids_refuse_control_characters() {
        for bad in ["a\0b", "a\nb", "\u{7f}", "x\u{85}"] {
            assert_eq!(
                ReceiptId::parse(bad),
                Err(IdError::ControlCharacter),
                "{bad:?}"
            );
            assert_eq!(TranscriptId::parse(bad), Err(IdError::ControlCharacter));
        }
        assert!(ReceiptId::parse("a/b %2F ../é").is_ok());
    }

    #[test]
    fn receipt_ids_that_a_url_path_cannot_hold_are_refused() {
        for dots in [".", ".."] {
            assert_eq!(ReceiptId::parse(dots), Err(IdError::Dots));
            assert!(TranscriptId::parse(dots).is_ok());
        }
        assert!(ReceiptId::parse("...").is_ok());
    }
}
