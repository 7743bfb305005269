package dev.settled;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.concurrent.CancellationException;

/**
 * One claimed receipt, as a handler sees it. When the lease is lost (a 409, or its local
 * deadline passed) or the shutdown timeout cancels the job, the handler's thread is interrupted
 * and {@link #isCancelled()} turns true: stop work, nothing is reported for a lost lease.
 */
public final class Job {
    private final String receiptId;
    private final JsonNode observation;
    private final int attempts;
    private final String group;
    private final long finalizedAt;
    private final String traceparent;
    private final String tracestate;
    private volatile JsonNode claim;
    private volatile boolean lost;
    private volatile String cancelReason;

    Job(JsonNode claim) {
        this.claim = claim;
        this.receiptId = claim.path("receipt_id").asText();
        JsonNode o = claim.get("observation");
        this.observation = o == null || o.isNull() ? null : o;
        this.attempts = claim.path("attempts").asInt();
        JsonNode g = claim.get("group");
        this.group = g == null || g.isNull() ? "default" : g.asText();
        this.finalizedAt = claim.path("finalized_at").asLong();
        this.traceparent = text(claim, "traceparent");
        this.tracestate = text(claim, "tracestate");
    }

    private static String text(JsonNode claim, String field) {
        JsonNode v = claim.get(field);
        return v == null || v.isNull() ? null : v.asText();
    }

    public String receiptId() { return receiptId; }
    /** The producer's observation (null when none). */
    public JsonNode observation() { return observation; }
    /** Failed attempts before this one. */
    public int attempts() { return attempts; }
    /** This settlement attempt, counting from 1. */
    public int attempt() { return attempts + 1; }
    public String group() { return group; }
    /** The producer's finalized_at (Unix seconds). */
    public long finalizedAt() { return finalizedAt; }
    /** The producer's W3C trace context ({@code traceparent} header value), or null. */
    public String traceparent() { return traceparent; }
    public String tracestate() { return tracestate; }
    /** The current claim as received (after heartbeats, the one the last extension answered). */
    public JsonNode claim() { return claim; }
    /** The typed view of the current claim. */
    public Types.Claim claimView() { return Client.JSON.convertValue(claim, Types.Claim.class); }

    /** The lease was lost: nothing will be reported for this job. */
    public boolean isLost() { return lost; }
    /** Lost, or cancelled by the shutdown timeout: stop work. */
    public boolean isCancelled() { return cancelReason != null; }
    /** Why it was cancelled ("lease lost: lease_conflict", "shutdown timeout"), or null. */
    public String cancelReason() { return cancelReason; }

    /** Throws CancellationException once the job is cancelled: call it between steps of a long handler. */
    public void throwIfCancelled() {
        String why = cancelReason;
        if (why != null) throw new CancellationException(why);
    }

    void setClaim(JsonNode claim) { this.claim = claim; }

    void cancel(String reason, boolean lost) {
        if (lost) this.lost = true;
        if (cancelReason == null) cancelReason = reason;
    }
}
