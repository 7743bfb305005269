-- Load @n receipts straight into a migrated settled SQLite database, for
-- timing /v1/status at scale (see docs/perf-log/groups-and-status.md, "/v1/status at 10 M"):
--   sqlite3 -cmd '.parameter set @n 10000000' settled.db < bench/status-load.sqlite.sql
-- Mix per 10 000 rows: 60 % settled, 5 % skipped, 1 % dead-lettered, 3 % waiting
-- for a retry, the rest pending; of the active rows, 2 per 10 000 hold a live lease
-- and 1 per 10 000 an expired one.
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
BEGIN;
WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < @n),
k AS (SELECT i, i % 100 AS m, i % 10000 AS l FROM g)
INSERT INTO receipts (receipt_id, finalized_at, observation, status, attempts, row_version,
    next_visible_at_ms, lease_owner, lease_token, lease_until_ms, failure_code, failure_sha256,
    transcript_id, skip_reason, finished_at_ms, created_at_ms)
SELECT printf('r%010d', i), 1700000000 + i / 100, '{"n":' || i || '}',
    CASE WHEN m < 60 THEN 'settled' WHEN m < 65 THEN 'skipped' WHEN m < 66 THEN 'dead_lettered'
         ELSE 'active' END,
    CASE WHEN m < 60 THEN 1 WHEN m < 66 THEN 2 WHEN m < 69 THEN 1 ELSE 0 END,
    1,
    CASE WHEN m < 66 THEN NULL ELSE 1700000000000 + i END,
    CASE WHEN m >= 66 AND l IN (70, 80, 90) THEN 'bench-worker' END,
    CASE WHEN m >= 66 AND l IN (70, 80, 90) THEN printf('%032x', i) END,
    CASE WHEN m >= 66 AND l IN (70, 80) THEN 4102444800000
         WHEN m >= 66 AND l = 90 THEN 1700000000000 END,
    CASE WHEN m BETWEEN 65 AND 68 THEN 'rpc' END,
    CASE WHEN m BETWEEN 65 AND 68 THEN printf('%064d', 0) END,
    CASE WHEN m < 60 THEN 'tx-' || i END,
    CASE WHEN m BETWEEN 60 AND 64 THEN 'denied' END,
    CASE WHEN m < 66 THEN 1700000000000 + i END,
    1700000000000
FROM k;
COMMIT;
