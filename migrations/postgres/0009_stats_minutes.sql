-- Rates over the last hour for `GET /v1/stats` (docs/operators.md, "Rates
-- over the last hour"). Each server counts in memory what it committed and
-- adds its counts here every few seconds (INSERT ... ON CONFLICT DO UPDATE
-- SET x = x + excluded.x), so the replicas of one database sum up in one
-- row per minute. The same flush deletes rows older than two hours: the
-- table stays at about 120 rows.
--
-- Not part of the ledger: no trigger or foreign key ties it to `receipts`,
-- and no claim, outcome or enqueue writes it. Counters a later version adds
-- are columns `BIGINT NOT NULL DEFAULT 0` (src/store/stats.rs). `depth` is
-- the active receipts last sampled in the minute; NULL when none was.
CREATE TABLE stats_minutes (
    minute_ms     BIGINT PRIMARY KEY,
    enqueued      BIGINT NOT NULL DEFAULT 0,
    settled       BIGINT NOT NULL DEFAULT 0,
    skipped       BIGINT NOT NULL DEFAULT 0,
    retried       BIGINT NOT NULL DEFAULT 0,
    dead_lettered BIGINT NOT NULL DEFAULT 0,
    conflicts     BIGINT NOT NULL DEFAULT 0,
    depth         BIGINT
);
