-- no-transaction
-- Operator actions (docs/operators.md, "Act on many receipts"):
-- - `canceled`, a terminal status of its own, with the operator's reason;
-- - `held_at_ms`: a held receipt keeps its state and times but is not
--   claimable. It means something only while the receipt is active: an
--   outcome that finishes a held receipt leaves it as it is (the hot writes
--   do not touch it), and a redrive or a cancel clears it. The claim queue (receipts_due) and the oldest-due index
--   (receipts_waiting) leave held rows out, so a claim never steps over them;
-- - history entries `hold`, `unhold`, `cancel`, and two columns for operator
--   entries: `actor` (the name of the operator's token) and `note` (the
--   reason given).
-- The counters gain a `canceled` bucket.
--
-- New CHECKs mean rebuilding both tables the documented way, as in 0006
-- (https://sqlite.org/lang_altertable.html#otheralter), with the same
-- crash behaviour: all or nothing, and a re-run copies once more.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

-- The counting triggers name receipt_counts, which is rebuilt first; they
-- are created again below with the new bucket.
DROP TRIGGER receipts_count_insert;
DROP TRIGGER receipts_count_delete;
DROP TRIGGER receipts_count_update;
CREATE TABLE receipt_counts_new (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    fresh INTEGER NOT NULL CHECK (fresh >= 0),
    retried INTEGER NOT NULL CHECK (retried >= 0),
    settled INTEGER NOT NULL CHECK (settled >= 0),
    skipped INTEGER NOT NULL CHECK (skipped >= 0),
    dead_lettered INTEGER NOT NULL CHECK (dead_lettered >= 0),
    canceled INTEGER NOT NULL CHECK (canceled >= 0)
) STRICT;
INSERT INTO receipt_counts_new
SELECT id, fresh, retried, settled, skipped, dead_lettered,
       (SELECT COUNT(*) FROM receipts WHERE status = 'canceled')
FROM receipt_counts;
DROP TABLE receipt_counts;
ALTER TABLE receipt_counts_new RENAME TO receipt_counts;

CREATE TABLE receipts_new (
    receipt_id TEXT PRIMARY KEY NOT NULL
        CHECK (length(CAST(receipt_id AS BLOB)) BETWEEN 1 AND 512),
    finalized_at INTEGER NOT NULL CHECK (finalized_at >= 0),
    observation TEXT CHECK (observation IS NULL OR json_valid(observation)),
    status TEXT NOT NULL CHECK (status = 'active' OR status = 'settled' OR status = 'skipped' OR status = 'dead_lettered' OR status = 'canceled'),
    attempts INTEGER NOT NULL CHECK (attempts BETWEEN 0 AND 4294967295),
    row_version INTEGER NOT NULL CHECK (row_version >= 0),
    next_visible_at_ms INTEGER CHECK (next_visible_at_ms >= 0),
    lease_owner TEXT CHECK (length(CAST(lease_owner AS BLOB)) BETWEEN 1 AND 128),
    lease_token TEXT CHECK (length(lease_token) >= 32),
    lease_until_ms INTEGER CHECK (lease_until_ms >= 0),
    failure_code TEXT CHECK (failure_code = 'invalid_receipt_signature' OR failure_code = 'invalid_action_hash' OR failure_code = 'untrusted_receipt_signer' OR failure_code = 'malformed_financial_metadata' OR failure_code = 'invalid_observation' OR failure_code = 'rpc' OR failure_code = 'invalid_input' OR failure_code = 'invalid_dispatch' OR failure_code = 'invalid_binding' OR failure_code = 'unsupported' OR failure_code = 'serialization' OR failure_code = 'signature' OR failure_code = 'verification' OR failure_code = 'backend'),
    failure_sha256 TEXT CHECK (length(failure_sha256) = 64),
    transcript_id TEXT CHECK (length(CAST(transcript_id AS BLOB)) BETWEEN 1 AND 512),
    skip_reason TEXT CHECK (skip_reason = 'denied' OR skip_reason = 'no_economic_intent' OR skip_reason = 'zero_charge'),
    finished_at_ms INTEGER CHECK (finished_at_ms >= 0),
    created_at_ms INTEGER NOT NULL CHECK (created_at_ms >= 0),
    held_at_ms INTEGER CHECK (held_at_ms >= 0),
    cancel_reason TEXT CHECK (length(CAST(cancel_reason AS BLOB)) BETWEEN 1 AND 512),
    CHECK ((lease_owner IS NULL) = (lease_token IS NULL)
       AND (lease_token IS NULL) = (lease_until_ms IS NULL)),
    CHECK ((status = 'active') = (next_visible_at_ms IS NOT NULL)),
    CHECK (status = 'active' OR lease_owner IS NULL),
    CHECK ((status = 'settled') = (transcript_id IS NOT NULL)),
    CHECK ((status = 'skipped') = (skip_reason IS NOT NULL)),
    CHECK ((status = 'active') = (finished_at_ms IS NULL)),
    CHECK ((failure_code IS NULL) = (failure_sha256 IS NULL)),
    CHECK (status <> 'dead_lettered' OR failure_code IS NOT NULL),
    CHECK ((status = 'canceled') = (cancel_reason IS NOT NULL))
) STRICT;
-- Columns named, not `*`: a re-run (see 0006) finds the new columns there.
INSERT INTO receipts_new (receipt_id, finalized_at, observation, status, attempts, row_version, next_visible_at_ms, lease_owner, lease_token, lease_until_ms, failure_code, failure_sha256, transcript_id, skip_reason, finished_at_ms, created_at_ms)
SELECT receipt_id, finalized_at, observation, status, attempts, row_version, next_visible_at_ms, lease_owner, lease_token, lease_until_ms, failure_code, failure_sha256, transcript_id, skip_reason, finished_at_ms, created_at_ms FROM receipts;
DROP TABLE receipts;
ALTER TABLE receipts_new RENAME TO receipts;
CREATE INDEX receipts_due ON receipts (next_visible_at_ms, receipt_id)
    WHERE status = 'active' AND held_at_ms IS NULL;
CREATE INDEX receipts_finished ON receipts (finished_at_ms) WHERE status IN ('settled', 'skipped');
CREATE INDEX receipts_leases
    ON receipts (lease_until_ms, attempts, next_visible_at_ms, finalized_at, receipt_id)
    WHERE lease_until_ms IS NOT NULL;
CREATE INDEX receipts_waiting ON receipts (next_visible_at_ms)
    WHERE status = 'active' AND lease_token IS NULL AND held_at_ms IS NULL;
CREATE INDEX receipts_fresh ON receipts (finalized_at, receipt_id)
    WHERE status = 'active' AND attempts = 0;
CREATE INDEX receipts_retried ON receipts (finalized_at, receipt_id)
    WHERE status = 'active' AND attempts > 0;
CREATE INDEX receipts_by_status ON receipts (status, finalized_at, receipt_id)
    WHERE status <> 'active';
CREATE INDEX receipts_scheduled ON receipts (next_visible_at_ms)
    WHERE status = 'active' AND attempts = 0 AND next_visible_at_ms > created_at_ms;
CREATE TRIGGER receipts_count_insert AFTER INSERT ON receipts BEGIN
    UPDATE receipt_counts SET
        fresh = fresh + (NEW.status = 'active' AND NEW.attempts = 0),
        retried = retried + (NEW.status = 'active' AND NEW.attempts > 0),
        settled = settled + (NEW.status = 'settled'),
        skipped = skipped + (NEW.status = 'skipped'),
        dead_lettered = dead_lettered + (NEW.status = 'dead_lettered'),
        canceled = canceled + (NEW.status = 'canceled')
    WHERE id = 1;
END;
CREATE TRIGGER receipts_count_delete AFTER DELETE ON receipts BEGIN
    UPDATE receipt_counts SET
        fresh = fresh - (OLD.status = 'active' AND OLD.attempts = 0),
        retried = retried - (OLD.status = 'active' AND OLD.attempts > 0),
        settled = settled - (OLD.status = 'settled'),
        skipped = skipped - (OLD.status = 'skipped'),
        dead_lettered = dead_lettered - (OLD.status = 'dead_lettered'),
        canceled = canceled - (OLD.status = 'canceled')
    WHERE id = 1;
END;
CREATE TRIGGER receipts_count_update AFTER UPDATE OF status, attempts ON receipts
WHEN OLD.status IS NOT NEW.status OR (OLD.attempts = 0) IS NOT (NEW.attempts = 0)
BEGIN
    UPDATE receipt_counts SET
        fresh = fresh + (NEW.status = 'active' AND NEW.attempts = 0)
                      - (OLD.status = 'active' AND OLD.attempts = 0),
        retried = retried + (NEW.status = 'active' AND NEW.attempts > 0)
                          - (OLD.status = 'active' AND OLD.attempts > 0),
        settled = settled + (NEW.status = 'settled') - (OLD.status = 'settled'),
        skipped = skipped + (NEW.status = 'skipped') - (OLD.status = 'skipped'),
        dead_lettered = dead_lettered + (NEW.status = 'dead_lettered')
                                      - (OLD.status = 'dead_lettered'),
        canceled = canceled + (NEW.status = 'canceled') - (OLD.status = 'canceled')
    WHERE id = 1;
END;
CREATE TABLE receipt_history_new (
    id INTEGER PRIMARY KEY,
    receipt_id TEXT NOT NULL REFERENCES receipts (receipt_id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL CHECK (attempt BETWEEN 0 AND 4294967295),
    outcome TEXT NOT NULL CHECK (outcome = 'accepted' OR outcome = 'skipped' OR outcome = 'retryable' OR outcome = 'permanent' OR outcome = 'released' OR outcome = 'redrive' OR outcome = 'hold' OR outcome = 'unhold' OR outcome = 'cancel'),
    code TEXT,
    detail_sha256 TEXT CHECK (length(detail_sha256) = 64),
    transcript_id TEXT,
    reason TEXT,
    worker_id TEXT NOT NULL,
    observed_at_ms INTEGER NOT NULL CHECK (observed_at_ms >= 0),
    route TEXT CHECK (route = 'no_action' OR route = 'retry_scheduled' OR route = 'dead_lettered'),
    actor TEXT CHECK (length(actor) BETWEEN 1 AND 64),
    note TEXT CHECK (length(CAST(note AS BLOB)) BETWEEN 1 AND 512)
) STRICT;
INSERT INTO receipt_history_new (id, receipt_id, attempt, outcome, code, detail_sha256, transcript_id, reason, worker_id, observed_at_ms, route)
SELECT id, receipt_id, attempt, outcome, code, detail_sha256, transcript_id, reason, worker_id, observed_at_ms, route FROM receipt_history;
DROP TABLE receipt_history;
ALTER TABLE receipt_history_new RENAME TO receipt_history;
CREATE INDEX receipt_history_by_receipt ON receipt_history (receipt_id, id);
COMMIT;
PRAGMA foreign_keys = ON;
