#!/usr/bin/env bash
# Two builds of settled-bench on PostgreSQL's batched cycle, each without and with the receipts
# table analyzed every 2 s beside the run (as autovacuum would, on a server that has it on; this
# project's servers run with it off, so a bench table is otherwise never analyzed), ROUNDS rounds
# (default 3) alternating, pgmq's cycle (bench/pgmq_cost.sh) once per round. One JSON line a run:
#   bench/ab-statistics.sh OLD/settled-bench NEW/settled-bench > stats.jsonl
# PG_URL (default postgres://postgres@127.0.0.1:5432/postgres) names an existing database of the
# server; each run makes its own (settled_bench_*), which the analyzing loop finds by that name.
set -u
BASE=$1 NEW=$2
RECEIPTS=${RECEIPTS:-200000} ROUNDS=${ROUNDS:-3}
PG_URL=${PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}
here=$(cd "$(dirname "$0")" && pwd)
analyze_loop() {
  while :; do
    for db in $(psql -Atq "$PG_URL" -c \
      "SELECT datname FROM pg_database WHERE datname LIKE 'settled_bench_%'"); do
      psql -Atq "${PG_URL%/*}/$db" -c "ANALYZE settled.receipts" >/dev/null 2>&1
    done
    sleep 2
  done
}
for round in $(seq 1 "$ROUNDS"); do
  for label in base new; do
    bin=$([ "$label" = base ] && echo "$BASE" || echo "$NEW")
    for analyzed in false true; do
      loop=
      if [ "$analyzed" = true ]; then analyze_loop & loop=$!; fi
      result=$("$bin" --spawn postgres --postgres-url "$PG_URL" --receipts "$RECEIPTS" \
        --workers 8 --batch 256 --no-inprocess --json 2>/dev/null | tail -n1)
      if [ -n "$loop" ]; then kill "$loop"; wait "$loop" 2>/dev/null; fi
      echo "{\"label\":\"$label\",\"round\":$round,\"analyzed\":$analyzed,\"result\":${result:-null}}"
    done
  done
  pgmq=$(bash "$here/pgmq_cost.sh" "$PG_URL" 2>/dev/null | tr '\n' ' ')
  echo "{\"label\":\"pgmq\",\"round\":$round,\"analyzed\":false,\"result\":\"$pgmq\"}"
done
