-- The claim index holds only rows that hold no lease (docs/write-path.md;
-- BENCHMARKS.md, "The hot path, first round"). Before, a
-- leased row stayed in `receipts_due` with its old due time, at the head of
-- its range: every claim stepped over every live lease of its group (read
-- from the table, since the lease is not in the index) before it reached a
-- claimable row, so that a claim cost grew with the leases out, 64 rows per
-- claim at 64 one-by-one workers. Now a claim takes the row out of the index
-- (its update was already not HOT: the lease is in `receipts_leases`) and an
-- outcome or release that clears the lease puts it back. Rows whose lease
-- expired are claimed from `receipts_leases` (the range
-- `lease_until_ms <= now`, bounded by the leases handed out). Claim order
-- is unchanged. Building it reads every active row once.
SET LOCAL statement_timeout = 0;

DROP INDEX receipts_due;
CREATE INDEX receipts_due ON receipts (receipt_group, priority, next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL AND lease_token IS NULL;

-- `receipts_waiting` (the oldest due age of `/v1/status`) held exactly these
-- rows too, on a smaller key, and the planner took it for claims, reading
-- every due row of every group and sorting them. It states one condition
-- more, which no claim states (a claim never names `attempts`), so that it
-- only serves the statement that asks for it (src/store/postgres/read.rs).
DROP INDEX receipts_waiting;
CREATE INDEX receipts_waiting ON receipts (next_visible_at_ms)
    WHERE status = 'active' AND lease_token IS NULL AND held_at_ms IS NULL AND attempts >= 0;
