-- A history entry is only ever written by the statement that changes its
-- receipt, for exactly the rows it changed (src/store/postgres/guarded.rs,
-- careful.rs, write.rs), so the foreign key's check of each entry (a query
-- and a KEY SHARE lock on the row the statement has just updated; ~11 µs
-- per entry, a seventh of a batched outcome statement, in EXPLAIN ANALYZE)
-- proves nothing the statement does not. What it also did, deleting the
-- history of a deleted receipt (retention), is kept by a statement-level
-- trigger, whoever deletes (a replica of an earlier version too). No entry
-- is written for a receipt retention may delete: retention takes settled
-- and skipped receipts, and nothing appends history to those.
ALTER TABLE receipt_history DROP CONSTRAINT receipt_history_receipt_id_fkey;

CREATE FUNCTION settled_delete_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM receipt_history WHERE receipt_id IN (SELECT receipt_id FROM old_rows);
    RETURN NULL;
END;
$$;

CREATE TRIGGER receipts_history_cascade AFTER DELETE ON receipts
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settled_delete_history();
