-- Nothing to change on SQLite: one process serves a database, so no replica
-- takes claims and outcomes from others. PostgreSQL's
-- 0021_upkeep_holder.sql records where the replica doing the upkeep takes them.
SELECT 1;
