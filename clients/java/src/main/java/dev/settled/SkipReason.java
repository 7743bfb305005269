package dev.settled;

import com.fasterxml.jackson.annotation.JsonValue;

/** Why no settlement was needed: the server's closed set. Checked against openapi.yaml's {@code SettlementSkipReason} by the unit tests. */
public enum SkipReason {
    DENIED("denied"),
    NO_ECONOMIC_INTENT("no_economic_intent"),
    ZERO_CHARGE("zero_charge");

    private final String wire;

    SkipReason(String wire) {
        this.wire = wire;
    }

    /** The spelling on the wire. */
    @JsonValue
    public String wire() {
        return wire;
    }

    /** The constant for {@code wire}, or null when it is not one. */
    public static SkipReason of(String wire) {
        for (SkipReason c : values()) if (c.wire.equals(wire) && !c.wire.isEmpty()) return c;
        return null;
    }

    @Override
    public String toString() {
        return wire;
    }
}
