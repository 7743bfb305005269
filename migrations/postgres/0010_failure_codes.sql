-- `GET /v1/receipts?code=…` (src/store/search.rs): the receipts whose last
-- failure has a given code, in page order `(finalized_at, receipt_id)`, as
-- one index range, so that a page costs the same however many receipts are
-- stored. Partial: only rows that failed at least once have an entry, so
-- an enqueue writes nothing here, and a claim stays a HOT update (it
-- changes no column of this index or of its predicate); an outcome adds an
-- entry only when it sets a new failure code on a row it updates anyway.
-- Building it reads every row once: that must not fail the upgrade on a
-- large table (SET LOCAL ends with this migration's transaction). Writes
-- wait for the build; reads go on.
SET LOCAL statement_timeout = 0;
CREATE INDEX receipts_failed ON receipts (failure_code, finalized_at, receipt_id)
    WHERE failure_code IS NOT NULL;
