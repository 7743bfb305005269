//! Closed sets of skip reasons and failure codes, with their exact labels.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why an observation legitimately needs no settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SettlementSkipReason {
    Denied,
    NoEconomicIntent,
    ZeroCharge,
}

/// Why a settlement attempt failed. Only `rpc` and `backend` are retryable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SettlementFailureCode {
    InvalidReceiptSignature,
    InvalidActionHash,
    UntrustedReceiptSigner,
    MalformedFinancialMetadata,
    InvalidObservation,
    Rpc,
    InvalidInput,
    InvalidDispatch,
    InvalidBinding,
    Unsupported,
    Serialization,
    Signature,
    Verification,
    Backend,
}

/// Whether a failure may succeed when replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    Retryable,
    Permanent,
}

impl SettlementSkipReason {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 3] = [Self::Denied, Self::NoEconomicIntent, Self::ZeroCharge];

    /// The exact lower-case label.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Denied => "denied",
            Self::NoEconomicIntent => "no_economic_intent",
            Self::ZeroCharge => "zero_charge",
        }
    }

    /// Parse an exact label (case-sensitive).
    #[must_use]
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == label)
    }
}

impl SettlementFailureCode {
    /// Every code, in declaration order.
    pub const ALL: [Self; 14] = [
        Self::InvalidReceiptSignature,
        Self::InvalidActionHash,
        Self::UntrustedReceiptSigner,
        Self::MalformedFinancialMetadata,
        Self::InvalidObservation,
        Self::Rpc,
        Self::InvalidInput,
        Self::InvalidDispatch,
        Self::InvalidBinding,
        Self::Unsupported,
        Self::Serialization,
        Self::Signature,
        Self::Verification,
        Self::Backend,
    ];

    /// The exact lower-case label.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidReceiptSignature => "invalid_receipt_signature",
            Self::InvalidActionHash => "invalid_action_hash",
            Self::UntrustedReceiptSigner => "untrusted_receipt_signer",
            Self::MalformedFinancialMetadata => "malformed_financial_metadata",
            Self::InvalidObservation => "invalid_observation",
            Self::Rpc => "rpc",
            Self::InvalidInput => "invalid_input",
            Self::InvalidDispatch => "invalid_dispatch",
            Self::InvalidBinding => "invalid_binding",
            Self::Unsupported => "unsupported",
            Self::Serialization => "serialization",
            Self::Signature => "signature",
            Self::Verification => "verification",
            Self::Backend => "backend",
        }
    }

    /// Parse an exact label (case-sensitive).
    #[must_use]
    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == label)
    }

    /// The class the code has on its own: only `rpc` and `backend` may be retried.
    #[must_use]
    pub const fn class(self) -> FailureClass {
        match self {
            Self::Rpc | Self::Backend => FailureClass::Retryable,
            _ => FailureClass::Permanent,
        }
    }

    /// The class a reported outcome really has: a `retryable` report with a
    /// permanent code is treated as permanent.
    #[must_use]
    pub const fn effective_class(self, reported: FailureClass) -> FailureClass {
        match (reported, self.class()) {
            (FailureClass::Retryable, FailureClass::Retryable) => FailureClass::Retryable,
            _ => FailureClass::Permanent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_labels_round_trip_exactly() {
        for code in SettlementFailureCode::ALL {
            assert_eq!(SettlementFailureCode::from_label(code.as_str()), Some(code));
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, serde_json::Value::String(code.as_str().to_owned()));
            let back: SettlementFailureCode = serde_json::from_value(json).unwrap();
            assert_eq!(back, code);
        }
        assert_eq!(SettlementFailureCode::from_label("RPC"), None);
        assert_eq!(SettlementFailureCode::from_label("rpc "), None);
    }

    #[test]
    fn skip_labels_round_trip_exactly() {
        for reason in SettlementSkipReason::ALL {
            assert_eq!(
                SettlementSkipReason::from_label(reason.as_str()),
                Some(reason)
            );
            let json = serde_json::to_value(reason).unwrap();
            assert_eq!(json, serde_json::Value::String(reason.as_str().to_owned()));
        }
        assert_eq!(SettlementSkipReason::from_label("Denied"), None);
    }

    #[test]
    fn only_rpc_and_backend_are_retryable() {
        let retryable: Vec<_> = SettlementFailureCode::ALL
            .into_iter()
            .filter(|c| c.class() == FailureClass::Retryable)
            .collect();
        assert_eq!(
            retryable,
            [SettlementFailureCode::Rpc, SettlementFailureCode::Backend]
        );
    }

    #[test]
    fn retryable_report_with_permanent_code_is_permanent() {
        use FailureClass::*;
        let sig = SettlementFailureCode::Signature;
        assert_eq!(sig.effective_class(Retryable), Permanent);
        assert_eq!(
            SettlementFailureCode::Rpc.effective_class(Retryable),
            Retryable
        );
        assert_eq!(
            SettlementFailureCode::Rpc.effective_class(Permanent),
            Permanent
        );
    }
}
