"""The worker runtime: claims, runs a handler per receipt, heartbeats, reports.

It keeps the rules of the server's worker guide (docs/worker-loop.md) so that a
handler only settles one receipt:

- every claim is sent back exactly, and after a heartbeat the new claim is sent;
- nothing is committed after the local deadline (the time the claim or the
  heartbeat was *sent*, plus the lease, minus a margin, on a monotonic clock);
- every held lease is extended once a third of it has passed, all of them in
  one `POST /v1/leases/extend`;
- requests that carry claims are sent by one task, one after the other, so a
  heartbeat and an outcome for the same claim never race;
- a 409 (or the local deadline) means the lease is lost: the handler's task is
  cancelled, `job.lost` is set, and no outcome is sent for it;
- 503 and lost connections back off with full jitter; 401, 403 and 422 stop
  the worker with `WorkerStopped`;
- on stop: no more claims, running jobs get `shutdown_timeout` to finish and
  are reported, claims not started are released;
- outcomes of jobs that finish together go in one `POST /v1/outcomes`.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Union, cast

from . import _schema as s
from ._tracing import ended, handler_span
from .client import AsyncClient, Backoff
from .errors import ConnectionFailed, Permanent, ProblemError, Retryable, Skip, WorkerStopped

__all__ = ["Job", "Worker", "WorkerStats", "Handler"]

log = logging.getLogger("settled.worker")

Handler = Callable[["Job"], Union[Awaitable[Any], Any]]
ErrorPolicy = Callable[[BaseException, "Job"], s.OutcomeIn]

MAX_ITEMS = 1024
#: How long a claim waits, once a slot is free, for more slots to free up (0: only
#: for the jobs already done, which a turn of the event loop reports).
GATHER_SLOTS = 0.0


class Job:
    """One claimed receipt, as a handler sees it."""

    def __init__(self, claim: s.Claim):
        self._claim = claim
        self.receipt_id: str = claim["receipt_id"]
        self.observation: dict[str, Any] | None = claim.get("observation")
        self.attempts: int = claim["attempts"]
        #: This settlement attempt, counting from 1.
        self.attempt: int = claim["attempts"] + 1
        self.group: str = claim.get("group", "default")
        #: The producer's `finalized_at` (Unix seconds).
        self.finalized_at: int = claim["finalized_at"]
        #: Set when the lease was lost (409, or its local deadline passed): stop work, nothing is reported.
        self.lost: bool = False
        self.lost_reason: str | None = None

    @property
    def claim(self) -> s.Claim:
        """The current claim (after heartbeats, the one the last extension answered)."""
        return self._claim

    def __repr__(self) -> str:
        return f"Job({self.receipt_id!r}, attempt={self.attempt})"


@dataclass
class WorkerStats:
    """What the worker did since it started."""

    claimed: int = 0
    settled: int = 0
    retried: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    released: int = 0
    leases_lost: int = 0
    heartbeats: int = 0
    leases_extended: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "errors"}
        out["errors"] = dict(self.errors)
        return out


def _without_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def default_error_outcome(error: BaseException, job: Job) -> s.OutcomeIn:
    """An unexpected exception is a retryable `rpc` failure; its type and message
    go into `detail`, of which the server stores only the SHA-256."""
    return {"kind": "retryable", "code": "rpc", "detail": f"{type(error).__qualname__}: {error}"}


class _Lease:
    __slots__ = ("job", "deadline", "extend_at", "state", "task", "outcome", "retry_at")

    def __init__(self, job: Job, deadline: float, extend_at: float):
        self.job = job
        self.deadline = deadline
        self.extend_at = extend_at
        # queued -> running -> reporting -> (gone); or releasing -> (gone)
        self.state = "queued"
        self.task: asyncio.Task[None] | None = None
        self.outcome: s.OutcomeIn | None = None
        self.retry_at = 0.0


class Worker:
    """Claims receipts and runs `handler` on each, `concurrency` at a time.

    The handler is `async def handler(job)` (or a plain function, run in a
    thread). Returning settles the receipt as `accepted` with the returned
    string as `transcript_id` (the receipt id when it returns None); raising
    `Retryable`, `Permanent` or `Skip` reports that kind; any other exception
    is reported through `on_error` (by default a retryable `rpc` failure).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        worker_id: str,
        handler: Handler,
        concurrency: int = 8,
        lease_ms: int = 30_000,
        groups: Sequence[str] | None = None,
        batch_size: int | None = None,
        wait_ms: int = 5_000,
        shutdown_timeout: float = 30.0,
        margin_ms: int | None = None,
        on_error: ErrorPolicy = default_error_outcome,
        on_event: Callable[[str, Job | None, dict[str, Any]], None] | None = None,
        logger: logging.Logger | None = None,
    ):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.worker_id = worker_id
        self.handler = handler
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.groups = list(groups) if groups else None
        self.batch_size = batch_size
        self.wait_ms = wait_ms
        self.shutdown_timeout = shutdown_timeout
        self.margin = (margin_ms if margin_ms is not None else min(1_000, lease_ms // 10)) / 1000
        self.on_error = on_error
        self.on_event = on_event
        self.log = logger or log
        self.stats = WorkerStats()
        self._leases: dict[str, _Lease] = {}
        self._running = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._aborting: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._slots: asyncio.Event | None = None
        self._fatal: WorkerStopped | None = None
        self._claiming_done = False
        self._stop_requests = 0

    # Control.

    def stop(self) -> None:
        """Stop claiming, let running jobs finish (within `shutdown_timeout`),
        report them and release the rest. A second call stops at once.
        Safe to call from any thread and from a signal handler."""
        loop = self._loop
        if loop is None:
            self._stop_requests += 1
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._request_stop()
        else:
            loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        assert self._stopping is not None and self._aborting is not None
        if self._stopping.is_set():
            self.log.warning("settled worker %s: second stop, stopping at once", self.worker_id)
            self._aborting.set()
        self._stopping.set()
        if self._slots is not None:
            self._slots.set()  # a claim loop waiting for a free slot sees the stop
        self._poke()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Run until stopped (SIGTERM / SIGINT when `install_signal_handlers`):
        the blocking entry point. Raises `WorkerStopped` on a fatal error."""
        asyncio.run(self._run_then_close(install_signal_handlers))

    async def _run_then_close(self, install_signal_handlers: bool) -> None:
        try:
            await self.run_async(install_signal_handlers=install_signal_handlers)
        finally:
            # The client's connections belong to this event loop, which ends here.
            await self.client.aclose()

    async def run_async(self, *, install_signal_handlers: bool = False) -> None:
        """Run until `stop()` (or a signal, when installed). Raises
        `WorkerStopped` when the server refuses the worker's token or parameters."""
        self._loop = asyncio.get_running_loop()
        self._stopping, self._aborting = asyncio.Event(), asyncio.Event()
        self._wake, self._slots = asyncio.Event(), asyncio.Event()
        pending_stops, self._stop_requests = self._stop_requests, 0
        for _ in range(pending_stops):
            self._request_stop()
        installed: list[signal.Signals] = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    self._loop.add_signal_handler(sig, self._request_stop)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass
        claimer = asyncio.create_task(self._claim_loop(), name="settled-claims")
        committer = asyncio.create_task(self._commit_loop(), name="settled-commits")
        try:
            await self._until_done(claimer, committer)
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            for task in (claimer, committer, *self._tasks()):
                task.cancel()
            await asyncio.gather(claimer, committer, *self._tasks(), return_exceptions=True)
        if self._fatal is not None:
            raise self._fatal

    async def _until_done(self, claimer: asyncio.Task[None], committer: asyncio.Task[None]) -> None:
        assert self._stopping is not None and self._aborting is not None
        aborting = asyncio.create_task(self._aborting.wait())
        try:
            await asyncio.wait([aborting, committer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborting.cancel()
        if committer.done() and not committer.cancelled() and committer.exception() is not None:
            raise cast(BaseException, committer.exception())

    def _tasks(self) -> list[asyncio.Task[None]]:
        return [lease.task for lease in self._leases.values() if lease.task is not None]

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _emit(self, event: str, job: Job | None = None, **info: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event, job, info)
            except Exception:  # a user's hook must not break the worker
                self.log.exception("settled worker: on_event hook raised")

    def _fail(self, what: str, error: ProblemError) -> None:
        """401 / 403 / 422: retrying cannot fix it."""
        assert self._aborting is not None and self._stopping is not None
        self.stats.errors[error.code] += 1
        message = f"settled worker {self.worker_id}: {what} refused with {error.status} {error.code}: {error.detail}"
        self.log.error(message)
        self._fatal = WorkerStopped(message, error)
        self._stopping.set()
        self._aborting.set()

    @staticmethod
    def _fatal_answer(error: ProblemError) -> bool:
        return error.status in (400, 401, 403, 422)

    # Claims.

    async def _claim_loop(self) -> None:
        assert self._stopping is not None and self._slots is not None
        backoff = Backoff()
        try:
            while not self._stopping.is_set():
                # A slot is free once its handler returned: the next claim goes out while
                # outcomes are being reported (at most 4 x concurrency wait to be).
                held = sum(1 for lease in self._leases.values() if lease.state in ("queued", "running"))
                reporting = len(self._leases) - held
                if held >= self.concurrency or reporting >= 4 * self.concurrency:
                    self._slots.clear()
                    await self._either(self._slots.wait(), timeout=None)
                    if not self._stopping.is_set():
                        # Jobs finishing together free their slots one by one: gather
                        # them into one claim instead of a claim per slot.
                        await asyncio.sleep(GATHER_SLOTS)
                    continue
                # Not clamped: a refused batch size stops the worker naming it (422 claim_batch).
                limit = self.batch_size or (self.concurrency - held)
                sent = time.monotonic()
                try:
                    # Not cancelled once sent: the server may lease receipts to us (rule 6).
                    answer = await asyncio.shield(
                        self.client.claim(
                            self.worker_id,
                            lease_ms=self.lease_ms,
                            limit=limit,
                            wait_ms=self.wait_ms,
                            groups=self.groups,
                        )
                    )
                except ProblemError as e:
                    if self._fatal_answer(e):
                        self._fail("claim", e)
                        return
                    self._error(e.code, "claim", e)
                    await self._either(self._stopping.wait(), timeout=backoff.next())
                    continue
                except ConnectionFailed as e:
                    self._error("connection", "claim", e)
                    await self._either(self._stopping.wait(), timeout=backoff.next())
                    continue
                backoff.reset()
                claims = answer["claims"]
                self._emit("poll", None, claimed=len(claims))
                for claim in claims:
                    self._hold(claim, sent)
                if claims:
                    self._start_queued()
                elif answer.get("look_again_ms"):
                    wait = cast(int, answer["look_again_ms"]) / 1000
                    await self._either(self._stopping.wait(), timeout=wait)
                elif self.wait_ms == 0:
                    await self._either(self._stopping.wait(), timeout=0.25)
        finally:
            self._claiming_done = True
            self._poke()

    def _hold(self, claim: s.Claim, sent: float) -> None:
        job = Job(claim)
        self._leases[job.receipt_id] = _Lease(
            job, sent + self.lease_ms / 1000 - self.margin, sent + self.lease_ms / 3000
        )
        self.stats.claimed += 1
        self._emit("claimed", job)

    def _start_queued(self) -> None:
        assert self._stopping is not None
        if self._stopping.is_set():
            return
        for lease in list(self._leases.values()):
            if self._running >= self.concurrency:
                break
            if lease.state == "queued":
                lease.state = "running"
                self._running += 1
                lease.task = asyncio.create_task(self._run(lease), name=f"settled-job-{lease.job.receipt_id}")

    async def _either(self, waiting: Awaitable[Any], timeout: float | None) -> None:
        task = asyncio.ensure_future(waiting)
        try:
            await asyncio.wait_for(task, timeout)
        except asyncio.TimeoutError:
            pass

    # Jobs.

    async def _run(self, lease: _Lease) -> None:
        job = lease.job
        outcome: s.OutcomeIn | None = None
        error: BaseException | None = None
        # The handler runs in a span continuing the producer's trace (when
        # OpenTelemetry is installed); asyncio.to_thread carries it along.
        with handler_span(job.claim) as span:
            try:
                if inspect.iscoroutinefunction(self.handler):
                    result = await self.handler(job)
                else:
                    result = await asyncio.to_thread(self.handler, job)
                    if inspect.isawaitable(result):
                        result = await result
                transcript = result if isinstance(result, str) and result else job.receipt_id
                outcome = {"kind": "accepted", "transcript_id": transcript}
            except asyncio.CancelledError:
                outcome = None
                if not job.lost:
                    # Cancelled by the shutdown deadline: give the lease back.
                    lease.state = "releasing"
            except Retryable as e:
                outcome = cast(s.OutcomeIn, _without_none(kind="retryable", code=e.code, detail=e.detail,
                                                        retry_after_ms=e.retry_after_ms))
            except Permanent as e:
                outcome = cast(s.OutcomeIn, _without_none(kind="permanent", code=e.code, detail=e.detail))
            except Skip as e:
                outcome = cast(s.OutcomeIn, {"kind": "skipped", "reason": e.reason})
            except Exception as e:
                error = e
                outcome = self.on_error(e, job)
                self.log.warning("settled worker: handler raised on %s: %r", job.receipt_id, e)
            finally:
                self._running -= 1
                if self._slots is not None:
                    self._slots.set()
            ended(span, outcome["kind"] if outcome is not None else None, error)
        if job.lost:
            return
        if outcome is not None:
            lease.outcome = outcome
            lease.state = "reporting"
        self._poke()
        self._start_queued()

    def _lose(self, lease: _Lease, reason: str) -> None:
        job = lease.job
        if self._leases.get(job.receipt_id) is not lease:
            return
        del self._leases[job.receipt_id]
        job.lost, job.lost_reason = True, reason
        self.stats.leases_lost += 1
        self.log.warning("settled worker %s: lease lost on %s (%s)", self.worker_id, job.receipt_id, reason)
        self._emit("lease_lost", job, reason=reason)
        if lease.task is not None and not lease.task.done():
            lease.task.cancel()
        if self._slots is not None:
            self._slots.set()

    def _done(self, lease: _Lease) -> None:
        if self._leases.get(lease.job.receipt_id) is lease:
            del self._leases[lease.job.receipt_id]
        if self._slots is not None:
            self._slots.set()

    def _error(self, code: str, what: str, error: BaseException) -> None:
        self.stats.errors[code] += 1
        self.log.warning("settled worker %s: %s failed: %s", self.worker_id, what, error)
        self._emit("error", None, code=code, during=what, error=str(error))

    # Everything that carries a claim goes through this one task.

    async def _commit_loop(self) -> None:
        assert self._stopping is not None and self._wake is not None
        tick = max(0.01, min(0.25, self.lease_ms / 12_000))
        backoff = Backoff()
        stop_started: float | None = None
        while True:
            self._wake.clear()
            now = time.monotonic()
            for lease in list(self._leases.values()):
                if now >= lease.deadline:
                    self._lose(lease, "local deadline passed")
            if self._stopping.is_set():
                stop_started = stop_started or now
                self._stop_step(now - stop_started)
            ok = True
            try:
                await self._send_outcomes()
                await self._send_releases()
                await self._send_heartbeats()
                backoff.reset()
            except ProblemError as e:
                if self._fatal_answer(e):
                    self._fail("a lease request", e)
                    return
                self._error(e.code, "a lease request", e)
                ok = False
            except ConnectionFailed as e:
                self._error("connection", "a lease request", e)
                ok = False
            if self._stopping.is_set() and self._claiming_done and not self._leases:
                return
            wait = tick if ok else min(backoff.next(), tick * 4)
            if self._leases:
                # Wake for the first local deadline: a lost lease's job is cancelled at once.
                first = min(lease.deadline for lease in self._leases.values())
                wait = min(wait, max(0.0, first - time.monotonic()) + 0.001)
            if not ok:
                # Backing off: finished jobs do not wake it, only the wait's end.
                assert self._aborting is not None
                await self._either(self._aborting.wait(), timeout=wait)
            elif not self._wake.is_set():
                await self._either(self._wake.wait(), timeout=wait)

    def _stop_step(self, since_stop: float) -> None:
        """Claims not started are released; running ones past the timeout too."""
        for lease in self._leases.values():
            if lease.state == "queued":
                lease.state = "releasing"
            elif lease.state == "running" and since_stop >= self.shutdown_timeout:
                if lease.task is not None and not lease.task.done():
                    lease.task.cancel()  # _run marks it releasing

    async def _send_outcomes(self) -> None:
        now = time.monotonic()
        ready = [
            lease
            for lease in self._leases.values()
            if lease.state == "reporting" and lease.outcome is not None and lease.retry_at <= now
        ][:MAX_ITEMS]
        if not ready:
            return
        results = await self.client.outcomes([(lease.job.claim, cast(s.OutcomeIn, lease.outcome)) for lease in ready])
        for lease, result in zip(ready, results):
            error = result.get("error")
            route = result.get("route")
            if route is not None:
                self._count(lease, route)
                self._done(lease)
            elif error is not None:
                self._item_error(lease, error, "outcome")

    def _count(self, lease: _Lease, route: s.Route) -> None:
        job = lease.job
        kind = route["kind"]
        if kind == "retry_scheduled":
            self.stats.retried += 1
        elif kind == "dead_lettered":
            self.stats.dead_lettered += 1
        elif lease.outcome is not None and lease.outcome["kind"] == "skipped":
            self.stats.skipped += 1
        else:
            self.stats.settled += 1
        self._emit(cast(str, kind), job, route=route)

    def _item_error(self, lease: _Lease, error: s.Problem, what: str) -> None:
        if error["status"] == 409:
            self._lose(lease, error["code"])
        elif error["class"] == "backend":
            self.stats.errors[error["code"]] += 1
            lease.retry_at = time.monotonic() + Backoff(0.05, 1.0).next()
        else:
            self.stats.errors[error["code"]] += 1
            self.log.error(
                "settled worker %s: %s for %s refused: %s %s: %s",
                self.worker_id,
                what,
                lease.job.receipt_id,
                error["status"],
                error["code"],
                error["detail"],
            )
            self._emit("error", lease.job, code=error["code"], during=what)
            if lease.task is not None and not lease.task.done():
                lease.task.cancel()
            self._done(lease)

    async def _send_releases(self) -> None:
        releasing = [lease for lease in self._leases.values() if lease.state == "releasing"]
        if not releasing:
            return
        limit = asyncio.Semaphore(8)

        async def release(lease: _Lease) -> None:
            async with limit:
                try:
                    await self.client.release(lease.job.claim)
                except ProblemError as e:
                    if e.retryable:
                        raise
                    # 409: the lease had ended already; nothing to give back.
                    if e.status != 409:
                        self.stats.errors[e.code] += 1
                    self._done(lease)
                    return
                self.stats.released += 1
                self._emit("released", lease.job)
                self._done(lease)

        results = await asyncio.gather(*(release(lease) for lease in releasing), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _send_heartbeats(self) -> None:
        now = time.monotonic()
        interval = self.lease_ms / 3000
        live = [lease for lease in self._leases.values() if lease.state != "releasing"]
        if not any(now >= lease.extend_at for lease in live):
            return
        # Leases coming due within half an interval go now too, so that a
        # worker's leases fall into step: one request per interval.
        due = [lease for lease in live if lease.extend_at <= now + interval / 2]
        for start in range(0, len(due), MAX_ITEMS):
            chunk = due[start : start + MAX_ITEMS]
            sent = time.monotonic()
            results = await self.client.extend_many([(lease.job.claim, self.lease_ms) for lease in chunk])
            self.stats.heartbeats += 1
            for lease, result in zip(chunk, results):
                claim = result.get("claim")
                error = result.get("error")
                if claim is not None:
                    lease.job._claim = claim
                    lease.deadline = sent + self.lease_ms / 1000 - self.margin
                    lease.extend_at = sent + interval
                    self.stats.leases_extended += 1
                elif error is not None:
                    if error["status"] == 409:
                        self._lose(lease, error["code"])
                    else:
                        self.stats.errors[error["code"]] += 1
            self._emit("heartbeat", None, leases=len(chunk))

