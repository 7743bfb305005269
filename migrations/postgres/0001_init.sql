-- One row per receipt for its whole life. `status` is what was committed;
-- `pending`/`leased`/`retry_scheduled` are derived from it and the clock.
-- Mirrors migrations/sqlite/0001_init.sql column for column. Ids are
-- `COLLATE "C"` so that ordering is by bytes, as in SQLite.

-- SQLite's json_valid(): PostgreSQL 15 has no IS JSON predicate, and a bare
-- cast would raise a cast error instead of a CHECK violation. `json`, not
-- `jsonb`, so that an escaped NUL (\u0000) is accepted as SQLite accepts it.
CREATE FUNCTION settled_json_valid(doc TEXT) RETURNS BOOLEAN
    LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    PERFORM doc::json;
    RETURN TRUE;
EXCEPTION WHEN others THEN
    RETURN FALSE;
END;
$$;

CREATE TABLE store_identity (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    binding BYTEA NOT NULL CHECK (octet_length(binding) = 32)
);

CREATE TABLE receipts (
    receipt_id TEXT COLLATE "C" PRIMARY KEY NOT NULL
        CHECK (octet_length(receipt_id) BETWEEN 1 AND 512),
    finalized_at BIGINT NOT NULL CHECK (finalized_at >= 0),
    observation TEXT CHECK (observation IS NULL OR settled_json_valid(observation)),
    status TEXT NOT NULL CHECK (status IN ('active', 'settled', 'skipped', 'dead_lettered')),
    attempts BIGINT NOT NULL CHECK (attempts BETWEEN 0 AND 4294967295),
    row_version BIGINT NOT NULL CHECK (row_version >= 0),
    next_visible_at_ms BIGINT CHECK (next_visible_at_ms >= 0),
    lease_owner TEXT CHECK (octet_length(lease_owner) BETWEEN 1 AND 128),
    lease_token TEXT CHECK (length(lease_token) >= 32),
    lease_until_ms BIGINT CHECK (lease_until_ms >= 0),
    failure_code TEXT CHECK (failure_code IN (
        'invalid_receipt_signature', 'invalid_action_hash', 'untrusted_receipt_signer',
        'malformed_financial_metadata', 'invalid_observation', 'rpc', 'invalid_input',
        'invalid_dispatch', 'invalid_binding', 'unsupported', 'serialization', 'signature',
        'verification', 'backend')),
    failure_sha256 TEXT CHECK (length(failure_sha256) = 64),
    transcript_id TEXT CHECK (octet_length(transcript_id) BETWEEN 1 AND 512),
    skip_reason TEXT CHECK (skip_reason IN ('denied', 'no_economic_intent', 'zero_charge')),
    finished_at_ms BIGINT CHECK (finished_at_ms >= 0),
    created_at_ms BIGINT NOT NULL CHECK (created_at_ms >= 0),
    CHECK ((lease_owner IS NULL) = (lease_token IS NULL)
       AND (lease_token IS NULL) = (lease_until_ms IS NULL)),
    CHECK ((status = 'active') = (next_visible_at_ms IS NOT NULL)),
    CHECK (status = 'active' OR lease_owner IS NULL),
    CHECK ((status = 'settled') = (transcript_id IS NOT NULL)),
    CHECK ((status = 'skipped') = (skip_reason IS NOT NULL)),
    CHECK ((status = 'active') = (finished_at_ms IS NULL)),
    CHECK ((failure_code IS NULL) = (failure_sha256 IS NULL)),
    CHECK (status <> 'dead_lettered' OR failure_code IS NOT NULL)
);

-- The claim queue: only active rows, in claim order.
CREATE INDEX receipts_due ON receipts (next_visible_at_ms, receipt_id) WHERE status = 'active';
-- Dead-letter pages and status samples.
CREATE INDEX receipts_by_status ON receipts (status, finalized_at, receipt_id);

CREATE TABLE receipt_history (
    id BIGSERIAL PRIMARY KEY,
    receipt_id TEXT COLLATE "C" NOT NULL REFERENCES receipts (receipt_id) ON DELETE CASCADE,
    attempt BIGINT NOT NULL CHECK (attempt BETWEEN 0 AND 4294967295),
    outcome TEXT NOT NULL CHECK (outcome IN (
        'accepted', 'skipped', 'retryable', 'permanent', 'released', 'redrive')),
    code TEXT,
    detail_sha256 TEXT CHECK (length(detail_sha256) = 64),
    transcript_id TEXT,
    reason TEXT,
    worker_id TEXT NOT NULL,
    observed_at_ms BIGINT NOT NULL CHECK (observed_at_ms >= 0),
    route TEXT CHECK (route IN ('no_action', 'retry_scheduled', 'dead_lettered'))
);

CREATE INDEX receipt_history_by_receipt ON receipt_history (receipt_id, id);
