-- Group names ordered by their bytes, as receipt ids are (0001_init.sql) and
-- as SQLite orders them: a claim's walk of the groups with work, which turn
-- order it follows (docs/groups.md), and the pages of the group list then
-- agree on every server, whatever its default collation. Changing only the
-- collation rewrites no row; the indexes on these columns are rebuilt.
SET LOCAL statement_timeout = 0;

ALTER TABLE receipts ALTER COLUMN receipt_group TYPE TEXT COLLATE "C";
ALTER TABLE receipt_groups ALTER COLUMN name TYPE TEXT COLLATE "C";
