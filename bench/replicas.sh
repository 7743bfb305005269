#!/usr/bin/env bash
# 1, 2 and 4 `settled` processes on one PostgreSQL database (docs/scaling.md): the batched cycle
# (RECEIPTS, 8 workers x 256) and one-by-one (ONE_BY_ONE, 64 workers), workers spread over the
# replicas, ROUNDS rounds (default 3) with the replica counts alternating; one JSON line per run.
#   bench/replicas.sh target/release/settled-bench > replicas.jsonl
set -u
BIN=$1
RECEIPTS=${RECEIPTS:-200000} ONE_BY_ONE=${ONE_BY_ONE:-20000} ROUNDS=${ROUNDS:-3}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
for round in $(seq 1 "$ROUNDS"); do
  for replicas in 1 2 4; do
    for workload in batched one_by_one; do
      if [ "$workload" = batched ]; then
        shape=(--receipts "$RECEIPTS" --workers 8 --batch 256)
      else
        shape=(--receipts "$ONE_BY_ONE" --workers 64 --batch 1)
      fi
      result=$("$BIN" --spawn postgres --postgres-url "$PG_URL" --replicas "$replicas" \
        "${shape[@]}" --no-inprocess --json 2>/dev/null | tail -n1)
      echo "{\"replicas\":$replicas,\"round\":$round,\"workload\":\"$workload\",\"result\":${result:-null}}"
    done
  done
done
