-- The rows holding a lease are read by range of `lease_until_ms` (the live
-- leases: counts, the leased sample, each group's leased count; the lapsed
-- ones: the oldest due, the groups a claim must visit), and each of those
-- reads also asks the row's group and whether it is held. With those two
-- columns only in the row, each such read visited the row of every lease:
-- at 10 M receipts with 2 000 live and 1 000 lapsed leases, ~5 ms of every
-- `/v1/status` (BENCHMARKS.md, "`/v1/status` at 10 M receipts in fewer round
-- trips"). At the end of the key they make those reads covering; the order
-- is unchanged. A lease implies an active row (a CHECK of the table), so
-- those reads do not name the status.
DROP INDEX receipts_leases;
CREATE INDEX receipts_leases
    ON receipts (lease_until_ms, attempts, next_visible_at_ms, finalized_at, receipt_id,
                 receipt_group, held_at_ms)
    WHERE lease_until_ms IS NOT NULL;
