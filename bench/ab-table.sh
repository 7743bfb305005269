#!/usr/bin/env bash
# The reference table for two builds of settled-bench, alternating in the same minutes, with pgmq's
# cycle (bench/pgmq_cost.sh: rate, WAL, index entries, database CPU) once per round between them;
# one JSON line per run on stdout, for BENCHMARKS.md's medians of 3 (bench/ab-summary.py ab.jsonl).
#   bench/ab-table.sh OLD/target/release/settled-bench target/release/settled-bench > ab.jsonl
# Workloads (each on a fresh database): PostgreSQL batched cycle (RECEIPTS, 8 workers x 256),
# PostgreSQL one-by-one (ONE_BY_ONE receipts, 64 workers), PostgreSQL enqueue in batches of 256
# (4 producers; its enqueue phase), PostgreSQL one-by-one at HALF_RATE claims/s (default 1700,
# half the one-by-one peak measured here) for its p99s, PostgreSQL batched with 1 s leases
# (PAST_LEASES receipts, default 400000: a run much longer than its leases, as a server is after
# its first minute), SQLite batched cycle (RECEIPTS, 8 x 256),
# SQLite one-by-one (ONE_BY_ONE receipts, 64 workers).
# PG_URL (default postgres://postgres@127.0.0.1:5432/postgres) is the server; ROUNDS default 3.
set -u
BASE=$1 NEW=$2
RECEIPTS=${RECEIPTS:-200000} ONE_BY_ONE=${ONE_BY_ONE:-20000} ROUNDS=${ROUNDS:-3}
HALF_RATE=${HALF_RATE:-1700} PAST_LEASES=${PAST_LEASES:-400000}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
here=$(cd "$(dirname "$0")" && pwd)
run() { # label round workload args...
  local label=$1 round=$2 workload=$3
  shift 3
  local result
  result=$("$@" --no-inprocess --json 2>/dev/null | tail -n1)
  echo "{\"label\":\"$label\",\"round\":$round,\"workload\":\"$workload\",\"result\":${result:-null}}"
}
for round in $(seq 1 "$ROUNDS"); do
  for label in base new; do
    bin=$([ "$label" = base ] && echo "$BASE" || echo "$NEW")
    run "$label" "$round" pg_batched "$bin" --spawn postgres --postgres-url "$PG_URL" \
      --receipts "$RECEIPTS" --workers 8 --batch 256
    run "$label" "$round" pg_one_by_one "$bin" --spawn postgres --postgres-url "$PG_URL" \
      --receipts "$ONE_BY_ONE" --workers 64 --batch 1
    run "$label" "$round" pg_enqueue_256 "$bin" --spawn postgres --postgres-url "$PG_URL" \
      --receipts 50000 --enqueue-batch 256 --producers 4 --workers 8 --batch 256
    run "$label" "$round" pg_half_peak "$bin" --spawn postgres --postgres-url "$PG_URL" \
      --receipts "$ONE_BY_ONE" --workers 64 --batch 1 --rate "$HALF_RATE"
    run "$label" "$round" pg_past_leases "$bin" --spawn postgres --postgres-url "$PG_URL" \
      --receipts "$PAST_LEASES" --workers 8 --batch 256 --lease-ms 1000
    run "$label" "$round" sqlite_batched "$bin" --spawn sqlite \
      --receipts "$RECEIPTS" --workers 8 --batch 256
    run "$label" "$round" sqlite_one_by_one "$bin" --spawn sqlite \
      --receipts "$ONE_BY_ONE" --workers 64 --batch 1
  done
  pgmq=$(bash "$here/pgmq_cost.sh" "$PG_URL" 2>/dev/null | tr '\n' ' ')
  echo "{\"label\":\"pgmq\",\"round\":$round,\"workload\":\"pgmq_cycle\",\"result\":\"$pgmq\"}"
done
