"""The Python SDK never strands a receipt and never dies on a fault (run by tests/sdk/driver.rs;
by hand, from the repository's root:

    SETTLED_BIN=target/debug/settled clients/python/.venv/bin/python tests/sdk/robustness.py [--only NAME]

It tests the SDK of this tree (clients/python/src), against the real server (SQLite, a server
of its own per check) and, for answers a server does not give, a fake one or a proxy in
between. Each check prints what it showed; the script exits 1 naming the checks that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "clients/python/src"
sys.path.insert(0, str(SRC))  # the SDK as it is in this tree, not as last installed
sys.path.insert(1, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from scenarios import FINALIZED, OPERATOR_TOKEN, WORKER_TOKEN, Database, Server, log  # noqa: E402

import settled  # noqa: E402

assert Path(settled.__file__).resolve().is_relative_to(SRC), settled.__file__

#: Every check's stop must end within this (the workers' shutdown_timeout).
SHUTDOWN = 3.0
#: A retry policy that dead-letters at the third failure, quickly.
FAST_POLICY = ["--max-retries", "2", "--initial-backoff-ms", "20", "--backoff-cap-ms", "100"]


# ---------------------------------------------------------------------------
# The real server, a fake one, a proxy


class RealServer(Server):
    """The scenarios' server (SQLite, tokens), with flags of our own (a retry policy)."""

    def __init__(self, tmp: Path, name: str, *flags: str):
        self.flags = list(flags)
        super().__init__(Database("sqlite", tmp, name), tmp)

    def start(self) -> None:
        # Server.start runs $SETTLED_BIN with its own flags: a script adds ours.
        real = os.environ["SETTLED_BIN"]
        wrapper = self.tmp / f"settled-{os.getpid()}-{id(self)}"
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} "$@" {shlex.join(self.flags)}\n')
        wrapper.chmod(0o755)
        os.environ["SETTLED_BIN"] = str(wrapper)
        try:
            super().start()
        finally:
            os.environ["SETTLED_BIN"] = real


Reply = tuple[int, str, bytes]
#: A reply sent in two halves, with a call in between (the second half waits for it to return).
Split = tuple[int, str, bytes, Callable[[], None]]
PROBLEM = "application/problem+json"


def problem(status: int, code: str, problem_class: str) -> Reply:
    body = {"type": "about:blank", "title": code, "status": status, "detail": f"{code} from the fake server",
            "code": code, "class": problem_class}
    return status, PROBLEM, json.dumps(body).encode()


HTML = (200, "text/html", b"<html><body><h1>502 Bad Gateway</h1>nginx</body></html>")


class Fake:
    """An HTTP server in a thread: `answer(method, path, body)` gives each reply, or None to
    forward the request to `upstream`; `cut` (a reply) is sent with its body cut short.
    Requests are counted by `METHOD /path`."""

    def __init__(self, answer: Callable[[str, str, bytes], Reply | Split | None], upstream: str | None = None):
        self.answer, self.upstream = answer, upstream
        self.requests: Counter[str] = Counter()
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_one(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                with fake.lock:
                    fake.requests[f"{self.command} {path}"] += 1
                reply = fake.answer(self.command, path, body)
                if reply is None:
                    reply = fake.forward(self.command, self.path, body, dict(self.headers))
                    if reply is None:
                        self.close_connection = True
                        return
                status, content_type, content = reply[:3]
                between = reply[3] if len(reply) == 4 else None
                declared = len(content)
                if content_type == "cut":  # a body cut short: more announced than sent
                    content_type, declared = "application/json", len(content) + 100
                    self.close_connection = True
                try:
                    self.send_response(status)
                    self.send_header("content-type", content_type)
                    self.send_header("content-length", str(declared))
                    self.end_headers()
                    if between is not None:
                        half = len(content) // 2
                        self.wfile.write(content[:half])
                        self.wfile.flush()
                        between()
                        content = content[half:]
                    self.wfile.write(content)
                except (BrokenPipeError, ConnectionResetError):  # the client went away
                    self.close_connection = True

            do_GET = do_POST = do_DELETE = do_PUT = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def forward(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Reply | None:
        assert self.upstream is not None, f"nothing to forward {method} {path} to"
        headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        try:
            with httpx.Client(timeout=60) as client:
                answer = client.request(method, self.upstream + path, content=body, headers=headers)
        except httpx.TransportError:
            return None
        return answer.status_code, answer.headers.get("content-type", "application/json"), answer.content

    def count(self, key: str) -> int:
        with self.lock:
            return self.requests[key]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------
# Helpers


class Logs(logging.Handler):
    """The SDK's log records, to check what it said."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def matching(self, pattern: str, level: int = logging.WARNING) -> list[str]:
        lines = [r.getMessage() for r in self.records if r.levelno >= level]
        return [line for line in lines if re.search(pattern, line)]


class Run:
    """One in-process worker: its events, its logs, its task, and a timed stop."""

    #: Every worker started, so that a failed check stops the ones it left running.
    started: list[Run] = []

    def __init__(self, base: str, name: str, handler: settled.Handler, **options: Any):
        Run.started.append(self)
        self.events: list[tuple[float, str, str | None, dict[str, Any]]] = []
        self.logs = Logs()
        logger = logging.getLogger(f"settled.test.{name}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(self.logs)
        self.client = settled.AsyncClient(base, token=WORKER_TOKEN)
        options.setdefault("shutdown_timeout", SHUTDOWN)
        options.setdefault("wait_ms", 500)
        self.worker = settled.Worker(self.client, worker_id=name, handler=handler, logger=logger,
                                     on_event=self.on_event, **options)
        self.task = asyncio.ensure_future(self.worker.run_async())

    def on_event(self, name: str, job: settled.Job | None, info: dict[str, Any]) -> None:
        self.events.append((time.monotonic(), name, job.receipt_id if job else None, info))

    def named(self, name: str) -> list[tuple[float, str, str | None, dict[str, Any]]]:
        return [e for e in self.events if e[1] == name]

    def alive(self) -> None:
        if self.task.done():
            error = self.task.exception() if not self.task.cancelled() else None
            raise AssertionError(f"the worker stopped by itself: {error!r}")

    async def stop(self, within: float = SHUTDOWN) -> float:
        """Stop the worker; how long run_async took to return (at most `within`)."""
        self.alive()
        started = time.monotonic()
        self.worker.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=within + 2)
        except asyncio.TimeoutError:
            raise AssertionError(f"run_async did not return within {within + 2} s of stop()") from None
        took = time.monotonic() - started
        assert took <= within + 0.25, f"stop() took {took:.2f} s, more than shutdown_timeout ({within} s)"
        await self.client.aclose()
        return took

    @classmethod
    async def stop_all(cls) -> None:
        for run in cls.started:
            if not run.task.done():
                run.worker.stop()
                run.worker.stop()
                await asyncio.wait([run.task], timeout=SHUTDOWN + 2)
            await run.client.aclose()
        cls.started.clear()


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)


class Api:
    """The server as an operator sees it, without blocking the worker's event loop."""

    def __init__(self, base: str):
        self.client = settled.AsyncClient(base, token=OPERATOR_TOKEN)

    async def enqueue(self, receipt_id: str, group: str | None = None) -> None:
        await self.client.enqueue(receipt_id, FINALIZED, {"amount_cents": 100}, group=group)

    async def receipt(self, receipt_id: str) -> dict[str, Any]:
        return dict(await self.client.get(receipt_id))

    async def state(self, receipt_id: str) -> str:
        return str((await self.receipt(receipt_id))["state"])

    async def leased(self) -> list[str]:
        found = await self.client.search(state="leased")
        return [r["receipt_id"] for r in found["receipts"]]

    async def no_lease_left(self) -> None:
        leased = await self.leased()
        assert not leased, f"receipts left leased: {leased}"

    async def close(self) -> None:
        await self.client.aclose()


def failure_code(view: dict[str, Any]) -> str | None:
    failure = view.get("last_failure") or view.get("dead_letter") or {}
    return cast("str | None", failure.get("code"))


# ---------------------------------------------------------------------------
# The checks


class Checks:
    def __init__(self, tmp: Path):
        self.tmp = tmp

    def server(self, name: str, *flags: str) -> RealServer:
        return RealServer(self.tmp, name, *flags)

    # 1. Failure codes and skip reasons are the spec's closed sets.

    async def unknown_code_is_a_type_error(self) -> None:
        """`Permanent("card_declined")` is an error under mypy --strict, and a ValueError naming
        the codes when it is made; so are an unknown skip reason and a malformed rail_code."""
        snippet = self.tmp / "unknown_code.py"
        lines = [
            "import settled",
            "",
            "async def handler(job: settled.Job) -> str:",
            "    if job.attempt == 1:",
            '        raise settled.Permanent("verification", rail_code="card_declined")',
            "    if job.attempt == 2:",
            '        raise settled.Retryable("rpc", "timeout", 1000, rail_code="rail.timeout")',
            "    if job.attempt == 3:",
            '        raise settled.Skip("zero_charge")',
            "    if job.attempt == 4:",
            '        raise settled.Skip("no_money")',
            '    raise settled.Permanent("card_declined")',
        ]
        snippet.write_text("\n".join(lines) + "\n")
        env = {**os.environ, "MYPYPATH": str(SRC)}
        out = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(self.tmp / "mypy"),
             str(snippet)],
            capture_output=True, text=True, env=env, timeout=300,
        )
        errors = {int(m.group(1)): line for line in out.stdout.splitlines()
                  if (m := re.match(r".*unknown_code\.py:(\d+): error", line))}
        assert out.returncode == 1, f"mypy --strict passed a snippet with unknown codes:\n{out.stdout}{out.stderr}"
        assert set(errors) == {11, 12}, f"mypy should flag lines 11 and 12 only:\n{out.stdout}"
        assert "card_declined" in errors[12] and "Permanent" in errors[12], errors[12]
        log(f"  mypy --strict: {errors[12].split(': error: ', 1)[1][:100]}...")

        made: list[str] = []
        for make in (
            lambda: settled.Permanent(cast(Any, "card_declined")),
            lambda: settled.Retryable(cast(Any, "timeout")),
            lambda: settled.Skip(cast(Any, "no_money")),
            lambda: settled.Retryable("rpc", rail_code="card declined"),
            lambda: settled.Permanent("verification", rail_code="x" * 65),
        ):
            try:
                make()
            except ValueError as e:
                made.append(str(e))
            else:
                raise AssertionError("an outcome outside the spec was made without an error")
        assert "verification" in made[0] and "rpc" in made[0], f"the error names the codes: {made[0]}"
        assert "zero_charge" in made[2], made[2]
        log(f"  at run time: ValueError({made[0][:90]!r}...)")

    async def an_unknown_code_forced_through_is_counted(self) -> None:
        """A handler raising an unknown code anyway (through cast, or by changing `code` after
        the constructor's check): each run is an attempt (retryable `backend`), the receipt ends
        dead-lettered with that code, no lease outlives its run, and the worker keeps going."""
        server = self.server("forced", *FAST_POLICY)
        api = Api(server.base)
        runs: Counter[str] = Counter()

        async def handler(job: settled.Job) -> str:
            runs[job.receipt_id] += 1
            if job.receipt_id == "cast":
                raise settled.Permanent(cast(Any, "card_declined"))  # raises ValueError here
            if job.receipt_id == "changed":
                e = settled.Permanent("verification")
                e.code = cast(Any, "card_declined")  # past the constructor's check
                raise e
            return "tx-" + job.receipt_id

        try:
            for r in ("cast", "changed"):
                await api.enqueue(r)
            run = Run(server.base, "forced", handler)
            await until("both dead-lettered",
                        lambda: all_states(api, ["cast", "changed"], "dead_lettered"), 30)
            run.alive()
            await api.enqueue("after")
            await until("the next receipt settled", lambda: is_state(api, "after", "settled"), 15)
            for r in ("cast", "changed"):
                view = await api.receipt(r)
                assert view["attempts"] == 3 == runs[r], f"{r}: every run an attempt: runs {runs[r]}, {view}"
                assert failure_code(view) == "backend", view
                assert all(h.get("code") == "backend" for h in view["history"] if h["outcome"] == "retryable"), view
            refused = run.named("outcome_refused")
            assert len(refused) == 6 and {e[3]["code"] for e in refused} == {"invalid_outcome"}, refused
            assert run.worker.stats.outcomes_refused == 6, run.worker.stats
            logged = run.logs.matching(r"outcome for (cast|changed) refused \(invalid_outcome")
            assert len(logged) == 6, run.logs.matching(".")
            took = await run.stop()
            await api.no_lease_left()
            log(f"  runs {dict(runs)}; dead-lettered with code backend after 3 attempts each; "
                f"{run.worker.stats.outcomes_refused} refusals counted and logged once each; stopped in {took:.2f} s")
            log(f"  a log line: {logged[0]}")
        finally:
            await api.close()
            server.stop()

    async def an_over_long_transcript_is_counted(self) -> None:
        """A handler returning a transcript id of 600 bytes, which the server refuses (422
        invalid_transcript_id): reported again as on_error's outcome (retryable `backend`), each
        run an attempt, dead-lettered at the end of the policy; counted, logged, an event."""
        server = self.server("transcript", *FAST_POLICY)
        api = Api(server.base)
        runs: Counter[str] = Counter()

        async def handler(job: settled.Job) -> str:
            runs[job.receipt_id] += 1
            return "t" * 600 if job.receipt_id == "long" else "tx-ok"

        try:
            await api.enqueue("long")
            run = Run(server.base, "transcript", handler, concurrency=2)
            await until("dead-lettered", lambda: is_state(api, "long", "dead_lettered"), 30)
            run.alive()
            await api.enqueue("after")
            await until("the next receipt settled", lambda: is_state(api, "after", "settled"), 15)
            view = await api.receipt("long")
            assert view["attempts"] == 3 == runs["long"], f"every run an attempt: runs {runs['long']}, {view}"
            assert failure_code(view) == "backend", view
            refused = run.named("outcome_refused")
            codes = Counter(e[3]["code"] for e in refused)
            assert codes == {"invalid_transcript_id": 3}, refused
            assert all(e[3]["status"] == 422 and e[3]["kind"] == "accepted" for e in refused), refused
            assert run.worker.stats.outcomes_refused == 3, run.worker.stats
            assert run.worker.stats.errors["invalid_transcript_id"] == 3, run.worker.stats
            assert len(run.logs.matching("422 invalid_transcript_id")) == 3, run.logs.matching(".")
            took = await run.stop()
            await api.no_lease_left()
            log(f"  3 runs, 3 attempts, dead-lettered with code backend; refusals counted: "
                f"{run.worker.stats.outcomes_refused}; stopped in {took:.2f} s")
        finally:
            await api.close()
            server.stop()

    async def a_slow_on_error_after_a_refusal_is_reported(self) -> None:
        """A refused outcome whose on_error takes its time while other jobs finish and claims go
        out: on_error's outcome is what is reported, once; the refused one is not sent again
        meanwhile (sent again, its second refusal released the lease, and on_error's outcome
        was lost)."""
        server = self.server("slowerror", *FAST_POLICY)
        api = Api(server.base)
        runs: Counter[str] = Counter()

        async def handler(job: settled.Job) -> str:
            runs[job.receipt_id] += 1
            if job.receipt_id == "long":
                return "t" * 600
            await asyncio.sleep(0.05)
            return "tx-" + job.receipt_id

        async def on_error(error: BaseException, job: settled.Job) -> settled.OutcomeIn:
            await asyncio.sleep(1.0)
            return {"kind": "permanent", "code": "verification", "detail": "refused by the server"}

        others = [f"o{i:02d}" for i in range(40)]
        try:
            await api.enqueue("long")
            for r in others:
                await api.enqueue(r)
            run = Run(server.base, "slowerror", handler, concurrency=4, on_error=on_error)
            await until("dead-lettered", lambda: is_state(api, "long", "dead_lettered"), 30)
            await until("the others settled", lambda: all_states(api, others, "settled"), 30)
            run.alive()
            view = await api.receipt("long")
            assert runs["long"] == 1 and view["attempts"] == 1, f"one run: {runs['long']}, {view}"
            assert failure_code(view) == "verification", view
            refused = run.named("outcome_refused")
            assert len(refused) == 1, refused
            assert not run.named("lease_lost"), run.named("lease_lost")
            took = await run.stop()
            await api.no_lease_left()
            log(f"  on_error's outcome reported after 1 s, the refused one sent once; "
                f"{len(others)} others settled meanwhile; stopped in {took:.2f} s")
        finally:
            await api.close()
            server.stop()

    # 2. rail_code.

    async def rail_code_is_kept(self) -> None:
        """`Permanent(..., rail_code="card_declined")` and `Retryable(..., rail_code=...)`: the
        rail's code shows in GET /v1/receipts/{id} (history, last failure) and finds the receipt."""
        server = self.server("railcode", *FAST_POLICY)
        api = Api(server.base)

        async def handler(job: settled.Job) -> str:
            if job.receipt_id == "declined":
                raise settled.Permanent("verification", "declined by the issuer", rail_code="card_declined")
            if job.attempt == 1:
                raise settled.Retryable("rpc", "try later", rail_code="insufficient_funds")
            return "tx-" + job.receipt_id

        try:
            for r in ("declined", "later"):
                await api.enqueue(r)
            run = Run(server.base, "railcode", handler)
            await until("both finished", lambda: all_states(api, ["declined"], "dead_lettered"), 15)
            await until("both finished", lambda: all_states(api, ["later"], "settled"), 15)
            refused = [e[3] for e in run.named("outcome_refused")]
            assert not refused, f"the server refused outcomes with a rail_code: {refused[0]['code']}: {refused[0]['detail']}"
            declined = await api.receipt("declined")
            assert declined["history"][-1].get("rail_code") == "card_declined", declined
            assert (declined.get("last_failure") or {}).get("rail_code") == "card_declined", declined
            later = await api.receipt("later")
            retried = [h for h in later["history"] if h["outcome"] == "retryable"]
            assert retried and retried[0].get("rail_code") == "insufficient_funds", later
            found = await api.client.search(rail_code="card_declined")
            assert [r["receipt_id"] for r in found["receipts"]] == ["declined"], found
            await run.stop()
            log("  rail_code card_declined in the history and last_failure, and found by ?rail_code=; "
                "insufficient_funds on the retried one")
        finally:
            await api.close()
            server.stop()

    # 3. Hooks, garbled answers, a stop with a claim in flight.

    async def on_error_that_raises_or_returns_none(self) -> None:
        """on_error raising, and on_error returning None: the default outcome is reported
        (retryable rpc, each run an attempt), it is logged and counted, the worker goes on."""
        server = self.server("onerror", *FAST_POLICY)
        api = Api(server.base)
        runs: Counter[str] = Counter()

        async def handler(job: settled.Job) -> str:
            runs[job.receipt_id] += 1
            raise RuntimeError("the rail's client broke")

        def on_error(error: BaseException, job: settled.Job) -> settled.OutcomeIn:
            if job.receipt_id == "hook-raises":
                raise KeyError("a bug in the hook")
            return cast(settled.OutcomeIn, None)

        try:
            for r in ("hook-raises", "hook-none"):
                await api.enqueue(r)
            run = Run(server.base, "onerror", handler, on_error=on_error)
            await until("both dead-lettered", lambda: all_states(api, ["hook-raises", "hook-none"], "dead_lettered"), 30)
            run.alive()
            for r in ("hook-raises", "hook-none"):
                view = await api.receipt(r)
                assert view["attempts"] == 3 == runs[r], (runs, view)
                assert failure_code(view) == "rpc", view
            assert run.worker.stats.errors["on_error"] == 6, run.worker.stats
            assert len(run.logs.matching("on_error failed", logging.ERROR)) == 6
            took = await run.stop()
            await api.no_lease_left()
            log(f"  default outcome reported for both (3 attempts each, code rpc); on_error failures "
                f"logged and counted: {run.worker.stats.errors['on_error']}; stopped in {took:.2f} s")
        finally:
            await api.close()
            server.stop()

    async def garbled_claim_answers(self) -> None:
        """Claims answered 200 with an HTML page, with truncated JSON, and with a body cut short
        (a proxy between worker and server): the worker logs each, backs off, goes on, and
        settles everything once the answers are right."""
        server = self.server("garbledclaims")
        api = Api(server.base)
        bad = [HTML, (200, "application/json", b'{"claims": [{"receipt_id": "g-'),
               (200, "cut", b'{"claims": []'), (200, "application/json", b'{"claims": "none"}')]
        lock = threading.Lock()

        def answer(method: str, path: str, body: bytes) -> Reply | None:
            if path == "/v1/claims":
                with lock:
                    if bad:
                        return bad.pop(0)
            return None

        proxy = Fake(answer, server.base)
        try:
            for i in range(3):
                await api.enqueue(f"g-{i}")
            run = Run(proxy.base, "garbledclaims", lambda job: "tx-" + job.receipt_id)
            await until("all settled", lambda: all_states(api, [f"g-{i}" for i in range(3)], "settled"), 30)
            run.alive()
            errors = dict(run.worker.stats.errors)
            assert errors.get("invalid_answer", 0) + errors.get("connection", 0) == 4, errors
            assert len(run.logs.matching("claim failed")) == 4, run.logs.matching(".")
            took = await run.stop()
            await api.no_lease_left()
            log(f"  4 garbled claim answers logged ({errors}); all settled; stopped in {took:.2f} s")
            log(f"  a log line: {run.logs.matching('claim failed')[0][:160]}")
        finally:
            proxy.close()
            await api.close()
            server.stop()

    async def garbled_outcome_answers(self) -> None:
        """Outcome batches answered 200 with an HTML page (once after the server recorded it,
        once without passing it on) and with truncated JSON: each is sent again while its lease
        lasts; every receipt ends settled once, nothing is left leased. The same for a claim
        that carries outcomes (recorded without claiming more, as a lost claim answer)."""
        server = self.server("garbledoutcomes")
        api = Api(server.base)
        plan = ["forward-then-html", "html", "truncated"]
        lock = threading.Lock()
        forwarded: list[int | str] = []

        def answer(method: str, path: str, body: bytes) -> Reply | None:
            if path == "/v1/claims" and json.loads(body).get("outcomes"):
                # The outcomes only: a garbled answer to a claim that leased more would strand it.
                body = json.dumps({"outcomes": json.loads(body)["outcomes"]}).encode()
            elif path != "/v1/outcomes":
                return None
            with lock:
                step = plan.pop(0) if plan else None
            if step == "forward-then-html":
                reply = proxy.forward(method, "/v1/outcomes", body, {"content-type": "application/json",
                                                                     "authorization": f"Bearer {WORKER_TOKEN}"})
                forwarded.append(reply[0] if reply else "none")
                return HTML
            if step == "html":
                return HTML
            if step == "truncated":
                return 200, "application/json", b'{"results": [{"receipt_id": "o-'
            return None

        proxy = Fake(answer, server.base)
        try:
            ids = [f"o-{i}" for i in range(3)]
            for r in ids:
                await api.enqueue(r)
            run = Run(proxy.base, "garbledoutcomes", lambda job: "tx-" + job.receipt_id, concurrency=1,
                      batch_size=1)
            await until("all settled", lambda: all_states(api, ids, "settled"), 30)
            run.alive()
            for r in ids:
                view = await api.receipt(r)
                assert len([h for h in view["history"] if h["outcome"] == "accepted"]) == 1, view
            took = await run.stop()
            await api.no_lease_left()
            stats = run.worker.stats
            assert stats.errors["invalid_answer"] == 3, stats
            # The outcome recorded behind the HTML page: sent again, answered 409 (already finished).
            assert stats.settled + stats.leases_lost == 3 and forwarded == [200], (stats, forwarded)
            log(f"  3 garbled outcome answers logged; settled once each ({stats.settled} acknowledged, "
                f"{stats.leases_lost} found already finished on resending); stopped in {took:.2f} s")
        finally:
            proxy.close()
            await api.close()
            server.stop()

    async def stop_with_a_claim_in_flight(self) -> None:
        """A stop while a long poll waits: run_async returns at once, and the poll ends on the
        server too (a receipt enqueued after the stop stays pending). A stop while a claim's
        answer, with a receipt in it, is on its way: the receipt is released. An abort (second
        stop) during a long poll: the same."""
        server = self.server("inflight")
        api = Api(server.base)
        try:
            # a. An idle long poll (wait_ms 20 s).
            run = Run(server.base, "idle", lambda job: "tx", wait_ms=20_000)
            await asyncio.sleep(1.0)
            took = await run.stop(within=1.0)
            await api.enqueue("after-stop")
            await asyncio.sleep(1.0)
            assert await api.state("after-stop") == "pending", await api.receipt("after-stop")
            log(f"  idle long poll: run_async returned {took:.2f} s after stop(); the poll ended on the server")

            # b. The answer has begun to arrive when the stop comes, and the rest of it comes
            # after the grace: it is read, and its receipt released.
            leased, deliver = threading.Event(), threading.Event()

            def between() -> None:
                leased.set()
                deliver.wait(10)

            def hold(method: str, path: str, body: bytes) -> Reply | Split | None:
                if path != "/v1/claims":
                    return None
                reply = proxy.forward(method, path, body, {"content-type": "application/json",
                                                            "authorization": f"Bearer {WORKER_TOKEN}"})
                if reply is not None and b"after-stop" in reply[2]:
                    return (*reply, between)
                return reply

            proxy = Fake(hold, server.base)
            ran: list[str] = []

            async def handler(job: settled.Job) -> str:
                ran.append(job.receipt_id)
                return "tx"

            run = Run(proxy.base, "inflight", handler, wait_ms=20_000)
            await until("the claim leased", lambda: asyncio.to_thread(leased.wait, 0.05), 20)
            run.worker.stop()
            await asyncio.sleep(0.5)
            deliver.set()
            started = time.monotonic()
            await asyncio.wait_for(asyncio.shield(run.task), SHUTDOWN + 2)
            took = time.monotonic() - started
            await run.client.aclose()
            proxy.close()
            view = await api.receipt("after-stop")
            assert view["state"] == "pending" and view["history"][-1]["outcome"] == "released", view
            assert view["attempts"] == 0 and not ran, (view, ran)
            assert run.worker.stats.released == 1 and run.worker.stats.claimed == 1, run.worker.stats
            await api.no_lease_left()
            log(f"  an answer half arrived at the stop, the rest 0.5 s later: its receipt released (no "
                f"attempt used), run returned {took:.2f} s after the rest")

            # c. An abort (two stops) during a long poll, nothing due.
            await api.client.hold("after-stop")
            run = Run(server.base, "abort", handler, wait_ms=20_000)
            await asyncio.sleep(0.5)
            run.worker.stop()
            took = await run.stop(within=1.0)
            await api.client.unhold("after-stop")
            await asyncio.sleep(0.5)
            await api.no_lease_left()
            assert not ran, ran
            log(f"  an abort during a long poll: returned in {took:.2f} s, nothing leased")
        finally:
            await api.close()
            server.stop()

    async def stop_within_shutdown_timeout(self) -> None:
        """A handler that never ends (async, and a plain one in a thread) and the server gone
        during the stop: run_async still returns within shutdown_timeout."""
        server = self.server("timeout")
        api = Api(server.base)
        proxy_up = threading.Event()
        proxy_up.set()

        def answer(method: str, path: str, body: bytes) -> Reply | None:
            if not proxy_up.is_set():
                return 503, PROBLEM, b"{}"
            return None

        proxy = Fake(answer, server.base)
        try:
            for r in ("async-forever", "thread-forever"):
                await api.enqueue(r)

            async def forever(job: settled.Job) -> str:
                await asyncio.sleep(3600)
                return "never"

            def blocking(job: settled.Job) -> str:
                time.sleep(3600)
                return "never"

            runs = [Run(proxy.base, "async-forever", forever, concurrency=1, batch_size=1),
                    Run(proxy.base, "thread-forever", blocking, concurrency=1, batch_size=1)]
            await until("both leased", lambda: leased_count(api, 2), 15)
            took = [await runs[0].stop()]
            proxy_up.clear()  # the second one stops with the server unreachable
            took.append(await runs[1].stop())
            proxy_up.set()
            log(f"  handlers that never return: stopped in {took[0]:.2f} s (released: "
                f"{runs[0].worker.stats.released}) and, server unreachable, {took[1]:.2f} s "
                f"(shutdown_timeout {SHUTDOWN} s)")
            assert runs[0].worker.stats.released == 1, runs[0].worker.stats
            [(_, _, first, _)] = runs[0].named("claimed")
            view = await api.receipt(cast(str, first))
            assert view["state"] == "pending" and view["attempts"] == 0, view
        finally:
            proxy.close()
            await api.close()
            server.stop()

    # 4. 500 internal_error and 504 time_limit_exceeded: bounded retries.

    async def internal_errors_are_retried_a_bounded_number_of_times(self) -> None:
        """A fake server answering 500 internal_error (and 504 time_limit_exceeded): an enqueue
        is tried retries + 1 times, then raises; claims go on, ever more slowly; an outcome is
        sent again only while its lease lasts."""
        status = {"code": "internal_error"}
        handed_out = threading.Event()

        def answer(method: str, path: str, body: bytes) -> Reply | None:
            if status["code"] == "time_limit_exceeded":
                return problem(504, "time_limit_exceeded", "backend")
            if path == "/v1/claims" and status["code"] == "claims-then-500":
                if json.loads(body).get("outcomes"):
                    # A claim carrying the outcome fails as a whole, as POST /v1/outcomes does.
                    with fake.lock:
                        fake.requests["outcomes in a claim"] += 1
                    return problem(500, "internal_error", "internal")
                if not handed_out.is_set():
                    handed_out.set()
                    claim = {"receipt_id": "fake-1", "finalized_at": FINALIZED, "attempts": 0, "row_version": 1,
                             "lease_owner": "outcomes", "lease_token": "t" * 32, "lease_until_ms": 10**12,
                             "observation": None}
                    return 200, "application/json", json.dumps({"claims": [claim]}).encode()
                return 200, "application/json", b'{"claims": []}'
            return problem(500, "internal_error", "internal")

        fake = Fake(answer)
        try:
            # Enqueue: retries + 1 requests, then the error.
            for code, expected_status in (("internal_error", 500), ("time_limit_exceeded", 504)):
                status["code"] = code
                async with settled.AsyncClient(fake.base, retries=3) as client:
                    before = fake.count("POST /v1/receipts")
                    try:
                        await client.enqueue("r-1", FINALIZED)
                    except settled.ProblemError as e:
                        assert e.code == code and e.status == expected_status, e
                    else:
                        raise AssertionError("an enqueue answered 500 did not raise")
                    sent = fake.count("POST /v1/receipts") - before
                    assert sent == 4, f"{code}: {sent} requests, not retries + 1 = 4"
            log("  enqueue: 4 requests with retries=3, then ProblemError (500 internal_error; 504 the same)")

            # Claims: the loop goes on, never in a tight loop.
            status["code"] = "internal_error"
            run = Run(fake.base, "claims", lambda job: "tx", wait_ms=1000)
            await asyncio.sleep(4.0)
            run.alive()
            claims = fake.count("POST /v1/claims")
            await run.stop()
            assert 2 <= claims <= 10, f"{claims} claims in 4 s"
            assert run.worker.stats.errors["internal_error"] == claims, run.worker.stats
            log(f"  claims: {claims} requests in 4 s, each logged, the worker still running")

            # Outcomes: sent again while the lease lasts (lease_ms 2000), then given up.
            status["code"] = "claims-then-500"
            run = Run(fake.base, "outcomes", lambda job: "tx", lease_ms=2000, wait_ms=0)
            await until("the lease given up", lambda: as_awaitable(run.worker.stats.leases_lost == 1), 10)
            def outcome_sends() -> int:
                return fake.count("POST /v1/outcomes") + fake.count("outcomes in a claim")

            sent = outcome_sends()
            await asyncio.sleep(1.0)
            assert outcome_sends() == sent, "outcomes sent after the lease ended"
            assert 2 <= sent <= 25, f"{sent} outcome requests within a 2 s lease"
            run.alive()
            await run.stop()
            log(f"  outcome: {sent} requests (claims carrying it, POST /v1/outcomes) within its 2 s lease, then the lease given up (counted as lost)")
        finally:
            fake.close()

    # 4b. Outcomes ride along with the next claim.

    async def outcomes_ride_along_with_claims(self) -> None:
        """A busy worker reports what it finished in its next claim (POST /v1/claims with
        `outcomes`), one round trip per claim: nearly every outcome rides in a claim, hardly
        any POST /v1/outcomes; an item the server refuses in a claim's `results` (a 600-byte
        transcript id, 422) goes the refusal's way (on_error's outcome, counted, an event)."""
        server = self.server("ride", *FAST_POLICY)
        api = Api(server.base)
        carried: Counter[str] = Counter()  # outcome items by the path that carried them
        requests: Counter[str] = Counter()
        lock = threading.Lock()
        long_in_claims = [0]

        def answer(method: str, path: str, body: bytes) -> Reply | None:
            if method == "POST" and path in ("/v1/claims", "/v1/outcomes"):
                items = json.loads(body).get("outcomes") or []
                with lock:
                    requests[path] += 1
                    carried[path] += len(items)
                    if path == "/v1/claims" and b"t" * 600 in body:
                        long_in_claims[0] += 1
            return None

        proxy = Fake(answer, server.base)
        try:
            ids = [f"ride-{i:02}" for i in range(30)]
            for r in ids:
                await api.enqueue(r)

            async def handler(job: settled.Job) -> str:
                # One slot: a claim goes out once the job is done, and carries its outcome (an
                # outcome that finds a claim out, a long poll, waits for the next one a short
                # linger at most, then goes in a POST /v1/outcomes).
                await asyncio.sleep(0.02)
                return "t" * 600 if job.receipt_id == "long" else "tx-" + job.receipt_id

            run = Run(proxy.base, "ride", handler, concurrency=1)
            await until("all settled", lambda: all_states(api, ids, "settled"), 30)
            # The last results may still be on their way back.
            await until("all acknowledged", lambda: as_awaitable(run.worker.stats.settled == 30), 5)
            run.alive()
            with lock:
                busy = dict(carried), dict(requests)
            # The last outcome may still be on its way in a claim: counted once it is settled.
            assert busy[0].get("/v1/claims", 0) + busy[0].get("/v1/outcomes", 0) >= 29, busy
            assert busy[0].get("/v1/claims", 0) >= 25, f"outcomes did not ride in claims: {busy}"
            assert busy[1].get("/v1/outcomes", 0) <= 5, f"too many POST /v1/outcomes: {busy}"
            assert run.worker.stats.settled == 30 and run.worker.stats.leases_lost == 0, run.worker.stats

            # A refused item in a claim's results.
            await api.enqueue("long")
            await until("dead-lettered", lambda: is_state(api, "long", "dead_lettered"), 30)
            view = await api.receipt("long")
            assert view["attempts"] == 3 and failure_code(view) == "backend", view
            refused = run.named("outcome_refused")
            assert Counter(e[3]["code"] for e in refused) == {"invalid_transcript_id": 3}, refused
            assert all(e[3]["status"] == 422 for e in refused), refused
            assert run.worker.stats.outcomes_refused == 3, run.worker.stats
            assert long_in_claims[0] >= 1, "the refused outcome never rode in a claim"
            took = await run.stop()
            await api.no_lease_left()
            for r in ids[:5]:
                view = await api.receipt(r)
                assert len([h for h in view["history"] if h["outcome"] == "accepted"]) == 1, view
            log(f"  30 receipts: {busy[0].get('/v1/claims', 0)} outcomes carried by {busy[1].get('/v1/claims', 0)} "
                f"claims, {busy[0].get('/v1/outcomes', 0)} by {busy[1].get('/v1/outcomes', 0)} POST /v1/outcomes; "
                f"a 600-byte transcript refused in a claim's results 3 times ({long_in_claims[0]} of them in claims), "
                f"dead-lettered with code backend; stopped in {took:.2f} s")
        finally:
            proxy.close()
            await api.close()
            server.stop()

    async def a_server_without_outcomes_in_claims(self) -> None:
        """A server older than `outcomes` in claims refuses every claim carrying some (422, an
        unknown field): after two such refusals in a row the worker stops carrying them and
        sends them in POST /v1/outcomes; every receipt settles once, and it says so once."""
        server = self.server("oldserver")
        api = Api(server.base)
        refused = Counter[str]()

        def old(method: str, path: str, body: bytes) -> Reply | None:
            if method == "POST" and path == "/v1/claims" and b'"outcomes"' in body:
                refused["claims"] += 1
                return problem(422, "invalid_body", "validation")
            return None

        proxy = Fake(old, server.base)
        try:
            ids = [f"old-{i:02d}" for i in range(12)]
            for r in ids:
                await api.enqueue(r)
            run = Run(proxy.base, "oldserver", lambda job: "tx-" + job.receipt_id, concurrency=1, batch_size=1)
            await until("all settled", lambda: all_states(api, ids, "settled"), 30)
            run.alive()
            took = await run.stop()
            await api.no_lease_left()
            assert refused["claims"] == 2, refused
            assert run.worker.stats.settled == len(ids), run.worker.stats
            assert not run.named("lease_lost"), run.named("lease_lost")
            assert len(run.logs.matching("refused twice in a row")) == 1, run.logs.matching(".")
            log(f"  {refused['claims']} carrying claims refused, then {proxy.count('POST /v1/outcomes')} "
                f"POST /v1/outcomes; {len(ids)} settled once; stopped in {took:.2f} s")
        finally:
            await api.close()
            proxy.close()
            server.stop()

    async def a_stop_waits_for_a_claim_carrying_outcomes(self) -> None:
        """A stop while a claim carrying outcomes waits for its answer (recorded, the answer
        slow): the answer is read within the shutdown timeout, the outcome counted as settled;
        cut off after the claim grace, its outcome was sent again, refused, and counted as a
        lease lost."""
        server = self.server("carrystop")
        api = Api(server.base)
        recorded = threading.Event()

        def slow(method: str, path: str, body: bytes) -> Reply | None:
            if method != "POST" or path != "/v1/claims" or b'"outcomes"' not in body:
                return None
            reply = proxy.forward(method, path, body, {"content-type": "application/json",
                                                        "authorization": f"Bearer {WORKER_TOKEN}"})
            recorded.set()
            time.sleep(0.6)
            return reply

        proxy = Fake(slow, server.base)
        try:
            await api.enqueue("carried")
            run = Run(proxy.base, "carrystop", lambda job: "tx-" + job.receipt_id, wait_ms=200,
                      concurrency=1, batch_size=1)
            await until("a claim carried the outcome", lambda: asyncio.to_thread(recorded.wait, 0.05), 20)
            took = await run.stop()
            assert await api.state("carried") == "settled", await api.receipt("carried")
            assert run.worker.stats.settled == 1, run.worker.stats
            assert not run.named("lease_lost"), run.named("lease_lost")
            assert proxy.count("POST /v1/outcomes") == 0, proxy.requests
            await api.no_lease_left()
            log(f"  the carrying claim's answer read {took:.2f} s after stop(); settled counted once")
        finally:
            await api.close()
            proxy.close()
            server.stop()

    async def a_failed_claim_resends_its_outcomes(self) -> None:
        """The first claim carrying outcomes fails as a whole (503, nothing recorded), the
        second one's answer is lost after its outcomes were recorded (200 with an HTML page):
        the outcomes of both are sent again; every receipt ends settled once, those already
        recorded refused on resending (409, counted as leases lost), nothing left leased."""
        server = self.server("resend")
        api = Api(server.base)
        lock = threading.Lock()
        plan = ["503", "record-then-html"]
        failed: dict[str, list[str]] = {}
        sent_after: Counter[str] = Counter()

        def named(body: bytes) -> list[str]:
            return [str(item["claim"]["receipt_id"]) for item in json.loads(body).get("outcomes") or []]

        def answer(method: str, path: str, body: bytes) -> Reply | None:
            if method != "POST" or path not in ("/v1/claims", "/v1/outcomes"):
                return None
            ids = named(body)
            with lock:
                for r in ids:
                    sent_after[r] += 1
                step = plan.pop(0) if ids and path == "/v1/claims" and plan else None
                if step is not None:
                    failed[step] = ids
            if step == "503":
                return problem(503, "backend_unavailable", "backend")
            if step == "record-then-html":
                # Recorded as the claim would have recorded them (without leasing more), then
                # the answer is lost.
                outcomes = json.dumps({"outcomes": json.loads(body)["outcomes"]}).encode()
                reply = proxy.forward("POST", "/v1/outcomes", outcomes, {"content-type": "application/json",
                                                                        "authorization": f"Bearer {WORKER_TOKEN}"})
                assert reply is not None and reply[0] == 200, reply
                return HTML
            return None

        proxy = Fake(answer, server.base)
        try:
            ids = [f"resend-{i}" for i in range(6)]
            for r in ids:
                await api.enqueue(r)
            run = Run(proxy.base, "resend", lambda job: "tx-" + job.receipt_id, concurrency=1, batch_size=1)
            await until("all settled", lambda: all_states(api, ids, "settled"), 30)
            await until("nothing held", lambda: as_awaitable(not run.worker._leases), 10)
            run.alive()
            took = await run.stop()
            await api.no_lease_left()
            assert set(failed) == {"503", "record-then-html"}, failed
            for step, names in failed.items():
                assert names, failed
                for r in names:
                    assert sent_after[r] >= 2, f"{r} ({step}) not sent again: {dict(sent_after)}"
            for r in ids:
                view = await api.receipt(r)
                assert len([h for h in view["history"] if h["outcome"] == "accepted"]) == 1, view
            stats = run.worker.stats
            assert stats.errors["backend_unavailable"] == 1 and stats.errors["invalid_answer"] == 1, stats
            recorded_twice = len(failed["record-then-html"])
            assert stats.settled == len(ids) - recorded_twice and stats.leases_lost == recorded_twice, stats
            log(f"  a claim refused with 503 ({failed['503']}) and one answered with HTML after recording "
                f"({failed['record-then-html']}): their outcomes sent again, every receipt settled once "
                f"({stats.settled} acknowledged, {stats.leases_lost} found already finished); stopped in {took:.2f} s")
        finally:
            proxy.close()
            await api.close()
            server.stop()

    # 5. Ctrl-C on an idle worker.

    async def ctrl_c_on_an_idle_worker(self) -> None:
        """examples/python/worker.py waiting in a long poll (wait_ms 20 s) gets SIGINT: it exits 0
        within 1 s, says it is stopping, and holds no lease; its long poll ended on the server."""
        server = self.server("ctrlc")
        api = Api(server.base)
        try:
            await api.enqueue("first")
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SETTLED_", "RAIL_"))}
            env.update({"SETTLED_URL": server.base, "SETTLED_TOKEN": WORKER_TOKEN, "PYTHONPATH": str(SRC)})
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "examples/python/worker.py"), "--worker-id", "ctrl-c",
                 "--wait-ms", "20000", "--timeout-rate", "0", "--decline-rate", "0"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            try:
                await until("the first receipt settled", lambda: is_state(api, "first", "settled"), 30)
                await asyncio.sleep(1.0)  # now in its next long poll
                assert proc.poll() is None, proc.communicate()
                sent = time.monotonic()
                proc.send_signal(signal.SIGINT)
                status = await asyncio.to_thread(proc.wait, 10)
                took = time.monotonic() - sent
                out, err = proc.communicate()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert status == 0, f"exit {status}:\n{err}"
            assert took <= 1.0, f"exited {took:.2f} s after SIGINT:\n{err}"
            assert "SIGINT received, stopping" in err, err
            await api.no_lease_left()
            await api.enqueue("after")
            await asyncio.sleep(1.0)
            assert await api.state("after") == "pending", "a long poll of the stopped worker claimed it"
            log(f"  exit 0 {took:.2f} s after SIGINT; said: {err.strip().splitlines()[-1][:140]}")
            log(f"  summary: {out.strip()}")
        finally:
            await api.close()
            server.stop()

    # 6. look_again_ms.

    async def a_rate_limited_group_does_not_hold_up_the_others(self) -> None:
        """A worker claiming from every group, one group limited to a claim a minute: after a
        claim answered with look_again_ms (about a minute), a receipt enqueued in another group
        is settled within wait_ms."""
        server = self.server("lookagain")
        api = Api(server.base)
        wait_ms = 2000
        try:
            answer = await api.client.request(
                "PUT", "/v1/groups/slow", {"rate": {"per_second": 1 / 60, "burst": 1}})
            assert answer["rate"]["burst"] == 1, answer
            for r in ("slow-1", "slow-2"):
                await api.enqueue(r, group="slow")
            settled_at: dict[str, float] = {}

            async def handler(job: settled.Job) -> str:
                settled_at[job.receipt_id] = time.monotonic()
                return "tx"

            run = Run(server.base, "lookagain", handler, wait_ms=wait_ms)

            async def held_back() -> bool:
                return any((e[3].get("look_again_ms") or 0) > wait_ms for e in run.named("poll"))

            await until("a poll answered with look_again_ms", held_back, 20)
            look = max(e[3]["look_again_ms"] for e in run.named("poll"))
            await asyncio.sleep(0.3)
            enqueued = time.monotonic()
            await api.enqueue("fast-1", group="fast")
            await until("fast-1 settled", lambda: as_awaitable("fast-1" in settled_at), wait_ms / 1000 + 5)
            took = settled_at["fast-1"] - enqueued
            assert took < wait_ms / 1000, f"fast-1 waited {took:.2f} s (wait_ms {wait_ms})"
            assert "slow-2" not in settled_at
            run.alive()
            await run.stop()
            await api.no_lease_left()
            log(f"  look_again_ms {look} on the slow group; a receipt of another group settled "
                f"{took * 1000:.0f} ms after its enqueue (wait_ms {wait_ms})")
        finally:
            await api.close()
            server.stop()


async def as_awaitable(value: Any) -> Any:
    return value


async def is_state(api: Api, receipt_id: str, state: str) -> bool:
    return await api.state(receipt_id) == state


async def all_states(api: Api, ids: list[str], state: str) -> bool:
    return all([await api.state(r) == state for r in ids])


async def leased_count(api: Api, n: int) -> bool:
    return len(await api.leased()) == n


ALL = [
    "unknown_code_is_a_type_error",
    "an_unknown_code_forced_through_is_counted",
    "an_over_long_transcript_is_counted",
    "a_slow_on_error_after_a_refusal_is_reported",
    "rail_code_is_kept",
    "on_error_that_raises_or_returns_none",
    "garbled_claim_answers",
    "garbled_outcome_answers",
    "stop_with_a_claim_in_flight",
    "stop_within_shutdown_timeout",
    "internal_errors_are_retried_a_bounded_number_of_times",
    "outcomes_ride_along_with_claims",
    "a_failed_claim_resends_its_outcomes",
    "a_stop_waits_for_a_claim_carrying_outcomes",
    "a_server_without_outcomes_in_claims",
    "ctrl_c_on_an_idle_worker",
    "a_rate_limited_group_does_not_hold_up_the_others",
]


async def guarded(check: Callable[[], Awaitable[None]]) -> None:
    try:
        await asyncio.wait_for(check(), timeout=120)
    finally:
        await Run.stop_all()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--only", action="append", choices=ALL)
    args = p.parse_args()
    if not os.environ.get("SETTLED_BIN"):
        print("SETTLED_BIN must name the settled binary (cargo build --bin settled)", file=sys.stderr)
        return 2
    # The servers run in a directory of their own: a relative path would not lead there.
    os.environ["SETTLED_BIN"] = str(Path(os.environ["SETTLED_BIN"]).resolve())
    failed = []
    with tempfile.TemporaryDirectory(prefix="settled-robustness-") as tmp:
        checks = Checks(Path(tmp))
        for name in args.only or ALL:
            check = getattr(checks, name)
            log(f"python SDK: {name}: {check.__doc__.split(chr(10))[0]}")
            started = time.monotonic()
            try:
                asyncio.run(guarded(check))
                log(f"  ok ({time.monotonic() - started:.1f} s)")
            except Exception as e:
                log(f"  FAILED: {type(e).__name__}: {e}")
                traceback.print_exc()
                failed.append(name)
    if failed:
        log(f"python SDK robustness: failed: {failed}")
        return 1
    log(f"python SDK robustness: all {len(args.only or ALL)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
