-- Counts in O(1): `/v1/status`, `/metrics` and the dashboard read counters
-- instead of scanning `receipts`.
--
-- Every row is in exactly one bucket, a function of its committed columns:
--   fresh         status = 'active' AND attempts = 0   (pending or leased)
--   retried       status = 'active' AND attempts > 0   (retry_scheduled or leased)
--   settled, skipped, dead_lettered                     (the status itself)
-- Row triggers keep one counter per bucket in the same transaction as every
-- write, however the write is issued (one statement per item or one per
-- batch), so the counters are exact in every snapshot. SQLite has a single
-- writer, so one counter row is no hot spot; one row with a column per
-- bucket costs one UPDATE per changed receipt (two rows, one per bucket,
-- measured about 1.5 us more per settled receipt).
--
-- What depends on the clock (a lease is live while lease_until_ms > now) is
-- counted at read time from `receipts_leases`, which holds only rows with a
-- lease: pending = fresh - live leases of fresh rows, and so on. Its size is
-- bounded by the leases handed out, not by the receipts stored.
--
-- Writers must never use REPLACE (INSERT OR REPLACE, ON CONFLICT REPLACE):
-- its implicit delete fires no trigger here (recursive_triggers is off).
CREATE TABLE receipt_counts (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fresh INTEGER NOT NULL CHECK (fresh >= 0),
    retried INTEGER NOT NULL CHECK (retried >= 0),
    settled INTEGER NOT NULL CHECK (settled >= 0),
    skipped INTEGER NOT NULL CHECK (skipped >= 0),
    dead_lettered INTEGER NOT NULL CHECK (dead_lettered >= 0)
) STRICT;

-- Back-fill from the rows already stored, in one scan.
INSERT INTO receipt_counts (id, fresh, retried, settled, skipped, dead_lettered)
SELECT 1, COUNT(*) FILTER (WHERE status = 'active' AND attempts = 0),
       COUNT(*) FILTER (WHERE status = 'active' AND attempts > 0),
       COUNT(*) FILTER (WHERE status = 'settled'),
       COUNT(*) FILTER (WHERE status = 'skipped'),
       COUNT(*) FILTER (WHERE status = 'dead_lettered')
FROM receipts;

CREATE TRIGGER receipts_count_insert AFTER INSERT ON receipts BEGIN
    UPDATE receipt_counts SET
        fresh = fresh + (NEW.status = 'active' AND NEW.attempts = 0),
        retried = retried + (NEW.status = 'active' AND NEW.attempts > 0),
        settled = settled + (NEW.status = 'settled'),
        skipped = skipped + (NEW.status = 'skipped'),
        dead_lettered = dead_lettered + (NEW.status = 'dead_lettered')
    WHERE id = 1;
END;

CREATE TRIGGER receipts_count_delete AFTER DELETE ON receipts BEGIN
    UPDATE receipt_counts SET
        fresh = fresh - (OLD.status = 'active' AND OLD.attempts = 0),
        retried = retried - (OLD.status = 'active' AND OLD.attempts > 0),
        settled = settled - (OLD.status = 'settled'),
        skipped = skipped - (OLD.status = 'skipped'),
        dead_lettered = dead_lettered - (OLD.status = 'dead_lettered')
    WHERE id = 1;
END;

-- `UPDATE OF status, attempts`: claims, extensions and releases never set
-- these columns, so they do not run the trigger at all.
CREATE TRIGGER receipts_count_update AFTER UPDATE OF status, attempts ON receipts
WHEN OLD.status IS NOT NEW.status OR (OLD.attempts = 0) IS NOT (NEW.attempts = 0)
BEGIN
    UPDATE receipt_counts SET
        fresh = fresh + (NEW.status = 'active' AND NEW.attempts = 0)
                      - (OLD.status = 'active' AND OLD.attempts = 0),
        retried = retried + (NEW.status = 'active' AND NEW.attempts > 0)
                          - (OLD.status = 'active' AND OLD.attempts > 0),
        settled = settled + (NEW.status = 'settled') - (OLD.status = 'settled'),
        skipped = skipped + (NEW.status = 'skipped') - (OLD.status = 'skipped'),
        dead_lettered = dead_lettered + (NEW.status = 'dead_lettered')
                                      - (OLD.status = 'dead_lettered')
    WHERE id = 1;
END;

-- Rows holding a lease, live or expired (the lease columns are all set or
-- all NULL, and only active rows hold one). Live leases are the range
-- lease_until_ms > now, expired ones the rest; the columns after the first
-- let the live counts, the leased sample and the oldest expired lease be
-- read from the index alone, without visiting the rows.
CREATE INDEX receipts_leases
    ON receipts (lease_until_ms, attempts, next_visible_at_ms, finalized_at, receipt_id)
    WHERE lease_until_ms IS NOT NULL;

-- Active rows not holding a lease, in due order: the oldest due age is the
-- first entry (or an expired lease, from receipts_leases), without stepping
-- over leased rows.
CREATE INDEX receipts_waiting ON receipts (next_visible_at_ms)
    WHERE status = 'active' AND lease_token IS NULL;

-- Status samples are ordered by (finalized_at, receipt_id) within a state.
-- One index per bucket, so each sample is a range scan that stops after
-- `limit` rows (stepping over live leases only). Finished rows keep
-- receipts_by_status (also the dead-letter pages); active rows leave it, so
-- each row is still in exactly one of these indexes.
CREATE INDEX receipts_fresh ON receipts (finalized_at, receipt_id)
    WHERE status = 'active' AND attempts = 0;
CREATE INDEX receipts_retried ON receipts (finalized_at, receipt_id)
    WHERE status = 'active' AND attempts > 0;
DROP INDEX receipts_by_status;
CREATE INDEX receipts_by_status ON receipts (status, finalized_at, receipt_id)
    WHERE status <> 'active';
