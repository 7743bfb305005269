-- Groups (docs/groups.md): every receipt belongs to one (`default` unless the
-- producer names one), and claims are spread fairly over the groups with due
-- work, within each group's limits.
--
-- The column has a constant default, so adding it rewrites nothing; the claim
-- index gains the group as its first key, so a claim reads each group's due
-- rows in order (one index, not two: every write keeps each index up to date).
ALTER TABLE receipts ADD COLUMN receipt_group TEXT NOT NULL DEFAULT 'default'
    CHECK (length(CAST(receipt_group AS BLOB)) BETWEEN 1 AND 128);

DROP INDEX receipts_due;
CREATE INDEX receipts_due ON receipts (receipt_group, next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL;

-- One row per group ever named, with the operator's limits (NULL: none).
-- `tokens`/`tokens_at_ms` are the rate's token bucket as of its last claim.
CREATE TABLE receipt_groups (
    name TEXT PRIMARY KEY NOT NULL CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 128),
    paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    max_leased INTEGER CHECK (max_leased >= 0),
    rate_per_s REAL CHECK (rate_per_s > 0),
    burst INTEGER CHECK (burst >= 1),
    tokens REAL,
    tokens_at_ms INTEGER,
    updated_at_ms INTEGER,
    CHECK ((rate_per_s IS NULL) = (burst IS NULL))
) STRICT;

INSERT INTO receipt_groups (name) VALUES ('default');
