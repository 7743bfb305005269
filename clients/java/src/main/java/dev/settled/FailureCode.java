package dev.settled;

import com.fasterxml.jackson.annotation.JsonValue;

/** A failure code: the server's closed set (only RPC and BACKEND are retried). Checked against openapi.yaml's {@code SettlementFailureCode} by the unit tests. */
public enum FailureCode {
    INVALID_RECEIPT_SIGNATURE("invalid_receipt_signature"),
    INVALID_ACTION_HASH("invalid_action_hash"),
    UNTRUSTED_RECEIPT_SIGNER("untrusted_receipt_signer"),
    MALFORMED_FINANCIAL_METADATA("malformed_financial_metadata"),
    INVALID_OBSERVATION("invalid_observation"),
    RPC("rpc"),
    INVALID_INPUT("invalid_input"),
    INVALID_DISPATCH("invalid_dispatch"),
    INVALID_BINDING("invalid_binding"),
    UNSUPPORTED("unsupported"),
    SERIALIZATION("serialization"),
    SIGNATURE("signature"),
    VERIFICATION("verification"),
    BACKEND("backend");

    private final String wire;

    FailureCode(String wire) {
        this.wire = wire;
    }

    /** The spelling on the wire. */
    @JsonValue
    public String wire() {
        return wire;
    }

    /** The constant for {@code wire}, or null when it is not one. */
    public static FailureCode of(String wire) {
        for (FailureCode c : values()) if (c.wire.equals(wire) && !c.wire.isEmpty()) return c;
        return null;
    }

    @Override
    public String toString() {
        return wire;
    }
}
