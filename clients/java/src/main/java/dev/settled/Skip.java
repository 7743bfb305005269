package dev.settled;

/** Throw from a handler: no settlement is needed (ZERO_CHARGE, DENIED, NO_ECONOMIC_INTENT). */
public class Skip extends RuntimeException {
    private final SkipReason reason;

    public Skip(SkipReason reason) {
        super(String.valueOf(reason));
        Outcome.skipped(reason);
        this.reason = reason;
    }

    public SkipReason reason() { return reason; }
}
