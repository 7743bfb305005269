#!/usr/bin/env bash
# Tracing off against tracing on (every request a span, 100 % sampled, exported over OTLP to a
# local sink), alternating in the same minutes, three rounds of the batched settle cycle per
# backend; one JSON line per run on stdout, then the sink's request and byte counts.
#   bench/tracing-ab.sh target/release/settled-bench > tracing.jsonl
# Needs SETTLED_TEST_POSTGRES_URL for the PostgreSQL runs.
set -u
BENCH=$1 RECEIPTS=${RECEIPTS:-20000} PORT=${PORT:-4318}
python3 "$(dirname "$0")/otlp_sink.py" "$PORT" &
sink=$!
trap 'kill $sink 2>/dev/null' EXIT
sleep 0.5
for round in 1 2 3; do
  for tracing in off on; do
    for backend in sqlite postgres; do
      if [ "$tracing" = on ]; then
        env="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$PORT OTEL_TRACES_SAMPLER=always_on"
      else
        env="OTEL_SDK_DISABLED=true"
      fi
      result=$(env $env "$BENCH" --spawn "$backend" --receipts "$RECEIPTS" --workers 8 --batch 256 \
        --no-inprocess --json 2>/dev/null | tail -n1)
      echo "{\"label\":\"tracing $tracing $backend\",\"round\":$round,\"result\":${result:-null}}"
    done
  done
done
kill -TERM $sink
wait $sink 2>/dev/null
