-- A set-based lease cycle of 256 receipts (insert, claim, settle; one statement each), for
-- measuring what the counting triggers cost on PostgreSQL (BENCHMARKS.md):
--   PGOPTIONS='-c search_path=settled' pgbench -n -c 8 -j 2 -T 10 -f bench/counts-cycle.pgbench.sql DB
\set base random(1, 2000000000)
INSERT INTO receipts (receipt_id, finalized_at, status, attempts, row_version, next_visible_at_ms, created_at_ms) SELECT 'p' || :client_id || '-' || :base || '-' || lpad(g::text, 3, '0'), 1, 'active', 0, 0, 1, 0 FROM generate_series(1, 256) g ON CONFLICT DO NOTHING;
UPDATE receipts SET row_version = 1, lease_owner = 'w', lease_token = md5(receipt_id), lease_until_ms = 99 WHERE receipt_id >= 'p' || :client_id || '-' || :base || '-' AND receipt_id < 'p' || :client_id || '-' || :base || '.';
UPDATE receipts SET status = 'settled', transcript_id = 't', next_visible_at_ms = NULL, lease_owner = NULL, lease_token = NULL, lease_until_ms = NULL, finished_at_ms = 5 WHERE receipt_id >= 'p' || :client_id || '-' || :base || '-' AND receipt_id < 'p' || :client_id || '-' || :base || '.';
