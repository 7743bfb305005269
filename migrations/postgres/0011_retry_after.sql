-- A `retryable` outcome may carry the rail's own wait (`retry_after_ms`, its
-- `Retry-After`); the history entry keeps what the worker reported, so an
-- operator can see why a retry waited longer than the backoff. NULL: none
-- given (every entry before this migration, and every other outcome).
-- Nullable without a default: adding it rewrites nothing.
ALTER TABLE receipt_history ADD COLUMN retry_after_ms BIGINT CHECK (retry_after_ms >= 0);
