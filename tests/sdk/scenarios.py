"""What the worker SDKs must show, against the real server, for one language
and one backend (run by tests/sdk/driver.rs; by hand:

    SETTLED_BIN=target/debug/settled clients/python/.venv/bin/python \
        tests/sdk/scenarios.py --lang python --backend sqlite [--only NAME]

with SETTLED_TEST_POSTGRES_URL set for --backend postgres, and SETTLED_TEST_HA_URL — the URL
`tests/ha/cluster.sh up` prints — for the failover scenario).

The workers are the example workers (examples/python/worker.py on the Python
SDK, examples/node/worker.mjs on the TypeScript SDK, examples/java's jar on the
Java SDK) started as processes;
their handler is the simulated rail, its duration set by the flags. Each
scenario has a server (and a database) of its own. Extension and outcome
requests are counted by a proxy between a worker and the server where a
scenario needs it. Every scenario ends by checking each receipt through the
API: settled once (one `accepted` history entry), nothing left leased.
"""

from __future__ import annotations

import collections
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
WORKER_TOKEN = "worker-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"
FINALIZED = 1_764_460_800


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def enc(receipt_id: str) -> str:
    return urllib.parse.quote(receipt_id, safe="")


def wait_for(what: str, check: Any, timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


# ---------------------------------------------------------------------------
# The server and its database


class Database:
    """A database of its own: a SQLite file, or a fresh PostgreSQL database."""

    def __init__(self, backend: str, tmp: Path, name: str, ha: str | None = None):
        """`ha`: on the HA cluster, settled given every node ("hosts") or HAProxy ("haproxy")."""
        self.backend = backend
        if backend == "sqlite":
            self.url = f"sqlite:{tmp / (name + '.db')}"
            self.admin = None
            return
        # The HA cluster's URL names every node; psql and settled both pick the primary.
        base = os.environ["SETTLED_TEST_HA_URL" if ha else "SETTLED_TEST_POSTGRES_URL"]
        self.admin = base
        self.name = f"settled_test_sdk_{name}_{uuid.uuid4().hex[:8]}"
        # CREATE and DROP DATABASE wait for the server's checkpoints and for each other,
        # which takes minutes on a loaded machine: not the test's subject.
        self.psql(f"CREATE DATABASE {self.name}", timeout=300)
        if ha == "haproxy":
            # deploy/haproxy/haproxy.cfg: one address that leads to the primary.
            base = cluster("haproxy-up")
        parts = urllib.parse.urlsplit(base)
        self.url = urllib.parse.urlunsplit(parts._replace(path="/" + self.name))

    def psql(self, sql: str, timeout: float = 60) -> str:
        assert self.admin is not None
        out = subprocess.run(
            ["psql", self.admin, "-Atqc", sql], capture_output=True, text=True, timeout=timeout
        )
        assert out.returncode == 0, f"psql {sql!r}: {out.stderr}"
        return out.stdout

    def terminate_backends(self) -> int:
        """Terminate every PostgreSQL connection of the server (as a failover would)."""
        out = self.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE datname = '{self.name}' AND pid <> pg_backend_pid()"
        )
        return int(out.strip() or 0)

    def drop(self) -> None:
        """Drop the scenario's database; one that cannot be dropped now is left for the next
        run's clean-up (.ci/run drops every settled_test_% database), not a failure."""
        if self.admin is not None:
            try:
                self.psql(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)", timeout=300)
            except (subprocess.TimeoutExpired, AssertionError) as e:
                log(f"  (database {self.name} left behind: {e})")


class Server:
    def __init__(self, db: Database, tmp: Path, tokens: bool = True):
        self.db, self.tmp, self.tokens = db, tmp, tokens
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        # The server's last log lines (warnings and errors), shown when a scenario fails.
        self.recent: collections.deque[str] = collections.deque(maxlen=40)
        self.start()
        token = {"authorization": f"Bearer {OPERATOR_TOKEN}"} if tokens else {}
        self.http = httpx.Client(base_url=self.base, headers=token, timeout=30)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [
            os.environ["SETTLED_BIN"],
            "--listen",
            f"127.0.0.1:{self.port}",
            "--database-url",
            self.db.url,
            "--log-format",
            "json",
        ]
        if self.tokens:
            args += ["--token", f"worker:{WORKER_TOKEN}", "--token", f"operator:{OPERATOR_TOKEN}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")}
        env["RUST_LOG"] = "warn,settled::server=info"
        self.proc = subprocess.Popen(
            args, cwd=self.tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            try:
                address = json.loads(line)["fields"].get("address")
            except (ValueError, KeyError):
                address = None
            if address:
                self.port = int(address.rsplit(":", 1)[1])
                break
            assert time.monotonic() < deadline, "the server did not say where it listens"
        else:
            raise AssertionError(f"the server exited before listening ({self.proc.wait()})")
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.recent.append(line.rstrip("\n"))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.http.close()

    def enqueue(self, n: int, prefix: str) -> list[str]:
        ids = [f"{prefix}/{i:05} é?#%+" if i % 97 == 5 else f"{prefix}-{i:05}" for i in range(n)]
        for start in range(0, n, 1000):
            chunk = ids[start : start + 1000]
            body = {
                "receipts": [
                    {"receipt_id": r, "finalized_at": FINALIZED, "observation": {"amount_cents": 100 + i}}
                    for i, r in enumerate(chunk)
                ]
            }
            answer = self.http.post("/v1/receipts/batch", json=body)
            assert answer.status_code == 200, answer.text
            assert all(r["status"] == "created" for r in answer.json()["results"])
        return ids

    def counts(self) -> dict[str, int]:
        answer = self.http.get("/v1/status")
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["counts"])

    def counts_or_none(self) -> dict[str, int] | None:
        """The counts, or None while the server answers 503 (its database failing over)."""
        answer = self.http.get("/v1/status")
        if answer.status_code == 503:
            assert answer.headers.get("retry-after"), "a 503 carries Retry-After"
            return None
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["counts"])

    def info(self) -> dict[str, Any]:
        answer = self.http.get("/v1/info")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def receipt(self, receipt_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/receipts/{enc(receipt_id)}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def check_settled_once(self, ids: list[str]) -> None:
        """Every receipt settled, with exactly one accepted outcome, no lease left."""
        for receipt_id in ids:
            view = self.receipt(receipt_id)
            accepted = [h for h in view["history"] if h["outcome"] == "accepted"]
            assert view["state"] == "settled", f"{receipt_id} is {view['state']}: {view}"
            assert len(accepted) == 1, f"{receipt_id} accepted {len(accepted)} times: {view}"
            assert view.get("lease") is None, f"{receipt_id} still leased: {view}"
        counts = self.counts()
        assert counts["settled"] == len(ids), counts
        assert counts["leased"] == counts["pending"] == counts["retry_scheduled"] == 0, counts


# ---------------------------------------------------------------------------
# A counting proxy between a worker and the server


class Proxy:
    """Forwards every request, counts them by path, and may refuse heartbeats (503)."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.requests: Counter[str] = Counter()
        self.bodies: list[tuple[str, bytes]] = []
        self.refuse_heartbeats = False
        self.refuse_claims = False
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                kind = re.sub(r"^/v1/receipts/[^/]+/", "/v1/receipts/{id}/", path)
                with proxy.lock:
                    proxy.requests[f"{self.command} {kind}"] += 1
                    proxy.bodies.append((f"{self.command} {kind}", body))
                    refuse = (proxy.refuse_heartbeats and "lease" in kind) or (
                        proxy.refuse_claims and kind == "/v1/claims"
                    )
                if refuse:
                    self.answer(503, b'{"type":"about:blank","title":"Service Unavailable","status":503,'
                                     b'"detail":"refused by the test proxy","code":"backend_unavailable",'
                                     b'"class":"backend"}', "application/problem+json")
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                try:
                    with httpx.Client(timeout=60) as client:
                        answer = client.request(self.command, proxy.upstream + self.path,
                                                content=body, headers=headers)
                except httpx.TransportError:
                    self.close_connection = True
                    return
                self.answer(answer.status_code, answer.content,
                            answer.headers.get("content-type", "application/json"))

            def answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PUT = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def count(self, kind: str) -> int:
        with self.lock:
            return self.requests[kind]

    def outcome_bodies_naming(self, receipt_id: str) -> int:
        """Requests that carried an outcome for `receipt_id`: outcome requests, and claims
        with `outcomes` (the SDKs send outcomes along with their next claim)."""
        needle = json.dumps(receipt_id).encode()

        def carries(kind: str, body: bytes) -> bool:
            if "outcome" in kind:
                return True
            return kind == "POST /v1/claims" and bool(body) and bool(json.loads(body).get("outcomes"))

        with self.lock:
            return sum(1 for kind, body in self.bodies if needle in body and carries(kind, body))

    def close(self) -> None:
        self.server.shutdown()


# ---------------------------------------------------------------------------
# Worker processes (the example workers on the SDKs)


class WorkerProcess:
    def __init__(self, lang: str, url: str, name: str, tmp: Path, *flags: str, token: str = WORKER_TOKEN):
        program = {
            "python": [sys.executable, str(ROOT / "examples/python/worker.py")],
            "node": ["node", str(ROOT / "examples/node/worker.mjs")],
            # Built by clients/java/build.sh.
            "java": ["java", "-XX:+UseSerialGC", "-jar", str(ROOT / "examples/java/target/settled-example-worker.jar")],
        }[lang]
        self.name = name
        self.stdout_path = tmp / f"{name}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SETTLED_", "RAIL_"))}
        env.update({"SETTLED_URL": url, "SETTLED_TOKEN": token})
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [*program, "--worker-id", name, "--timeout-rate", "0", "--decline-rate", "0", *flags],
            env=env, stdin=subprocess.DEVNULL, stdout=open(self.stdout_path, "w"),
            stderr=subprocess.PIPE, text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip()))

    def log(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout} s; its log:\n{self.log()}")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def summary(self) -> dict[str, Any]:
        for line in reversed(self.stdout_path.read_text().splitlines()):
            try:
                return dict(json.loads(line))
            except ValueError:
                continue
        raise AssertionError(f"{self.name} printed no summary; its log:\n{self.log()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def finish(workers: list[WorkerProcess], timeout: float) -> list[dict[str, Any]]:
    """Wait for each worker's clean exit; their summaries."""
    summaries = []
    for w in workers:
        status = w.wait(timeout)
        assert status == 0, f"{w.name} exited with {status}; its log:\n{w.log()}"
        summary = w.summary()
        assert not summary["errors"] or set(summary["errors"]) <= {"connection", "backend_unavailable"}, summary
        summaries.append(summary)
    return summaries


def total(summaries: list[dict[str, Any]], key: str) -> int:
    return sum(int(s.get(key, 0)) for s in summaries)


# ---------------------------------------------------------------------------
# The scenarios


class Scenarios:
    def __init__(self, lang: str, backend: str, tmp: Path):
        self.lang, self.backend, self.tmp = lang, backend, tmp
        self.started: list[WorkerProcess] = []

    def server(self, name: str, tokens: bool = True, ha: str | None = None) -> Server:
        return Server(Database(self.backend, self.tmp, name, ha), self.tmp, tokens)

    def worker(self, url: str, name: str, *flags: str, **kw: Any) -> WorkerProcess:
        w = WorkerProcess(self.lang, url, f"{self.lang}-{name}", self.tmp, *flags, **kw)
        self.started.append(w)
        return w

    def many_workers_settle_every_receipt_once(self, s: Server) -> None:
        """1. 2 000 receipts, 3 worker processes x concurrency 8: each settled once, no error."""
        ids = s.enqueue(2000, "many")
        started = time.monotonic()
        workers = [
            self.worker(s.base, f"many-{i}", "--concurrency", "8", "--batch-size", "8",
                        "--lease-ms", "10000", "--wait-ms", "500", "--latency-ms", "2",
                        "--exit-when-idle", "3")
            for i in range(3)
        ]
        summaries = finish(workers, 120)
        log(f"  2000 receipts settled by 3 x 8 in {time.monotonic() - started:.1f} s: "
            f"{[s['accepted'] for s in summaries]}")
        assert total(summaries, "accepted") == 2000, summaries
        assert total(summaries, "lost") == 0, summaries
        assert all(not s["errors"] for s in summaries), summaries
        s.check_settled_once(ids)

    def slow_handlers_heartbeat_in_one_request(self, s: Server) -> None:
        """2. Handlers taking 3 x lease_ms settle with no conflict; 64 leases cost
        one extension request per heartbeat interval."""
        lease_ms = 1500
        ids = s.enqueue(64, "slow")
        proxy = Proxy(s.base)
        w = self.worker(proxy.base, "slow", "--concurrency", "64", "--batch-size", "64",
                        "--lease-ms", str(lease_ms), "--wait-ms", "200", "--slow-rate", "1",
                        "--slow-ms", str(3 * lease_ms), "--exit-when-idle", "2")
        [summary] = finish([w], 60)
        extensions = proxy.count("POST /v1/leases/extend")
        singles = proxy.count("POST /v1/receipts/{id}/lease")
        log(f"  64 leases held for {3 * lease_ms} ms: {extensions} extension requests, "
            f"{singles} single ones; {summary}")
        # 4.5 s at one heartbeat per 0.5 s: about 9 (not 9 x 64 = 576).
        assert 6 <= extensions <= 14, (extensions, summary)
        assert singles == 0
        assert summary["heartbeats"] == extensions
        assert summary["lost"] == 0 and summary["accepted"] == 64, summary
        proxy.close()
        s.check_settled_once(ids)
        for receipt_id in ids[:5]:
            assert s.receipt(receipt_id)["attempts"] == 0

    def a_lost_lease_fires_the_signal_and_sends_nothing(self, s: Server) -> None:
        """3. Heartbeats refused until the lease expires, and another worker claims
        the receipt: the handler's signal fires within one heartbeat interval of
        the end of the lease, the SDK sends no outcome for it, and counts it."""
        lease_ms = 1500
        [receipt_id] = s.enqueue(1, "lost")
        proxy = Proxy(s.base)
        proxy.refuse_heartbeats = True
        a = self.worker(proxy.base, "lost-a", "--concurrency", "1", "--batch-size", "1",
                        "--lease-ms", str(lease_ms), "--wait-ms", "200", "--slow-rate", "1",
                        "--slow-ms", "60000")
        claimed = wait_for("the claim", lambda: proxy.count("POST /v1/claims") and s.counts()["leased"] == 1, 30)
        claimed_at = time.monotonic()
        assert claimed
        proxy.refuse_claims = True  # so that the other worker, not this one, takes it over
        lost = wait_for("the lost lease in the log",
                        lambda: next((t for t, line in a.lines if "lease lost" in line), None), 10, 0.01)
        fired_after = lost - claimed_at
        log(f"  signal fired {fired_after * 1000:.0f} ms after the claim was seen (lease {lease_ms} ms)")
        assert fired_after <= (lease_ms + lease_ms / 3) / 1000, fired_after
        # Another worker takes it over once the lease has ended, and settles it.
        b = self.worker(s.base, "lost-b", "--concurrency", "1", "--batch-size", "1",
                        "--lease-ms", "5000", "--wait-ms", "200", "--latency-ms", "1",
                        "--exit-when-idle", "3")
        finish([b], 30)
        a.signal(signal.SIGTERM)
        [summary_a] = finish([a], 30)
        assert summary_a["lost"] == 1 and summary_a["accepted"] == 0, summary_a
        assert proxy.outcome_bodies_naming(receipt_id) == 0, "an outcome was sent for a lost lease"
        proxy.close()
        s.check_settled_once([receipt_id])

    def sigterm_reports_running_and_releases_the_rest(self, s: Server) -> None:
        """4. SIGTERM with 8 jobs running and 8 claimed but not started: the running
        ones are reported, the rest released (pending, no attempt used), exit 0."""
        ids = s.enqueue(16, "term")
        w = self.worker(s.base, "term", "--concurrency", "8", "--batch-size", "16",
                        "--lease-ms", "30000", "--wait-ms", "200", "--slow-rate", "1", "--slow-ms", "1500")
        wait_for("16 leases", lambda: s.counts()["leased"] == 16, 30)
        time.sleep(0.3)
        sent = time.monotonic()
        w.signal(signal.SIGTERM)
        [summary] = finish([w], 20)
        took = time.monotonic() - sent
        counts = s.counts()
        log(f"  exit 0 {took:.2f} s after SIGTERM: {summary}; {counts}")
        assert summary["accepted"] == 8 and summary["released"] == 8, summary
        assert counts["settled"] == 8 and counts["pending"] == 8 and counts["leased"] == 0, counts
        released = [r for r in ids if s.receipt(r)["state"] == "pending"]
        assert len(released) == 8
        for receipt_id in released:
            view = s.receipt(receipt_id)
            assert view["attempts"] == 0 and view["history"][-1]["outcome"] == "released", view

    def sigkill_mid_batch_comes_back_once(self, s: Server) -> None:
        """5. SIGKILL of a worker mid-batch: its receipts come back after the lease
        and are settled once by another worker."""
        lease_ms = 2000
        ids = s.enqueue(40, "kill")
        a = self.worker(s.base, "kill-a", "--concurrency", "8", "--batch-size", "16",
                        "--lease-ms", str(lease_ms), "--wait-ms", "200", "--latency-ms", "400")
        wait_for("some settled and some leased",
                 lambda: (c := s.counts())["settled"] >= 1 and c["leased"] >= 1, 30, 0.01)
        a.kill()
        killed_with = s.counts()
        b = self.worker(s.base, "kill-b", "--concurrency", "8", "--lease-ms", str(lease_ms),
                        "--wait-ms", "500", "--latency-ms", "5", "--exit-when-idle", "10")
        [summary] = finish([b], 60)
        log(f"  killed holding {killed_with['leased']} leases ({killed_with}); the other worker: {summary}")
        s.check_settled_once(ids)

    def workers_ride_out_a_backend_outage(self, s: Server) -> None:
        """6. SQLite: the server restarted under running workers. PostgreSQL: the
        server's database connections terminated. Workers recover by themselves;
        nothing lost, nothing settled twice."""
        ids = s.enqueue(1500, "outage")
        workers = [
            self.worker(s.base, f"outage-{i}", "--concurrency", "8", "--batch-size", "8",
                        "--lease-ms", "4000", "--wait-ms", "300", "--latency-ms", "5")
            for i in range(3)
        ]
        wait_for("progress", lambda: s.counts()["settled"] >= 200, 60, 0.02)
        for _ in range(2):
            if self.backend == "sqlite":
                s.kill()
                time.sleep(1.0)
                s.start()
                what = "server restarted"
            else:
                n = s.db.terminate_backends()
                what = f"{n} PostgreSQL connections terminated"
            # /v1/status may answer 503 (Retry-After) while the server
            # reconnects, as the failover scenario allows.
            settled_then = wait_for("the counts", s.counts_or_none, 60)["settled"]
            log(f"  {what} at {settled_then} settled")

            def progressed() -> bool:
                counts = s.counts_or_none()
                return counts is not None and counts["settled"] > settled_then + 100

            wait_for("progress after the outage", progressed, 60, 0.05)
        wait_for("every receipt settled", lambda: s.counts()["settled"] == len(ids), 120, 0.1)
        for w in workers:
            w.signal(signal.SIGTERM)
        summaries = finish(workers, 30)
        log(f"  recovered: {[ (s['accepted'], s['lost'], s['errors']) for s in summaries]}")
        s.check_settled_once(ids)

    def workers_ride_out_a_failover(self, s: Server) -> None:
        """6b. PostgreSQL with standbys (tests/ha/cluster.sh: Patroni, synchronous replication):
        a planned switchover, then the primary's postmaster killed, under running workers. The
        server is given every node (the Python run) or HAProxy (the TypeScript run) and follows
        the new primary by itself; workers recover by themselves; nothing lost, nothing settled
        twice."""
        workers = [
            self.worker(s.base, f"failover-{i}", "--concurrency", "8", "--batch-size", "8",
                        "--lease-ms", "4000", "--wait-ms", "300", "--latency-ms", "40")
            for i in range(3)
        ]
        ids: list[str] = []
        for fault in ["switchover", "kill-primary"]:
            # Work for the workers to be in the middle of when the primary goes.
            ids += s.enqueue(1500, f"failover-{fault}")
            wait_for("workers busy", lambda: s.counts()["leased"] >= 8, 60, 0.02)
            settled_then = s.counts()["settled"]
            started = time.monotonic()
            moved = cluster(fault)
            log(f"  {fault} ({moved}) at {settled_then} settled, {time.monotonic() - started:.1f} s")
            promoted = time.monotonic()

            def progressed() -> bool:
                counts = s.counts_or_none()
                return counts is not None and counts["settled"] > settled_then + 100

            wait_for(f"progress after the {fault}", progressed, 60, 0.05)
            log(f"  100 more settled {time.monotonic() - promoted:.1f} s after {fault} returned")
            cluster("wait-healthy", "90")
        database = s.info()["database"]
        # Behind HAProxy the host never changes: each promotion shows as a new timeline.
        assert database["failovers"] >= 2 and database["writable"], database
        wait_for("every receipt settled", lambda: s.counts()["settled"] == len(ids), 180, 0.1)
        for w in workers:
            w.signal(signal.SIGTERM)
        summaries = finish(workers, 30)
        log(f"  recovered: {[(x['accepted'], x['lost'], x['errors']) for x in summaries]}; {database}")
        s.check_settled_once(ids)

    def refused_configuration_stops_the_worker(self, s: Server) -> None:
        """7. A bad token, a refused parameter: the worker stops with an error naming it, exit != 0."""
        s.enqueue(3, "refused")
        bad = self.worker(s.base, "badtoken", "--wait-ms", "100", token="not-a-valid-token-0123456789")
        status = bad.wait(30)
        assert status != 0, f"a bad token exits non-zero; log:\n{bad.log()}"
        assert "401 unauthorized" in bad.log(), bad.log()
        lease = self.worker(s.base, "badlease", "--lease-ms", "0", "--wait-ms", "100")
        status = lease.wait(30)
        assert status != 0 and "lease_duration" in lease.log(), lease.log()
        batch = self.worker(s.base, "badbatch", "--batch-size", "5000", "--wait-ms", "100")
        status = batch.wait(30)
        assert status != 0 and "claim_batch" in batch.log(), batch.log()
        assert s.counts()["pending"] == 3
        log("  bad token, lease_ms 0 and a batch of 5000: each stopped naming its code")


ALL = [
    "many_workers_settle_every_receipt_once",
    "slow_handlers_heartbeat_in_one_request",
    "a_lost_lease_fires_the_signal_and_sends_nothing",
    "sigterm_reports_running_and_releases_the_rest",
    "sigkill_mid_batch_comes_back_once",
    "workers_ride_out_a_backend_outage",
    "workers_ride_out_a_failover",
    "refused_configuration_stops_the_worker",
]

# Scenarios on the HA cluster (PostgreSQL only, with SETTLED_TEST_HA_URL).
ON_HA_CLUSTER = {"workers_ride_out_a_failover"}


def cluster(*args: str) -> str:
    """Run tests/ha/cluster.sh (a fault, or a wait); its one-line answer."""
    out = subprocess.run(
        ["bash", str(ROOT / "tests/ha/cluster.sh"), *args], capture_output=True, text=True,
        timeout=180,
    )
    assert out.returncode == 0, f"cluster.sh {' '.join(args)}: {out.stderr[-2000:]}"
    return out.stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lang", choices=["python", "node", "java"], required=True)
    p.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    p.add_argument("--only", action="append")
    args = p.parse_args()
    failed = []
    with tempfile.TemporaryDirectory(prefix="settled-sdk-") as tmp:
        scenarios = Scenarios(args.lang, args.backend, Path(tmp))
        for name in args.only or ALL:
            log(f"{args.lang} on {args.backend}: {name}")
            ha = name in ON_HA_CLUSTER
            if ha and (args.backend != "postgres" or not os.environ.get("SETTLED_TEST_HA_URL")):
                log("  SKIPPED: needs --backend postgres and SETTLED_TEST_HA_URL (tests/ha/cluster.sh up)")
                continue
            server = scenarios.server(
                name.split("_")[0] + str(ALL.index(name)),
                ha=("haproxy" if args.lang == "node" else "hosts") if ha else None,
            )
            started = time.monotonic()
            try:
                getattr(scenarios, name)(server)
                log(f"  ok ({time.monotonic() - started:.1f} s)")
            except AssertionError as e:
                log(f"  FAILED: {e}")
                log("  the server's last log lines:\n" + "\n".join(server.recent))
                failed.append(name)
            finally:
                for w in scenarios.started:
                    w.kill()
                scenarios.started.clear()
                server.stop()
                server.db.drop()
                if ha and args.lang == "node":
                    cluster("haproxy-down")
    if failed:
        log(f"failed: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
