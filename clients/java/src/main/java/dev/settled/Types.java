package dev.settled;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.annotation.JsonInclude;
import com.fasterxml.jackson.annotation.JsonProperty;
import com.fasterxml.jackson.databind.JsonNode;
import java.util.List;

/**
 * The requests and answers of the worker's operations, as records named after openapi.yaml's
 * schemas; the unit tests compare their properties and required fields with the spec.
 */
public final class Types {
    private Types() {}

    /** A claimed receipt. The worker sends back the JSON it received, not this view (rule 1). */
    @JsonIgnoreProperties(ignoreUnknown = true)
    public record Claim(
            @JsonProperty(value = "receipt_id", required = true) String receiptId,
            @JsonProperty(value = "finalized_at", required = true) long finalizedAt,
            @JsonProperty(value = "attempts", required = true) int attempts,
            @JsonProperty(value = "row_version", required = true) long rowVersion,
            @JsonProperty(value = "lease_owner", required = true) String leaseOwner,
            @JsonProperty(value = "lease_token", required = true) String leaseToken,
            @JsonProperty(value = "lease_until_ms", required = true) long leaseUntilMs,
            @JsonProperty("group") String group,
            @JsonProperty("observation") JsonNode observation,
            @JsonProperty("priority") Integer priority,
            @JsonProperty("traceparent") String traceparent,
            @JsonProperty("tracestate") String tracestate) {}

    @JsonInclude(JsonInclude.Include.NON_NULL)
    public record ClaimsIn(
            @JsonProperty(value = "worker_id", required = true) String workerId,
            @JsonProperty(value = "lease_ms", required = true) long leaseMs,
            @JsonProperty(value = "limit", required = true) int limit,
            @JsonProperty("wait_ms") Long waitMs,
            @JsonProperty("groups") List<String> groups,
            @JsonProperty("outcomes") List<OutcomeRequest> outcomes) {
        /** A claim that carries no outcomes. */
        public ClaimsIn(String workerId, long leaseMs, int limit, Long waitMs, List<String> groups) {
            this(workerId, leaseMs, limit, waitMs, groups, null);
        }
    }

    @JsonInclude(JsonInclude.Include.NON_NULL)
    public record ClaimOneIn(
            @JsonProperty(value = "worker_id", required = true) String workerId,
            @JsonProperty(value = "lease_ms", required = true) long leaseMs) {}

    /**
     * The claims as received (each sent back exactly), and look_again_ms or null; with
     * outcomes sent along, their results (in order) and, when the claim failed after them,
     * claim_error.
     */
    @JsonIgnoreProperties(ignoreUnknown = true)
    public record ClaimsOut(
            @JsonProperty(value = "claims", required = true) List<JsonNode> claims,
            @JsonProperty("look_again_ms") Long lookAgainMs,
            @JsonProperty("results") List<OutcomeResult> results,
            @JsonProperty("claim_error") Problem claimError) {
        public ClaimsOut(List<JsonNode> claims, Long lookAgainMs) {
            this(claims, lookAgainMs, null, null);
        }
    }

    @JsonInclude(JsonInclude.Include.NON_NULL)
    public record ReceiptIn(
            @JsonProperty(value = "receipt_id", required = true) String receiptId,
            @JsonProperty(value = "finalized_at", required = true) long finalizedAt,
            @JsonProperty("observation") JsonNode observation,
            @JsonProperty("group") String group,
            @JsonProperty("priority") Integer priority,
            @JsonProperty("visible_at_ms") Long visibleAtMs,
            @JsonProperty("traceparent") String traceparent,
            @JsonProperty("tracestate") String tracestate) {
        public ReceiptIn(String receiptId, long finalizedAt, JsonNode observation) {
            this(receiptId, finalizedAt, observation, null, null, null, null, null);
        }
    }

    public record LeaseExtendIn(
            @JsonProperty(value = "claim", required = true) JsonNode claim,
            @JsonProperty(value = "extend_ms", required = true) long extendMs) {}

    public record LeaseReleaseIn(@JsonProperty(value = "claim", required = true) JsonNode claim) {}

    public record OutcomeRequest(
            @JsonProperty(value = "claim", required = true) JsonNode claim,
            @JsonProperty(value = "outcome", required = true) Outcome outcome) {}

    /** One item of POST /v1/leases/extend's answer: the new claim, or the error. */
    @JsonIgnoreProperties(ignoreUnknown = true)
    public record LeaseExtendResult(
            @JsonProperty("receipt_id") String receiptId,
            @JsonProperty("claim") JsonNode claim,
            @JsonProperty("error") Problem error) {}

    /** One item of POST /v1/outcomes' answer: the route, or the error. */
    @JsonIgnoreProperties(ignoreUnknown = true)
    public record OutcomeResult(
            @JsonProperty("receipt_id") String receiptId,
            @JsonProperty("route") JsonNode route,
            @JsonProperty("error") Problem error) {}

    @JsonIgnoreProperties(ignoreUnknown = true)
    public record Problem(
            @JsonProperty(value = "type", required = true) String type,
            @JsonProperty(value = "title", required = true) String title,
            @JsonProperty(value = "status", required = true) int status,
            @JsonProperty(value = "detail", required = true) String detail,
            @JsonProperty(value = "code", required = true) String code,
            @JsonProperty(value = "class", required = true) String problemClass) {}
}
