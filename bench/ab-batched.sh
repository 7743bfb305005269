#!/usr/bin/env bash
# Two builds of settled-bench, alternating in the same minutes, three rounds of the batched
# settle cycle on each backend with its own --raw ceiling; one JSON line per run on stdout.
#   bench/ab-batched.sh OLD/target/release/settled-bench target/release/settled-bench > ab.jsonl
# Needs SETTLED_TEST_POSTGRES_URL for the PostgreSQL runs.
set -u
BASE=$1 NEW=$2 RECEIPTS=${RECEIPTS:-20000}
for round in 1 2 3; do
  for label in base new; do
    bin=$([ "$label" = base ] && echo "$BASE" || echo "$NEW")
    for backend in sqlite postgres; do
      result=$("$bin" --spawn "$backend" --receipts "$RECEIPTS" --workers 8 --batch 256 --raw \
        --no-inprocess --json 2>/dev/null | tail -n1)
      echo "{\"label\":\"$label $backend\",\"round\":$round,\"result\":${result:-null}}"
    done
  done
done
