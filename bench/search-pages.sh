#!/usr/bin/env bash
# Time one page of `GET /v1/receipts` per filter against a running settled
# whose database was loaded with bench/status-load.*.sql (n receipts), for
# docs/perf-log/groups-and-status.md ("Finding receipts"):
#   bench/search-pages.sh http://127.0.0.1:18931 1000000
# Prints, per query, the median of 11 requests (after 3 warm-ups) in ms and
# how many receipts the page held.
set -euo pipefail
base=$1 n=$2
mid=$((1700000000 + n / 200))          # finalized_at runs 1700000000 + i / 100
queries=(
  ""
  "order=oldest"
  "state=pending"
  "state=scheduled"
  "state=leased"
  "state=retry_scheduled"
  "state=settled"
  "state=skipped"
  "state=dead_lettered"
  "code=rpc"
  "owner=bench-worker"
  "prefix=x"
  "finalized_from=$mid&finalized_to=$((mid + 10))"
  "state=settled&finalized_from=$mid&finalized_to=$((mid + 10))"
  "finished_from_ms=1700000000000"
  "finished_to_ms=1700000000100"
)
for q in "${queries[@]}"; do
  url="$base/v1/receipts?limit=50&$q"
  for _ in 1 2 3; do curl -fsS -o /dev/null "$url"; done
  median=$(for _ in $(seq 11); do curl -fsS -o /dev/null -w '%{time_total}\n' "$url"; done \
    | sort -n | sed -n 6p)
  held=$(curl -fsS "$url" | jq '.receipts | length')
  more=$(curl -fsS "$url" | jq '.next_cursor != null')
  printf '%-60s %8.1f ms  %3s receipts  next=%s\n' "${q:-(no filter)}" \
    "$(echo "$median * 1000" | bc -l)" "$held" "$more"
done
