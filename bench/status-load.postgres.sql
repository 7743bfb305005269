-- Load :n receipts straight into a migrated settled PostgreSQL database, for
-- timing /v1/status at scale (see docs/perf-log/groups-and-status.md, "/v1/status at 10 M"):
--   PGOPTIONS='-c search_path=settled' psql -v n=10000000 -d DB -f bench/status-load.postgres.sql
-- (settled keeps its tables in the schema `settled`, or the one --pg-schema names).
-- The same mix as bench/status-load.sqlite.sql.
INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, row_version,
    next_visible_at_ms, lease_owner, lease_token, lease_until_ms, failure_code, failure_sha256,
    transcript_id, skip_reason, finished_at_ms, created_at_ms)
SELECT 'r' || lpad(i::text, 10, '0'), 1700000000 + i / 100, ('{"n":' || i || '}')::json,
    CASE WHEN m < 60 THEN 'settled' WHEN m < 65 THEN 'skipped' WHEN m < 66 THEN 'dead_lettered'
         ELSE 'active' END,
    CASE WHEN m < 60 THEN 1 WHEN m < 66 THEN 2 WHEN m < 69 THEN 1 ELSE 0 END,
    1,
    CASE WHEN m < 66 THEN NULL ELSE 1700000000000 + i END,
    CASE WHEN m >= 66 AND l IN (70, 80, 90) THEN 'bench-worker' END,
    CASE WHEN m >= 66 AND l IN (70, 80, 90) THEN lpad(to_hex(i), 32, '0') END,
    CASE WHEN m >= 66 AND l IN (70, 80) THEN 4102444800000
         WHEN m >= 66 AND l = 90 THEN 1700000000000 END,
    CASE WHEN m BETWEEN 65 AND 68 THEN 'rpc' END,
    CASE WHEN m BETWEEN 65 AND 68 THEN repeat('0', 64) END,
    CASE WHEN m < 60 THEN 'tx-' || i END,
    CASE WHEN m BETWEEN 60 AND 64 THEN 'denied' END,
    CASE WHEN m < 66 THEN 1700000000000 + i END,
    1700000000000
FROM generate_series(1, :n) AS i, LATERAL (SELECT i % 100 AS m, i % 10000 AS l) AS k;
VACUUM ANALYZE receipts;
