-- `scheduled` in `/v1/status`: receipts never attempted whose
-- `next_visible_at_ms` is still ahead (enqueued with a future
-- `visible_at_ms`). It depends on the clock, so no trigger can keep it; it
-- is counted when asked, as the range `next_visible_at_ms > now` of this
-- index, at a cost that grows with the receipts scheduled, not with the
-- table. Only rows made visible later than they were created (a future
-- `visible_at_ms`; also releases and redrives) enter it, so an ordinary
-- enqueue, due at once, writes no entry here.
-- Building it reads every row once: that must not fail the upgrade on a
-- large table (SET LOCAL ends with this migration's transaction).
SET LOCAL statement_timeout = 0;
CREATE INDEX receipts_scheduled ON receipts (next_visible_at_ms)
    WHERE status = 'active' AND attempts = 0 AND next_visible_at_ms > created_at_ms;
