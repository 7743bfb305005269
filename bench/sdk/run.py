"""SDK workers against settled-bench's own HTTP workers, in the same run.

    target/release/settled-bench and target/release/settled built (cargo build --release),
    bash clients/ci-setup.sh run, then:
    clients/python/.venv/bin/python bench/sdk/run.py [--backend sqlite|postgres]
        [--receipts 50000] [--rounds 3] [--concurrency 8] [--processes 1]
        [--langs python,node,java] [--no-bench] [--replicas 1] [--forward]
    (SETTLED_RELEASE_DIR: where the release binaries are, if not target/release; Java needs
    bash clients/java/build.sh first.)

Each round, in alternating order, on a fresh database each: settled-bench --spawn with its
HTTP workers (8 workers, claim batch 1 and claim batch 8, outcome mix all accepted), and the
SDK workers of each language (no-op handler) at --concurrency and 8 x --concurrency (as many
receipts in flight as the bench's two shapes) on a server started here with the receipts
enqueued first. An SDK run's time is from starting the worker processes to /v1/status
counting every receipt settled (process start-up included). Prints each figure and the
medians, as receipts settled per second. With --replicas N (PostgreSQL) N servers share the one
database: the bench spreads its workers over them (settled-bench --replicas), and worker process
i talks to server i mod N; with --forward each advertises its URL, and the one doing the upkeep
runs every replica's worker writes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
RELEASE = Path(os.environ.get("SETTLED_RELEASE_DIR", ROOT / "target" / "release"))


def bench_http(backend: str, receipts: int, batch: int, pg: str, replicas: int, forward: bool) -> float:
    out = subprocess.run(
        [str(RELEASE / "settled-bench"), "--spawn", backend, "--postgres-url", pg, "--receipts", str(receipts),
         "--workers", "8", "--batch", str(batch), "--mix", "accepted=100", "--no-inprocess", "--json",
         "--replicas", str(replicas)] + (["--forward"] if forward and replicas > 1 else []),
        capture_output=True, text=True, check=True,
    )
    return float(json.loads(out.stdout)["settled_per_sec"])


def database(backend: str, tmp: Path, pg: str) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:{tmp / (uuid.uuid4().hex + '.db')}", None
    name = f"settled_bench_sdk_{uuid.uuid4().hex[:8]}"
    subprocess.run(["psql", pg, "-qc", f"CREATE DATABASE {name}"], check=True)
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(pg)._replace(path="/" + name)), name


def start_server(url: str, forward: bool) -> tuple[subprocess.Popen[str], str]:
    listen, advertise = "127.0.0.1:0", []
    if forward:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            listen = f"127.0.0.1:{s.getsockname()[1]}"
        advertise = ["--advertise-url", f"http://{listen}"]
    server = subprocess.Popen(
        [str(RELEASE / "settled"), "--listen", listen, "--database-url", url, "--log-format", "json"] + advertise,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")},
             "RUST_LOG": "warn,settled::server=info"},
    )
    assert server.stdout is not None
    for line in server.stdout:
        address = json.loads(line).get("fields", {}).get("address")
        if address:
            return server, f"http://{address}"
    raise RuntimeError("settled did not say where it listens")


def sdk(lang: str, backend: str, receipts: int, concurrency: int, processes: int, pg: str,
        replicas: int, forward: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        url, dbname = database(backend, Path(tmp), pg)
        forward = forward and replicas > 1
        servers = [start_server(url, forward) for _ in range(replicas)]
        if forward:
            time.sleep(2)  # each replica looks for the one doing the upkeep once a second
        bases = [base for _, base in servers]
        http = httpx.Client(base_url=bases[0], timeout=60)
        for start in range(0, receipts, 1024):
            body = {"receipts": [{"receipt_id": f"b-{i}", "finalized_at": 1, "observation": {"amount_cents": 1}}
                                 for i in range(start, min(receipts, start + 1024))]}
            assert http.post("/v1/receipts/batch", json=body).status_code == 200
        started = time.monotonic()
        workers = [subprocess.Popen(worker_command(lang, bases[i % replicas], f"{lang}-{i}", concurrency),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for i in range(processes)]
        while http.get("/v1/status").json()["counts"]["settled"] < receipts:
            time.sleep(0.02)
        took = time.monotonic() - started
        for w in workers:
            assert w.wait(60) == 0
        for server, _ in servers:
            server.terminate()
            server.wait()
        http.close()
        if dbname:
            subprocess.run(["psql", pg, "-qc", f"DROP DATABASE {dbname} WITH (FORCE)"], check=True)
        return receipts / took


def worker_command(lang: str, base: str, worker_id: str, concurrency: int) -> list[str]:
    """A no-op worker of `lang`. Java runs its example worker (bash clients/java/build.sh) with a
    rail that never fails or waits: the same SDK loop, claiming for its free slots."""
    if lang == "python":
        return [sys.executable, str(ROOT / "bench/sdk/noop_worker.py"), base, worker_id, str(concurrency), "0"]
    if lang == "node":
        return ["node", str(ROOT / "bench/sdk/noop_worker.mjs"), base, worker_id, str(concurrency), "0"]
    return ["java", "-XX:+UseSerialGC", "-jar", str(ROOT / "examples/java/target/settled-example-worker.jar"),
            "--url", base, "--worker-id", worker_id, "--concurrency", str(concurrency),
            "--batch-size", str(min(concurrency, 1024)), "--wait-ms", "200", "--exit-when-idle", "3",
            "--timeout-rate", "0", "--decline-rate", "0", "--latency-ms", "0"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="sqlite", choices=["sqlite", "postgres"])
    p.add_argument("--receipts", type=int, default=50_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--langs", default="python,node,java", help="SDKs to run, of python, node, java")
    p.add_argument("--no-bench", action="store_true", help="skip settled-bench's own HTTP workers")
    p.add_argument("--replicas", type=int, default=1, help="servers on the one PostgreSQL database")
    p.add_argument("--forward", action="store_true",
                   help="replicas advertise their URLs: the one doing the upkeep runs every worker write")
    p.add_argument("--postgres-url", default=os.environ.get(
        "SETTLED_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    a = p.parse_args()
    if a.replicas > 1 and a.backend != "postgres":
        p.error("--replicas needs --backend postgres")
    runs = {} if a.no_bench else {
        "settled-bench 8 workers x batch 1": lambda: bench_http(a.backend, a.receipts, 1, a.postgres_url, a.replicas, a.forward),
        "settled-bench 8 workers x batch 8": lambda: bench_http(a.backend, a.receipts, 8, a.postgres_url, a.replicas, a.forward),
    }
    labels = {"python": "python", "node": "typescript", "java": "java"}
    # The SDK at the bench's two shapes: as many receipts in flight as 8 x 1, and as 8 x 8.
    for concurrency in (a.concurrency, 8 * a.concurrency):
        for lang in a.langs.split(","):
            label = labels[lang]
            runs[f"{label} SDK {a.processes} x concurrency {concurrency}"] = (
                lambda lang=lang, c=concurrency: sdk(lang, a.backend, a.receipts, c, a.processes, a.postgres_url, a.replicas, a.forward)
            )
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(a.rounds):
        order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
        for name in order:
            figures[name].append(runs[name]())
            print(f"round {round_ + 1}: {name}: {figures[name][-1]:.0f} receipts/s", flush=True)
    print(f"\n{a.backend} ({a.replicas} replicas), {a.receipts} receipts, medians of {a.rounds}:")
    for name, values in figures.items():
        print(f"  {name}: {statistics.median(values):.0f} receipts/s  ({', '.join(f'{v:.0f}' for v in values)})")


if __name__ == "__main__":
    main()
