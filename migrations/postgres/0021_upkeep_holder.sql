-- Where the replica doing the upkeep (the holder of the upkeep lock,
-- src/store/postgres/upkeep.rs) takes claims and outcomes from the other
-- replicas (`--advertise-url`), so that one replica runs every replica's
-- writes as few statements and commits. One row, written by the holder with
-- its connection's backend pid: a row whose pid no longer holds the lock is
-- stale, and is read as no holder. The holder renews `beat_at` at each of
-- its looks (once a second): a holder whose process stalled keeps its lock
-- (its session lives on) but stops beating, and is passed over.
CREATE TABLE upkeep_holder (
    only_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    url TEXT CHECK (octet_length(url) BETWEEN 1 AND 2048),
    pid INTEGER NOT NULL,
    beat_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
