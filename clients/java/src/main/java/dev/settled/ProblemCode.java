package dev.settled;

import com.fasterxml.jackson.annotation.JsonValue;

/** What went wrong, as a stable machine code (see docs/troubleshooting.md). Checked against openapi.yaml's {@code ProblemCode} by the unit tests. */
public enum ProblemCode {
    MALFORMED_JSON("malformed_json"),
    UNSUPPORTED_MEDIA_TYPE("unsupported_media_type"),
    BODY_TOO_LARGE("body_too_large"),
    REQUEST_TIMEOUT("request_timeout"),
    INVALID_BODY("invalid_body"),
    INVALID_QUERY("invalid_query"),
    INVALID_PATH("invalid_path"),
    METHOD_NOT_ALLOWED("method_not_allowed"),
    BATCH_SIZE("batch_size"),
    INVALID_RECEIPT_ID("invalid_receipt_id"),
    INVALID_FINALIZED_AT("invalid_finalized_at"),
    INVALID_VISIBLE_AT_MS("invalid_visible_at_ms"),
    INVALID_OBSERVATION("invalid_observation"),
    OBSERVATION_TOO_LARGE("observation_too_large"),
    INVALID_TRANSCRIPT_ID("invalid_transcript_id"),
    INVALID_RETRY_AFTER("invalid_retry_after"),
    INVALID_GROUP("invalid_group"),
    INVALID_PRIORITY("invalid_priority"),
    INVALID_TRACE_CONTEXT("invalid_trace_context"),
    INVALID_GROUP_LIMITS("invalid_group_limits"),
    WORKER_ID_LENGTH("worker_id_length"),
    INVALID_WORKER_ID("invalid_worker_id"),
    LEASE_DURATION("lease_duration"),
    CLAIM_BATCH("claim_batch"),
    INVALID_WAIT_MS("invalid_wait_ms"),
    INVALID_CLAIM("invalid_claim"),
    RECEIPT_ID_MISMATCH("receipt_id_mismatch"),
    INVALID_LIMIT("invalid_limit"),
    INVALID_CURSOR("invalid_cursor"),
    UNAUTHORIZED("unauthorized"),
    FORBIDDEN("forbidden"),
    CROSS_SITE_REQUEST("cross_site_request"),
    HOST_NOT_ALLOWED("host_not_allowed"),
    MISDIRECTED_REQUEST("misdirected_request"),
    LEASE_CONFLICT("lease_conflict"),
    LEASE_EXPIRED("lease_expired"),
    RECEIPT_NOT_LEASED("receipt_not_leased"),
    RECEIPT_UNKNOWN("receipt_unknown"),
    RECEIPT_CONFLICT("receipt_conflict"),
    RECEIPT_LEASED("receipt_leased"),
    RECEIPT_NOT_VISIBLE("receipt_not_visible"),
    GROUP_PAUSED("group_paused"),
    GROUP_AT_LIMIT("group_at_limit"),
    NOT_FOUND("not_found"),
    RECEIPT_NOT_FOUND("receipt_not_found"),
    NO_ACTIVE_WORK("no_active_work"),
    DEAD_LETTER_NOT_FOUND("dead_letter_not_found"),
    GROUP_NOT_FOUND("group_not_found"),
    RECEIPT_HELD("receipt_held"),
    RECEIPT_NOT_ACTIVE("receipt_not_active"),
    RECEIPT_FINISHED("receipt_finished"),
    COUNT_MISMATCH("count_mismatch"),
    SELECTION_TOO_LARGE("selection_too_large"),
    BULK_INCOMPLETE("bulk_incomplete"),
    INVALID_REASON("invalid_reason"),
    HISTORY_CURSOR_EXPIRED("history_cursor_expired"),
    TOO_MANY_STREAMS("too_many_streams"),
    INVALID_RECORD("invalid_record"),
    BACKEND_UNAVAILABLE("backend_unavailable"),
    TIME_LIMIT_EXCEEDED("time_limit_exceeded"),
    INTERNAL_ERROR("internal_error"),
    INVALID_RAIL_CODE("invalid_rail_code"),
    /** A code this SDK does not know yet (a newer server). */
    UNKNOWN("");

    private final String wire;

    ProblemCode(String wire) {
        this.wire = wire;
    }

    /** The spelling on the wire. */
    @JsonValue
    public String wire() {
        return wire;
    }

    /** The constant for {@code wire}, or UNKNOWN. */
    public static ProblemCode of(String wire) {
        for (ProblemCode c : values()) if (c.wire.equals(wire) && !c.wire.isEmpty()) return c;
        return UNKNOWN;
    }

    @Override
    public String toString() {
        return wire;
    }
}
