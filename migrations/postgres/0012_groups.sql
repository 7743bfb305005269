-- Groups (docs/groups.md); mirrors migrations/sqlite/0012_groups.sql: every
-- receipt belongs to one (`default` unless the producer names one), and
-- claims are spread fairly over the groups with due work, within each
-- group's limits.
--
-- The column has a constant default, so adding it rewrites nothing; the claim
-- index gains the group as its first key (one index, not two: every write
-- keeps each index up to date). Building it reads every active row once.
SET LOCAL statement_timeout = 0;

ALTER TABLE receipts ADD COLUMN receipt_group TEXT NOT NULL DEFAULT 'default'
    CHECK (octet_length(receipt_group) BETWEEN 1 AND 128);

DROP INDEX receipts_due;
CREATE INDEX receipts_due ON receipts (receipt_group, next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL;

-- One row per group ever named, with the operator's limits (NULL: none).
-- A claim that meets a limited group locks its row, so that the limits hold
-- across every replica; `tokens`/`tokens_at_ms` are the rate's token bucket
-- as of its last claim.
CREATE TABLE receipt_groups (
    name TEXT PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 128),
    paused BOOLEAN NOT NULL DEFAULT false,
    max_leased BIGINT CHECK (max_leased >= 0),
    rate_per_s DOUBLE PRECISION CHECK (rate_per_s > 0),
    burst BIGINT CHECK (burst >= 1),
    tokens DOUBLE PRECISION,
    tokens_at_ms BIGINT,
    updated_at_ms BIGINT,
    CHECK ((rate_per_s IS NULL) = (burst IS NULL))
);

INSERT INTO receipt_groups (name) VALUES ('default');
