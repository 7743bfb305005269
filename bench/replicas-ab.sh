#!/usr/bin/env bash
# Two builds of settled-bench over 1, 2 and 4 `settled` processes on one PostgreSQL database
# (docs/scaling.md), one by one (64 workers, 20 000 receipts): claims and outcomes apart, and
# with each outcome carried in the worker's next claim (--carry, as the SDKs do). Each round runs
# every replica count and shape with the two builds alternating (which goes first alternates by
# round), each run on a fresh database;
# one JSON line per run in bench/ab-table.sh's shape, for bench/ab-summary.py:
#   bench/replicas-ab.sh OLD/target/release/settled-bench target/release/settled-bench > rep.jsonl
#   bench/ab-summary.py rep.jsonl
# PG_URL (default postgres://postgres@127.0.0.1:5432/postgres) is the server; ROUNDS default 3.
# NEW_REPLICA_ARGS (such as --forward) are given to the new build with 2 replicas or more.
set -u
BASE=$1 NEW=$2
ROUNDS=${ROUNDS:-3} RECEIPTS=${RECEIPTS:-20000}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
for round in $(seq 1 "$ROUNDS"); do
  for replicas in 1 2 4; do
    for shape in apart carried; do
      carry=()
      [ "$shape" = carried ] && carry=(--carry)
      # Which build goes first alternates by round: the first run of a pair
      # tends to be the faster one on a shared machine.
      order="base new"
      [ $((round % 2)) -eq 0 ] && order="new base"
      for label in $order; do
        bin=$([ "$label" = base ] && echo "$BASE" || echo "$NEW")
        extra=()
        [ "$label" = new ] && [ "$replicas" -gt 1 ] && read -ra extra <<< "${NEW_REPLICA_ARGS:-}"
        result=$("$bin" --spawn postgres --postgres-url "$PG_URL" --replicas "$replicas" \
          --receipts "$RECEIPTS" --workers 64 --batch 1 "${carry[@]}" "${extra[@]}" \
          --no-inprocess --json \
          2>/dev/null | tail -n1)
        echo "{\"label\":\"$label\",\"round\":$round,\"workload\":\"pg_r${replicas}_$shape\",\"result\":${result:-null}}"
      done
    done
  done
done
