package dev.settled;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * The server answered an {@code application/problem+json} error. Branch on {@link #code()}
 * (stable; {@link ProblemCode#UNKNOWN} for a code this SDK does not know, its spelling in
 * {@link #rawCode()}) or {@link #problemClass()}; {@link #detail()} is for people.
 */
public class ProblemException extends SettledException {
    private final int status;
    private final ProblemCode code;
    private final String rawCode;
    private final ProblemClass problemClass;
    private final String rawClass;
    private final String detail;
    private final JsonNode body;
    private final Long retryAfterMs;

    public ProblemException(int status, String code, String problemClass, String detail, JsonNode body, Long retryAfterMs) {
        super(status + " " + code + ": " + detail);
        this.status = status;
        this.rawCode = code;
        this.code = ProblemCode.of(code);
        this.rawClass = problemClass;
        this.problemClass = ProblemClass.of(problemClass);
        this.detail = detail;
        this.body = body;
        this.retryAfterMs = retryAfterMs;
    }

    public int status() { return status; }
    public ProblemCode code() { return code; }
    /** The code as the server spelled it (also for UNKNOWN, or {@code http_<status>} for an answer that was no problem). */
    public String rawCode() { return rawCode; }
    public ProblemClass problemClass() { return problemClass; }
    public String rawClass() { return rawClass; }
    public String detail() { return detail; }
    /** The parsed body, or null when it was not JSON. */
    public JsonNode body() { return body; }
    /** The answer's Retry-After in ms, or null. */
    public Long retryAfterMs() { return retryAfterMs; }

    /** Worth trying again soon: 503 (database unavailable), 504 (out of time), 429 (a limit). */
    public boolean isRetryable() {
        return "backend".equals(rawClass) || "capacity".equals(rawClass) || status == 429 || status == 503 || status == 504;
    }

    /** A 500 internal_error: retried a few times only, the same request may fail the same way. */
    public boolean isInternal() {
        return status == 500 && ("internal".equals(rawClass) || "internal_error".equals(rawCode));
    }

    /** A 409 on a request that carried a claim: the lease is no longer ours. */
    public boolean isLeaseLost() {
        return status == 409;
    }
}
