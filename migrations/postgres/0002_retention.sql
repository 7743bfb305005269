-- Retention finds finished receipts by when they finished.
CREATE INDEX receipts_finished ON receipts (finished_at_ms) WHERE status IN ('settled', 'skipped');
