-- The claim index holds only rows that hold no lease; mirrors
-- migrations/postgres/0014_unleased_due.sql. A leased row stayed in
-- `receipts_due` at the head of its range, so every claim stepped over every
-- live lease of its group (reading each row for its lease) before it reached
-- a claimable one. A claim now takes the row out of the index and an outcome
-- or release that clears the lease puts it back; rows whose lease expired
-- are claimed from `receipts_leases` (the range `lease_until_ms <= now`,
-- bounded by the leases handed out). Claim order is unchanged.
DROP INDEX receipts_due;
CREATE INDEX receipts_due ON receipts (receipt_group, priority, next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL AND lease_token IS NULL;
