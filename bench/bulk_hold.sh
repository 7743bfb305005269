#!/usr/bin/env bash
# 10 000 receipts held by one filter action (POST /v1/bulk/hold) on a fresh PostgreSQL database,
# 3 runs, each on its own database, against the `settled` binary given (port 18181).
# Usage: bench/bulk_hold.sh target/release/settled
set -euo pipefail
BIN=$1
for run in 1 2 3; do
  db=bulkbench_$$_$run
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db" -qc "CREATE DATABASE $db" >/dev/null
  $BIN --database-url postgres://postgres@127.0.0.1:5432/$db --listen 127.0.0.1:18181 >/tmp/bulk_srv.log 2>&1 &
  pid=$!
  for _ in $(seq 50); do curl -sf http://127.0.0.1:18181/healthz >/dev/null && break; sleep 0.2; done
  python3 - <<'PY'
import json, urllib.request, time
def post(path, body):
    r = urllib.request.Request("http://127.0.0.1:18181"+path, data=json.dumps(body).encode(), headers={"content-type":"application/json"})
    return json.load(urllib.request.urlopen(r, timeout=60))
for b in range(10):
    post("/v1/receipts/batch", {"receipts":[{"receipt_id":f"big-{b*1000+i:05}","finalized_at":100} for i in range(1000)]})
f={"prefix":"big-","state":"pending"}
t=time.monotonic(); out=post("/v1/bulk/hold", {"filter":f,"expect_count":10000}); took=time.monotonic()-t
print(f"done={out['done']} complete={out.get('complete')} took={took:.2f}s")
PY
  kill $pid; wait $pid 2>/dev/null || true
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db" >/dev/null
done
