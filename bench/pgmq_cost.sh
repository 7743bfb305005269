#!/bin/bash
# pgmq's claim-and-complete cycle (pgmq.read of 256 with a visibility timeout, then pgmq.delete;
# 8 pgbench clients, 10 s over 1.28 M queued messages, so that it does not run dry as 768 k did
# in 15 s) on the PostgreSQL at ADMIN_URL, with what it writes per message: WAL bytes
# (pg_current_wal_lsn before and after), index entries (each inserted row and each update that
# was not HOT adding one entry to every index of its table, from pg_stat_user_tables) and the
# CPU of the backends serving pgbench (from /proc; the server must run on this machine).
# The same figures as settled-bench's db_* fields, for the same comparison (BENCHMARKS.md).
# Usage: bench/pgmq_cost.sh postgres://postgres@127.0.0.1:5432/postgres [delete|archive]
# `archive` completes each batch with pgmq.archive (the message moves to the queue's archive table,
# indexed, as a record of it is kept) instead of pgmq.delete: the peer's cycle when it keeps what
# settled keeps a row for.
set -eu
admin=$1
complete=${2:-delete}
case "$complete" in delete | archive) ;; *) echo "complete with delete or archive" >&2; exit 2 ;; esac
venv=${XDG_CACHE_HOME:-$HOME/.cache}/settled-bench/pgmq-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q pgmq==1.1.4 >/dev/null
sql=$(find "$venv" -name 'pgmq.sql' | head -n 1)
db=pgmq_cost_$$
url=${admin%/*}/$db
psql "$admin" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1' EXIT
psql "$url" -q -v ON_ERROR_STOP=1 -f "$sql" >/dev/null
psql "$url" -q -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
SELECT pgmq.create('q');
DO $$ BEGIN
  FOR i IN 1..5000 LOOP
    PERFORM pgmq.send_batch('q', array_fill('{"receipt_id":"r","finalized_at":1764460800}'::jsonb, ARRAY[256]));
  END LOOP;
END $$;
VACUUM ANALYZE pgmq.q_q;
CHECKPOINT;
SQL
cycle=$(mktemp)
cat >"$cycle" <<SQL
\set batch 256
WITH m AS (SELECT msg_id FROM pgmq.read('q', 30, :batch)) SELECT pgmq.$complete('q', array_agg(msg_id)) FROM m;
SQL
python3 - "$url" "$cycle" <<'PY'
import os, re, subprocess, sys, time
url, cycle = sys.argv[1], sys.argv[2]
tick = os.sysconf("SC_CLK_TCK")
def psql(q):
    return subprocess.run(["psql", url, "-Atc", q], check=True, capture_output=True, text=True).stdout.strip()
STATS = ("SELECT coalesce(sum(n_tup_ins),0), coalesce(sum(n_tup_upd),0), coalesce(sum(n_tup_hot_upd),0), "
         "coalesce(sum(n_tup_del),0), coalesce(sum((n_tup_ins + n_tup_upd - n_tup_hot_upd) * "
         "(SELECT count(*) FROM pg_index i WHERE i.indrelid = relid)),0) FROM pg_stat_user_tables")
count = lambda: int(psql("SELECT count(*) FROM pgmq.q_q"))
def proc_cpu(pid):
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    f = text[text.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / tick
# The backends serving pgbench (as settled-bench counts the backends serving settled): sampled
# while they run, each one's last reading kept.
import threading
seen, running = {}, True
def sample():
    while running:
        for pid in psql("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND pid <> pg_backend_pid()").split():
            cpu = proc_cpu(pid)
            if cpu is not None:
                seen[pid] = cpu
        time.sleep(0.2)
before_n, lsn, stats0 = count(), psql("SELECT pg_current_wal_lsn()"), psql(STATS).split("|")
sampler = threading.Thread(target=sample)
sampler.start()
out = subprocess.run(["pgbench", "-n", "-c", "8", "-j", "2", "-T", "10", "-f", cycle, url],
                     capture_output=True, text=True).stdout
running = False
sampler.join()
time.sleep(1.5)
wal = float(psql(f"SELECT pg_current_wal_lsn() - '{lsn}'::pg_lsn"))
stats1 = psql(STATS).split("|")
done = before_n - count()
secs = int(re.search(r"duration: (\d+) s", out).group(1)) if "duration" in out else 10
d = [float(b) - float(a) for a, b in zip(stats0, stats1)]
if count() == 0:
    print("queue ran dry: pgmq_msgs_per_sec is a lower bound")
print(f"pgmq_msgs_per_sec {done / secs:.0f}")
print(f"pgmq_wal_bytes_per_msg {wal / done:.0f}")
print(f"pgmq_index_entries_per_msg {d[4] / done:.2f}  (rows inserted {d[0] / done:.2f}, updated {d[1] / done:.2f}, hot {d[2] / done:.2f}, deleted {d[3] / done:.2f})")
print(f"pgmq_db_cpu_us_per_msg {1e6 * sum(seen.values()) / done:.1f}  (the backends serving pgbench)")
PY
rm -f "$cycle"
