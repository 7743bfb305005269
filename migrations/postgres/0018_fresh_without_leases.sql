-- A claim's update is never HOT (the lease is indexed), so its new row
-- version gets an entry in every index whose predicate it meets. The fresh
-- and retried indexes (status samples and searches, 0004_counts.sql) held
-- leased rows too, so every claim added an entry to one of them: one of the
-- nine index entries a receipt wrote (BENCHMARKS.md, "What each receipt
-- writes"). They now hold only rows without a lease; leased rows, live or
-- lapsed, are read from receipts_leases, whose size is bounded by the
-- leases handed out (src/store/postgres/read.rs, src/store/search/sql.rs).
-- An outcome or a release that clears the lease puts the row back, as
-- before. Building them reads every active row once: that must not fail the
-- upgrade of a large table (SET LOCAL ends with this migration's
-- transaction).
SET LOCAL statement_timeout = 0;

DROP INDEX receipts_fresh;
CREATE INDEX receipts_fresh ON receipts (finalized_at, receipt_id)
    WHERE status = 'active' AND attempts = 0 AND lease_token IS NULL;
DROP INDEX receipts_retried;
CREATE INDEX receipts_retried ON receipts (finalized_at, receipt_id)
    WHERE status = 'active' AND attempts > 0 AND lease_token IS NULL;
