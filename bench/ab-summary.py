#!/usr/bin/env python3
"""Medians of 3 (or of ROUNDS) from bench/ab-table.sh's (or bench/replicas-ab.sh's) JSON lines,
for BENCHMARKS.md.

    bench/ab-table.sh OLD/settled-bench NEW/settled-bench > ab.jsonl
    bench/ab-summary.py ab.jsonl

One line per workload and figure: the median of each build and every run in round order, then
pgmq's cycle per round, the largest peak RSS, and any run whose invariants failed or that gave no
result (a failed run must not hide in a median).
"""
import json
import re
import statistics
import sys

# The figures the reference table reports, per workload of ab-table.sh.
FIGURES = {
    "pg_batched": ["settled_per_sec", "db_cpu_us_per_receipt", "db_wal_bytes_per_receipt"],
    "pg_one_by_one": ["settled_per_sec"],
    "pg_enqueue_256": ["enqueued_per_sec"],
    "pg_half_peak": ["claim_p99_ms", "outcome_p99_ms"],
    "pg_past_leases": ["settled_per_sec", "db_cpu_us_per_receipt", "db_wal_bytes_per_receipt"],
    "sqlite_batched": ["settled_per_sec", "server_cpu_us_per_receipt"],
    "sqlite_one_by_one": ["settled_per_sec"],
}
# bench/replicas-ab.sh: N replicas, one by one, claims and outcomes apart or carried.
for _n in (1, 2, 4):
    for _shape in ("apart", "carried"):
        FIGURES[f"pg_r{_n}_{_shape}"] = ["settled_per_sec", "db_cpu_us_per_receipt", "claim_p99_ms"]


def main(path):
    runs = [json.loads(line) for line in open(path) if line.strip()]
    values, pgmq, rss, bad = {}, [], 0.0, []
    for run in runs:
        result = run["result"]
        if run["workload"] == "pgmq_cycle":
            found = re.search(r"pgmq_msgs_per_sec (\S+).*pgmq_db_cpu_us_per_msg (\S+)", result or "")
            pgmq.append(found.groups() if found else ("?", "?"))
            continue
        if not isinstance(result, dict):
            bad.append(f"{run['label']} round {run['round']} {run['workload']}: no result")
            continue
        if not result.get("invariants_ok", False):
            bad.append(f"{run['label']} round {run['round']} {run['workload']}: invariants failed")
        rss = max(rss, result.get("peak_rss_mb") or 0.0)
        for figure in FIGURES.get(run["workload"], []):
            key = (run["workload"], figure)
            values.setdefault(key, {}).setdefault(run["label"], []).append(result.get(figure))
    for (workload, figure), by_label in values.items():
        cells = []
        for label in ("base", "new"):
            got = by_label.get(label, [])
            present = [v for v in got if v is not None]
            median = statistics.median(present) if present else None
            cells.append(f"{label} {median} {got}")
        print(f"{workload:18} {figure:26} " + " | ".join(cells))
    print("pgmq msgs/s, database CPU us/msg, per round:", pgmq)
    print("largest peak RSS, MB:", rss)
    for line in bad:
        print("FAILED:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
