-- Nothing to change on SQLite: its text is ordered by bytes (BINARY) unless
-- a column says otherwise, and the group columns do not. PostgreSQL's
-- 0020_group_names_by_bytes.sql makes its group names follow the same order.
SELECT 1;
