-- Operator actions (docs/operators.md, "Act on many receipts"); mirrors
-- migrations/sqlite/0007_operator_actions.sql:
-- - `canceled`, a terminal status of its own, with the operator's reason;
-- - `held_at_ms`: a held receipt keeps its state and times but is not
--   claimable. It means something only while the receipt is active: an
--   outcome that finishes a held receipt leaves it as it is (the hot writes
--   do not touch it), and a redrive or a cancel clears it. The claim queue (receipts_due) and the oldest-due index
--   (receipts_waiting) leave held rows out, so a claim never steps over them;
-- - history entries `hold`, `unhold`, `cancel`, and two columns for operator
--   entries: `actor` (the name of the operator's token) and `note` (the
--   reason given).
-- The counters gain a `canceled` bucket.
SET LOCAL statement_timeout = 0;
-- No write may commit between the counters' new column and the new trigger
-- function (a replica still running during a rolling upgrade).
LOCK TABLE receipts IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE receipts
    ADD COLUMN held_at_ms BIGINT CHECK (held_at_ms >= 0),
    ADD COLUMN cancel_reason TEXT CHECK (octet_length(cancel_reason) BETWEEN 1 AND 512),
    DROP CONSTRAINT receipts_status_check,
    ADD CONSTRAINT receipts_status_check
        CHECK (status IN ('active', 'settled', 'skipped', 'dead_lettered', 'canceled')),
    ADD CONSTRAINT receipts_cancel_reason_set CHECK ((status = 'canceled') = (cancel_reason IS NOT NULL));

ALTER TABLE receipt_history
    ADD COLUMN actor TEXT CHECK (length(actor) BETWEEN 1 AND 64),
    ADD COLUMN note TEXT CHECK (octet_length(note) BETWEEN 1 AND 512),
    DROP CONSTRAINT receipt_history_outcome_check,
    ADD CONSTRAINT receipt_history_outcome_check CHECK (outcome IN (
        'accepted', 'skipped', 'retryable', 'permanent', 'released', 'redrive',
        'hold', 'unhold', 'cancel'));

DROP INDEX receipts_due;
CREATE INDEX receipts_due ON receipts (next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL;
DROP INDEX receipts_waiting;
CREATE INDEX receipts_waiting ON receipts (next_visible_at_ms)
    WHERE status = 'active' AND lease_token IS NULL AND held_at_ms IS NULL;

ALTER TABLE receipt_counts ADD COLUMN canceled BIGINT NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION settled_count_receipts() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d_fresh BIGINT;
    d_retried BIGINT;
    d_settled BIGINT;
    d_skipped BIGINT;
    d_dead BIGINT;
    d_canceled BIGINT;
BEGIN
    -- Each branch names only the transition tables its event has.
    IF TG_OP = 'INSERT' THEN
        SELECT COUNT(*) FILTER (WHERE status = 'active' AND attempts = 0),
               COUNT(*) FILTER (WHERE status = 'active' AND attempts > 0),
               COUNT(*) FILTER (WHERE status = 'settled'),
               COUNT(*) FILTER (WHERE status = 'skipped'),
               COUNT(*) FILTER (WHERE status = 'dead_lettered'),
               COUNT(*) FILTER (WHERE status = 'canceled')
          INTO d_fresh, d_retried, d_settled, d_skipped, d_dead, d_canceled
          FROM new_rows;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT -COUNT(*) FILTER (WHERE status = 'active' AND attempts = 0),
               -COUNT(*) FILTER (WHERE status = 'active' AND attempts > 0),
               -COUNT(*) FILTER (WHERE status = 'settled'),
               -COUNT(*) FILTER (WHERE status = 'skipped'),
               -COUNT(*) FILTER (WHERE status = 'dead_lettered'),
               -COUNT(*) FILTER (WHERE status = 'canceled')
          INTO d_fresh, d_retried, d_settled, d_skipped, d_dead, d_canceled
          FROM old_rows;
    ELSE
        -- Claims, extensions and releases change no bucket and net to zero.
        SELECT COALESCE(SUM(k) FILTER (WHERE status = 'active' AND attempts = 0), 0),
               COALESCE(SUM(k) FILTER (WHERE status = 'active' AND attempts > 0), 0),
               COALESCE(SUM(k) FILTER (WHERE status = 'settled'), 0),
               COALESCE(SUM(k) FILTER (WHERE status = 'skipped'), 0),
               COALESCE(SUM(k) FILTER (WHERE status = 'dead_lettered'), 0),
               COALESCE(SUM(k) FILTER (WHERE status = 'canceled'), 0)
          INTO d_fresh, d_retried, d_settled, d_skipped, d_dead, d_canceled
          FROM (SELECT status, attempts, 1 AS k FROM new_rows
                UNION ALL SELECT status, attempts, -1 FROM old_rows) AS c;
    END IF;
    IF d_fresh = 0 AND d_retried = 0 AND d_settled = 0 AND d_skipped = 0 AND d_dead = 0
       AND d_canceled = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE receipt_counts
       SET fresh = fresh + d_fresh, retried = retried + d_retried,
           settled = settled + d_settled, skipped = skipped + d_skipped,
           dead_lettered = dead_lettered + d_dead, canceled = canceled + d_canceled
     WHERE slot = (SELECT slot FROM receipt_counts ORDER BY slot LIMIT 1
                   FOR UPDATE SKIP LOCKED);
    IF NOT FOUND THEN
        INSERT INTO receipt_counts (fresh, retried, settled, skipped, dead_lettered, canceled)
        VALUES (d_fresh, d_retried, d_settled, d_skipped, d_dead, d_canceled);
    END IF;
    RETURN NULL;
END;
$$;
