-- A producer's W3C trace context, kept with its receipt and handed to every
-- claim of it (docs/operators.md, "Traces"). Nullable columns without a
-- default: adding them rewrites nothing.
ALTER TABLE receipts
    ADD COLUMN traceparent TEXT
        CHECK (traceparent IS NULL OR octet_length(traceparent) BETWEEN 55 AND 256),
    ADD COLUMN tracestate TEXT
        CHECK (tracestate IS NULL OR (traceparent IS NOT NULL AND octet_length(tracestate) <= 512));
