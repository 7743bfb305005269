package dev.settled;

import com.fasterxml.jackson.annotation.JsonInclude;
import com.fasterxml.jackson.annotation.JsonProperty;
import java.util.regex.Pattern;

/**
 * What a worker reports for a claimed receipt, told apart by {@code kind} (openapi.yaml's
 * OutcomeIn). Made through the factories, which check the spec's closed sets and patterns.
 */
public sealed interface Outcome permits Outcome.Accepted, Outcome.Skipped, Outcome.Retryable, Outcome.Permanent {
    /** A rail's own code: 1..=64 characters of {@code A-Z a-z 0-9 _ . : -}. */
    Pattern RAIL_CODE = Pattern.compile("[A-Za-z0-9_.:-]{1,64}");

    String kind();

    @JsonInclude(JsonInclude.Include.NON_NULL)
    record Accepted(
            @JsonProperty(value = "kind", required = true) String kind,
            @JsonProperty(value = "transcript_id", required = true) String transcriptId) implements Outcome {}

    @JsonInclude(JsonInclude.Include.NON_NULL)
    record Skipped(
            @JsonProperty(value = "kind", required = true) String kind,
            @JsonProperty(value = "reason", required = true) SkipReason reason) implements Outcome {}

    @JsonInclude(JsonInclude.Include.NON_NULL)
    record Retryable(
            @JsonProperty(value = "kind", required = true) String kind,
            @JsonProperty(value = "code", required = true) FailureCode code,
            @JsonProperty("detail") String detail,
            @JsonProperty("retry_after_ms") Long retryAfterMs,
            @JsonProperty("rail_code") String railCode) implements Outcome {}

    @JsonInclude(JsonInclude.Include.NON_NULL)
    record Permanent(
            @JsonProperty(value = "kind", required = true) String kind,
            @JsonProperty(value = "code", required = true) FailureCode code,
            @JsonProperty("detail") String detail,
            @JsonProperty("rail_code") String railCode) implements Outcome {}

    static Outcome accepted(String transcriptId) {
        if (transcriptId == null) throw new InvalidOutcomeException("an accepted outcome needs a transcript id");
        return new Accepted("accepted", transcriptId);
    }

    static Outcome skipped(SkipReason reason) {
        if (reason == null) throw new InvalidOutcomeException("Skip: a reason is required: " + java.util.Arrays.toString(SkipReason.values()));
        return new Skipped("skipped", reason);
    }

    static Outcome retryable(FailureCode code, String detail, Long retryAfterMs, String railCode) {
        checkFailure("Retryable", code, railCode);
        if (retryAfterMs != null && retryAfterMs < 0) throw new InvalidOutcomeException("Retryable: retryAfterMs must be >= 0, not " + retryAfterMs);
        return new Retryable("retryable", code, detail, retryAfterMs, railCode);
    }

    static Outcome permanent(FailureCode code, String detail, String railCode) {
        checkFailure("Permanent", code, railCode);
        return new Permanent("permanent", code, detail, railCode);
    }

    private static void checkFailure(String what, FailureCode code, String railCode) {
        if (code == null) throw new InvalidOutcomeException(what + ": a failure code is required (a rail's own code goes in railCode)");
        if (railCode != null && !RAIL_CODE.matcher(railCode).matches()) {
            throw new InvalidOutcomeException(what + ": invalid rail code \"" + railCode + "\": 1..=64 characters of A-Z a-z 0-9 _ . : -");
        }
    }

    /** Checks an outcome made elsewhere (by an onError hook, say): the factories' rules. */
    static Outcome check(Outcome o) {
        if (o == null) throw new InvalidOutcomeException("no outcome");
        if (o instanceof Accepted a) return accepted(a.transcriptId());
        if (o instanceof Skipped s) return skipped(s.reason());
        if (o instanceof Retryable r) return retryable(r.code(), r.detail(), r.retryAfterMs(), r.railCode());
        Permanent p = (Permanent) o;
        return permanent(p.code(), p.detail(), p.railCode());
    }
}
