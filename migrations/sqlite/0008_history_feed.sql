-- The history feed (`GET /v1/history`, docs/operators.md "Follow every
-- outcome"). SQLite has one writer, so `receipt_history.id` order is commit
-- order and the feed needs no new column or index: a feed position is the
-- row id.
--
-- Retention deletes finished receipts with their history. A reader whose
-- position is below an entry that was deleted before it read it must be
-- told (410 history_cursor_expired), not skip it silently: this one row
-- keeps the highest position retention ever deleted (`purge_finished`
-- raises it in the transaction that deletes). `tx` is always 0 here; it is
-- the PostgreSQL transaction id of the same table there.
--
-- `receipt_history.id` is not AUTOINCREMENT (a rebuild of the table to make
-- it so is not worth it): SQLite would hand a deleted highest id out again.
-- Retention therefore never deletes the receipt that owns the newest
-- history entry, so the highest id never goes down (see `write::purge`).
CREATE TABLE history_horizon (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    tx INTEGER NOT NULL CHECK (tx >= 0),
    entry_id INTEGER NOT NULL CHECK (entry_id >= 0)
) STRICT;
INSERT INTO history_horizon (id, tx, entry_id) VALUES (1, 0, 0);
