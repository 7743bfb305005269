package dev.settled;

/**
 * Throw from a handler: the settlement failed and may pass later. Only RPC and BACKEND are
 * retried; any other code dead-letters. {@code railCode} is the rail's own word for it.
 */
public class Retryable extends RuntimeException {
    private final FailureCode code;
    private final String detail;
    private final Long retryAfterMs;
    private final String railCode;

    public Retryable(FailureCode code, String detail) {
        this(code, detail, null, null);
    }

    public Retryable(FailureCode code, String detail, Long retryAfterMs, String railCode) {
        super(detail != null ? detail : String.valueOf(code));
        Outcome.retryable(code, detail, retryAfterMs, railCode); // checks it now, so that a typo shows at once
        this.code = code;
        this.detail = detail;
        this.retryAfterMs = retryAfterMs;
        this.railCode = railCode;
    }

    public FailureCode code() { return code; }
    public String detail() { return detail; }
    public Long retryAfterMs() { return retryAfterMs; }
    public String railCode() { return railCode; }

    Outcome outcome() { return Outcome.retryable(code, detail, retryAfterMs, railCode); }
}
