#!/usr/bin/env bash
# Tracing off, tracing on (every request a span, 100 % sampled, exported over OTLP to a local
# sink) and tracing on towards a collector that accepts connections and never answers,
# alternating in the same minutes, three rounds of the batched settle cycle per backend; one
# JSON line per run on stdout, then the sink's request and byte counts.
#   bench/tracing-ab.sh target/release/settled-bench > tracing.jsonl
# Needs SETTLED_TEST_POSTGRES_URL for the PostgreSQL runs. MODES="off on" leaves out the silent one.
set -u
BENCH=$1 RECEIPTS=${RECEIPTS:-20000} PORT=${PORT:-4318} SILENT=${SILENT:-4319} MODES=${MODES:-off on silent}
here=$(dirname "$0")
python3 "$here/otlp_sink.py" "$PORT" &
sink=$!
python3 -c "
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(1024)
held = []
while True:
    held.append(s.accept()[0])
" "$SILENT" &
silent=$!
trap 'kill $sink $silent 2>/dev/null' EXIT
sleep 0.5
for round in 1 2 3; do
  for mode in $MODES; do
    for backend in sqlite postgres; do
      case $mode in
        on) env="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$PORT OTEL_TRACES_SAMPLER=always_on" ;;
        silent) env="OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$SILENT OTEL_TRACES_SAMPLER=always_on" ;;
        *) env="OTEL_SDK_DISABLED=true" ;;
      esac
      result=$(env $env "$BENCH" --spawn "$backend" --receipts "$RECEIPTS" --workers 8 --batch 256 \
        --no-inprocess --json 2>/dev/null | tail -n1)
      echo "{\"label\":\"tracing $mode $backend\",\"round\":$round,\"result\":${result:-null}}"
    done
  done
done
kill -TERM $sink
wait $sink 2>/dev/null
