-- The rail's own code for a failure (`card_declined`), beside the closed
-- failure code (docs/concepts.md, "Failure codes"): the last one on the
-- receipt, and each failure's in its history entry. Nullable columns without
-- a default: adding them rewrites nothing. Their form (1..=64 characters of
-- [A-Za-z0-9_.:-]) is checked where an outcome is read.
ALTER TABLE receipts
    ADD COLUMN failure_rail_code TEXT
        CHECK (failure_rail_code IS NULL OR length(failure_rail_code) BETWEEN 1 AND 64);
ALTER TABLE receipt_history
    ADD COLUMN rail_code TEXT
        CHECK (rail_code IS NULL OR length(rail_code) BETWEEN 1 AND 64);
-- The receipts an operator holds, counted by `/v1/status` without a scan:
-- a range of this index, as small as the number held.
CREATE INDEX receipts_held ON receipts (held_at_ms)
    WHERE status = 'active' AND held_at_ms IS NOT NULL;
