#!/usr/bin/env python3
"""What PostgreSQL wrote per receipt in one settled-bench run, record by record.

settled-bench's `db_wal_bytes_per_receipt` is the WAL's length and its
`db_index_entries_per_receipt` an upper bound (every index of a table counted
for every row written). This reads the records themselves with `pg_waldump`
over the run's settle phase (`db_wal_range`) and counts them per kind and per
relation (`db_relations`), so that each index's real entries show.

    psql -c "ALTER SYSTEM SET wal_keep_size = '4GB'" -c "SELECT pg_reload_conf()"
    settled-bench --spawn postgres --receipts 50000 --workers 8 --batch 256 \
        --no-inprocess --json > run.json
    sudo -u postgres bench/pg_wal_records.py run.json   # reads the server's pg_wal
    psql -c "ALTER SYSTEM RESET wal_keep_size" -c "SELECT pg_reload_conf()"

The WAL must still be there: without wal_keep_size a checkpoint recycles it
within seconds and pg_waldump says it could not find a file.
"""
import collections
import json
import os
import re
import subprocess
import sys

run = json.load(open(sys.argv[1]))
wal_dir = sys.argv[2] if len(sys.argv) > 2 else "/var/lib/postgresql/15/main/pg_wal"
waldump = os.environ.get("PG_WALDUMP", "/usr/lib/postgresql/15/bin/pg_waldump")
start, end = run["db_wal_range"].split("-")
relations = run["db_relations"]
receipts = run["settled"] + run["skipped"] + run["dead_lettered"]

dump = subprocess.run([waldump, "-p", wal_dir, "-s", start, "-e", end],
                      capture_output=True, text=True, check=False)
if dump.returncode != 0 and not dump.stdout:
    sys.exit(dump.stderr.strip())
counts = collections.Counter()
sizes = collections.Counter()
record = re.compile(r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*(\d+).*desc: (\S+).*?"
                    r"blkref #0: rel \d+/(\d+/\d+)")
for line in dump.stdout.splitlines():
    m = record.search(line)
    if not m:
        continue
    rmgr, size, kind, rel = m.groups()
    key = (f"{rmgr}/{kind}", relations.get(rel, "(other database)"))
    counts[key] += 1
    sizes[key] += int(size)

print(f"{receipts} receipts, WAL {start}..{end}")
print(f"{'record':<24} {'relation':<28} {'per receipt':>12} {'bytes/receipt':>14}")
for (kind, rel), n in sorted(counts.items(), key=lambda kv: -sizes[kv[0]]):
    if n / receipts >= 0.01:
        print(f"{kind:<24} {rel:<28} {n / receipts:>12.2f} {sizes[(kind, rel)] / receipts:>14.0f}")
index_inserts = sum(n for (k, _), n in counts.items() if k in ("Btree/INSERT_LEAF", "Btree/INSERT_POST"))
print(f"btree entries inserted per receipt: {index_inserts / receipts:.2f}")
print(f"WAL bytes per receipt (records with a block): {sum(sizes.values()) / receipts:.0f}")
