-- The history feed (`GET /v1/history`, docs/operators.md "Follow every
-- outcome"): every history entry in commit order, across replicas.
--
-- `id` (a sequence) is not commit order: a transaction that took id 5 may
-- commit after one that took id 6, and a reader that already passed 6 would
-- skip 5. So each entry records the id of the transaction that wrote it,
-- and the feed serves only entries whose transaction is older than every
-- transaction still running (`tx < pg_snapshot_xmin(pg_current_snapshot())`)
-- in `(tx, id)` order: any transaction that could still commit has a
-- larger id, so nothing can appear behind a position already served.
--
-- Entries written before this migration get tx = 1 (below every real
-- transaction id, and all committed): they come first, in id order. A
-- constant default adds the column without rewriting the table; the
-- default for new rows is then set apart.
ALTER TABLE receipt_history ADD COLUMN tx xid8 NOT NULL DEFAULT '1';
ALTER TABLE receipt_history ALTER COLUMN tx SET DEFAULT pg_current_xact_id();
-- The feed reads `(tx, id) > cursor` in that order. One more index entry
-- per history entry written (the only cost on the outcome path). Building
-- it reads every row once: that must not fail the upgrade on a large table
-- (SET LOCAL ends with this migration's transaction).
SET LOCAL statement_timeout = 0;
CREATE INDEX receipt_history_feed ON receipt_history (tx, id);

-- Retention deletes finished receipts with their history. A reader whose
-- position is below an entry that was deleted before it read it must be
-- told (410 history_cursor_expired), not skip it silently: this one row
-- keeps the highest feed position retention ever deleted; `purge_finished`
-- raises it in the transaction that deletes.
CREATE TABLE history_horizon (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    tx xid8 NOT NULL,
    entry_id BIGINT NOT NULL CHECK (entry_id >= 0)
);
INSERT INTO history_horizon (id, tx, entry_id) VALUES (1, '0', 0);
