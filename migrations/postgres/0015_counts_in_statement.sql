-- Counts written by the statement that moves the rows (src/store/postgres/
-- guarded.rs), where the triggers of 0004 count them afterwards.
--
-- The statement-level triggers collect every changed row into transition
-- tables and aggregate them through SPI after each statement, claims
-- included, which change no count (a claim sets only the lease and the row
-- version; the buckets are a function of `status` and `attempts`). That was
-- about a seventh of a batch claim's time. A transaction may now say that
-- its statements count what they move themselves (`settled.counted` set to
-- `on`, for the transaction only): the trigger then leaves it. Claims say so
-- (they move nothing); the batched outcome statement says so and adds its
-- own net change to a counter slot, in the same statement. Everything else
-- (enqueue, the careful one-by-one outcome path, operator actions,
-- retention, and any replica of an earlier version during a rolling
-- upgrade) is counted by the trigger as before.
CREATE OR REPLACE FUNCTION settled_count_receipts() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d_fresh BIGINT;
    d_retried BIGINT;
    d_settled BIGINT;
    d_skipped BIGINT;
    d_dead BIGINT;
    d_canceled BIGINT;
BEGIN
    IF current_setting('settled.counted', true) = 'on' THEN
        RETURN NULL;
    END IF;
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
