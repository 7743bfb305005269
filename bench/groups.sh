#!/usr/bin/env bash
# The batched settle cycle without groups and with its receipts spread over N groups, alternating
# in the same minutes, three rounds on each backend; one JSON line per run on stdout.
#   bench/groups.sh target/release/settled-bench 1000 > groups.jsonl
# Needs SETTLED_TEST_POSTGRES_URL for the PostgreSQL runs.
set -u
BIN=$1 NGROUPS=${2:-1000} RECEIPTS=${RECEIPTS:-20000}
for round in 1 2 3; do
  for n in 0 "$NGROUPS"; do
    for backend in sqlite postgres; do
      result=$("$BIN" --spawn "$backend" --receipts "$RECEIPTS" --workers 8 --batch 256 \
        --groups "$n" --no-inprocess --json 2>/dev/null | tail -n1)
      echo "{\"label\":\"groups=$n $backend\",\"round\":$round,\"result\":${result:-null}}"
    done
  done
done
