-- Rates over the last hour for `GET /v1/stats` (docs/operators.md, "Rates
-- over the last hour"). Each server counts in memory what it committed and
-- adds its counts here every few seconds (INSERT ... ON CONFLICT DO UPDATE
-- SET x = x + excluded.x), so the replicas of one database sum up in one
-- row per minute. The same flush deletes rows older than two hours: the
-- table stays at about 120 rows.
--
-- Not part of the ledger: no trigger or foreign key ties it to `receipts`,
-- and no claim, outcome or enqueue writes it. Counters a later version adds
-- are columns `INTEGER NOT NULL DEFAULT 0` (src/store/stats.rs), added with
-- ALTER TABLE ADD COLUMN: no CHECK here, which SQLite could only change by
-- rebuilding the table (see 0006). `depth` is the active receipts last
-- sampled in the minute; NULL when none was. The flush is a solo write of
-- the writer thread (src/store/sqlite/group.rs), joining the next group
-- commit.
CREATE TABLE stats_minutes (
    minute_ms     INTEGER PRIMARY KEY,
    enqueued      INTEGER NOT NULL DEFAULT 0,
    settled       INTEGER NOT NULL DEFAULT 0,
    skipped       INTEGER NOT NULL DEFAULT 0,
    retried       INTEGER NOT NULL DEFAULT 0,
    dead_lettered INTEGER NOT NULL DEFAULT 0,
    conflicts     INTEGER NOT NULL DEFAULT 0,
    depth         INTEGER
);
