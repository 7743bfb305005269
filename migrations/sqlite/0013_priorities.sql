-- Priorities (docs/groups.md, "Priorities"). Within a group a claim takes
-- the highest priority first, then the oldest due.
--
-- A constant default rewrites nothing. The claim index gains the priority
-- after the group: a claim reads each group one priority at a time (an
-- index range `(group, priority, due <= now)` that ends at the first row not
-- yet due), highest first.
ALTER TABLE receipts ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
    CHECK (priority BETWEEN -1000 AND 1000);

DROP INDEX receipts_due;
CREATE INDEX receipts_due ON receipts (receipt_group, priority, next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL;
