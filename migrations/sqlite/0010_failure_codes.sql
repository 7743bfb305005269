-- `GET /v1/receipts?code=…` (src/store/search.rs): the receipts whose last
-- failure has a given code, in page order `(finalized_at, receipt_id)`, as
-- one index range, so that a page costs the same however many receipts are
-- stored. Partial: only rows that failed at least once have an entry, so
-- an enqueue and a claim write nothing here, and an outcome writes here
-- only for a receipt that has failed before (its failure is kept, so the
-- entry goes with it until the receipt is purged). A row without a failure
-- costs the outcome's UPDATE one check of `failure_code IS NOT NULL`.
CREATE INDEX receipts_failed ON receipts (failure_code, finalized_at, receipt_id)
    WHERE failure_code IS NOT NULL;
