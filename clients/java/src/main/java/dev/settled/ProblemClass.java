package dev.settled;

import com.fasterxml.jackson.annotation.JsonValue;

/** The kind of error a problem answer reports. Checked against openapi.yaml's {@code ProblemClass} by the unit tests. */
public enum ProblemClass {
    VALIDATION("validation"),
    CONFLICT("conflict"),
    INVALID_RECORD("invalid_record"),
    BACKEND("backend"),
    NOT_FOUND("not_found"),
    AUTH("auth"),
    CAPACITY("capacity"),
    INTERNAL("internal"),
    /** A code this SDK does not know yet (a newer server). */
    UNKNOWN("");

    private final String wire;

    ProblemClass(String wire) {
        this.wire = wire;
    }

    /** The spelling on the wire. */
    @JsonValue
    public String wire() {
        return wire;
    }

    /** The constant for {@code wire}, or UNKNOWN. */
    public static ProblemClass of(String wire) {
        for (ProblemClass c : values()) if (c.wire.equals(wire) && !c.wire.isEmpty()) return c;
        return UNKNOWN;
    }

    @Override
    public String toString() {
        return wire;
    }
}
