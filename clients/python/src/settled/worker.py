"""The worker runtime: claims, runs a handler per receipt, heartbeats, reports.

It keeps the rules of the server's worker guide (docs/worker-loop.md) so that a
handler only settles one receipt:

- every claim is sent back exactly, and after a heartbeat the new claim is sent;
- nothing is committed after the local deadline (the time the claim or the
  heartbeat was *sent*, plus the lease, minus a margin, on a monotonic clock);
- every held lease is extended once a third of it has passed, all of them in
  one `POST /v1/leases/extend`;
- a lease's claim is in one request at a time (`sending`): heartbeats, releases
  and outcome batches go from one task, one after the other, and an outcome riding
  in a claim (from the claim task) is neither heartbeated nor sent again while that
  claim is out, so a heartbeat and an outcome for the same claim never race;
- a 409 (or the local deadline) means the lease is lost: the handler's task is
  cancelled, `job.lost` is set, and no outcome is sent for it;
- an outcome the server refuses (or that is outside the spec) is replaced by
  `on_error`'s, and the lease released only if that is refused too, so that a
  receipt is never left to come back without an attempt counted;
- 503, 504, 429, lost connections and garbled answers back off with full
  jitter, a 500 with a floor under the jitter; 401, 403 and 422 stop the
  worker with `WorkerStopped`;
- on stop: no more claims (the one in flight is cancelled after a moment, and
  what it brings released), running jobs get until `shutdown_timeout` to
  finish and are reported, claims not started are released; `run()` returns
  within `shutdown_timeout`;
- outcomes ride along with the next claim (`POST /v1/claims` with `outcomes`): a busy
  worker reports what it finished and asks for more work in one round trip. The commit
  loop sends them in a `POST /v1/outcomes` instead (those of jobs that finish together
  in one) when no claim is about to take them: see `_send_outcomes` and `LINGER`.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import inspect
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union, cast

from . import _schema as s
from ._tracing import ended, handler_span
from .client import AsyncClient, Backoff
from .errors import (
    ConnectionFailed,
    InvalidAnswer,
    InvalidOutcome,
    OutcomeRefused,
    Permanent,
    ProblemError,
    Retryable,
    Skip,
    WorkerStopped,
    check_detail,
    check_failure_code,
    check_rail_code,
    check_retry_after,
    check_skip_reason,
)

__all__ = ["Job", "Worker", "WorkerStats", "Handler", "ErrorPolicy", "default_error_outcome"]

log = logging.getLogger("settled.worker")

Handler = Callable[["Job"], Union[Awaitable[Any], Any]]
#: `on_error(error, job)`: the outcome to report for an unexpected exception, or for an
#: outcome refused (`OutcomeRefused`) or outside the spec (`InvalidOutcome`). May be async.
ErrorPolicy = Callable[[BaseException, "Job"], Union[s.OutcomeIn, Awaitable[s.OutcomeIn]]]

MAX_ITEMS = 1024
#: How long a claim waits, once a slot is free, for more slots to free up (0: only
#: for the jobs already done, which a turn of the event loop reports).
GATHER_SLOTS = 0.0
#: How long a stop lets the claim in flight answer before cancelling it: an answer
#: already on its way is taken (and its receipts released); a long poll still waiting
#: is cancelled, which ends it on the server too, before it leases anything.
CLAIM_GRACE = 0.1
#: The most a `look_again_ms` is trusted (a day).
MAX_LOOK_AGAIN_MS = 86_400_000
#: The 4xx answers to a whole outcome batch that may be one item's fault (a body too large,
#: one that is not valid JSON): the items are then sent one by one to find it.
ITEM_FAULTS = (400, 413, 422)
#: How long an outcome that is ready waits for the next claim to carry it, when a claim is
#: about to be sent; after that the commit loop sends it in a `POST /v1/outcomes` itself.
LINGER = 0.025


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
    #: Outcomes refused by the server, or outside the spec, and replaced by `on_error`'s.
    outcomes_refused: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "errors"}
        out["errors"] = dict(self.errors)
        return out


def _without_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _text(value: str) -> str:
    """`value` as text that encodes to UTF-8 (no lone surrogates), so that it can be sent."""
    return value.encode("utf-8", "replace").decode("utf-8")


def default_error_outcome(error: BaseException, job: Job) -> s.OutcomeIn:
    """An unexpected exception is a retryable `rpc` failure; an outcome the server refused
    (`OutcomeRefused`) or one outside the spec (`InvalidOutcome`), the worker's own fault, a
    retryable `backend` failure. Both are retried under the server's retry policy, then
    dead-lettered. The type and message go into `detail`, of which the server stores only
    the SHA-256."""
    code = "backend" if isinstance(error, (OutcomeRefused, InvalidOutcome)) else "rpc"
    detail = _text(f"{type(error).__qualname__}: {error}")
    return cast(s.OutcomeIn, {"kind": "retryable", "code": code, "detail": detail})


def check_outcome(outcome: object) -> None:
    """Raise `InvalidOutcome` unless `outcome` is an outcome of the spec's kinds and closed sets
    (the server judges the rest, such as a transcript id's length)."""
    if not isinstance(outcome, Mapping):
        raise InvalidOutcome(f"an outcome is an object with a kind, not {outcome!r}")
    kind = outcome.get("kind")
    if kind == "accepted":
        if not isinstance(outcome.get("transcript_id"), str):
            raise InvalidOutcome("an accepted outcome needs a transcript_id string")
    elif kind == "skipped":
        check_skip_reason(outcome.get("reason"))
    elif kind in ("retryable", "permanent"):
        check_failure_code(outcome.get("code"))
        check_detail(outcome.get("detail"))
        check_rail_code(outcome.get("rail_code"))
        if kind == "retryable":
            check_retry_after(outcome.get("retry_after_ms"))
    else:
        raise InvalidOutcome(f"unknown outcome kind {kind!r}: accepted, skipped, retryable or permanent")


def _looks_like_claim(claim: object) -> bool:
    if not isinstance(claim, dict):
        return False
    strings = ("receipt_id", "lease_owner", "lease_token")
    integers = ("attempts", "finalized_at", "row_version", "lease_until_ms")
    return all(isinstance(claim.get(k), str) for k in strings) and all(
        isinstance(claim.get(k), int) and not isinstance(claim.get(k), bool) for k in integers
    )


class _Lease:
    __slots__ = ("job", "deadline", "extend_at", "state", "task", "outcome", "retry_at", "tries", "fallback", "alone",
                 "ready_at", "sending", "uncarried")

    def __init__(self, job: Job, deadline: float, extend_at: float):
        self.job = job
        self.deadline = deadline
        self.extend_at = extend_at
        # queued -> running -> reporting -> (gone); or releasing -> (gone)
        self.state = "queued"
        self.task: asyncio.Task[None] | None = None
        self.outcome: s.OutcomeIn | None = None
        self.retry_at = 0.0
        #: Sends of the outcome answered with a transient error.
        self.tries = 0
        #: The outcome is `on_error`'s, after a refusal: a second refusal releases the lease.
        self.fallback = False
        #: Sent in a batch of its own (its batch was refused as a whole).
        self.alone = False
        #: When its outcome became ready to send (monotonic).
        self.ready_at = 0.0
        #: A request carrying this claim is on its way (a claim carrying the outcome, an
        #: outcome batch, a heartbeat): nothing else sends the claim meanwhile.
        self.sending = False
        #: Never carried by a claim again (a claim carrying it was refused as a whole): sent
        #: in a `POST /v1/outcomes`, which finds an item at fault.
        self.uncarried = False


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
        if shutdown_timeout <= 0:
            raise ValueError("shutdown_timeout must be more than 0")
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
        self._stop_at: float | None = None
        self._abort_timer: asyncio.TimerHandle | None = None
        #: What the claim loop does: "ready" (about to claim, or waiting for a free slot),
        #: "claiming" (a claim on its way), "pausing" (backing off, or after an empty claim),
        #: "done".
        self._claim_phase = "ready"
        #: When the first outcome the commit loop left for the next claim is its to send.
        self._linger_until: float | None = None
        #: Whether claims carry outcomes: no longer once two claims in a row that carried some
        #: were refused as a whole (a server older than `outcomes` in claims refuses them all).
        self._carrying = True
        self._carry_refusals = 0

    @property
    def _reserve(self) -> float:
        """The end of `shutdown_timeout` kept to report and release once jobs are cancelled."""
        return min(1.0, self.shutdown_timeout / 4)

    # Control.

    def stop(self) -> None:
        """Stop claiming, let running jobs finish (within `shutdown_timeout`),
        report them and release the rest. A second call stops at once.
        Safe to call from any thread and from a signal handler; `run()` /
        `run_async()` return within `shutdown_timeout` of the first call."""
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
            try:
                loop.call_soon_threadsafe(self._request_stop)
            except RuntimeError:  # the loop has ended: the worker is not running
                pass

    def _request_stop(self) -> None:
        assert self._stopping is not None and self._aborting is not None and self._loop is not None
        if self._stopping.is_set():
            if not self._aborting.is_set():
                self.log.warning("settled worker %s: second stop, stopping at once", self.worker_id)
            self._abort()
        elif self._stop_at is None:
            self.log.info("settled worker %s: stopping", self.worker_id)
            self._stop_at = time.monotonic()
            # Running jobs get until then; the rest of the time reports and releases.
            self._abort_timer = self._loop.call_later(self.shutdown_timeout - self._reserve, self._shutdown_timed_out)
        self._stopping.set()
        if self._slots is not None:
            self._slots.set()  # a claim loop waiting for a free slot sees the stop
        self._poke()

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stopping is not None and not self._stopping.is_set():
            running = sum(1 for lease in self._leases.values() if lease.state == "running")
            self.log.warning(
                "settled worker %s: %s received, stopping: no more claims, %d running jobs get up to %g s "
                "to finish, leases not started are released (again to stop at once)",
                self.worker_id,
                sig.name,
                running,
                self.shutdown_timeout - self._reserve,
            )
        self._request_stop()

    def _shutdown_timed_out(self) -> None:
        running = sum(1 for lease in self._leases.values() if lease.state == "running")
        if self._leases or not self._claiming_done:
            self.log.warning(
                "settled worker %s: shutdown_timeout reached with %d jobs still running: cancelling them",
                self.worker_id,
                running,
            )
        self._abort()

    def _abort(self) -> None:
        assert self._stopping is not None and self._aborting is not None
        self._stopping.set()
        self._aborting.set()
        if self._slots is not None:
            self._slots.set()
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
        self._stop_at, self._fatal, self._claiming_done = None, None, False
        self._claim_phase = "ready"
        self._leases, self._running = {}, 0
        pending_stops, self._stop_requests = self._stop_requests, 0
        for _ in range(pending_stops):
            self._request_stop()
        installed: list[signal.Signals] = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    self._loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass
        claimer = asyncio.create_task(self._claim_loop(), name="settled-claims")
        committer = asyncio.create_task(self._commit_loop(), name="settled-commits")
        try:
            await self._until_done(committer)
        finally:
            for sig in installed:
                self._loop.remove_signal_handler(sig)
            await self._wind_down(claimer, committer)
        if self._fatal is not None:
            raise self._fatal

    async def _until_done(self, committer: asyncio.Task[None]) -> None:
        assert self._aborting is not None
        aborting = asyncio.create_task(self._aborting.wait())
        try:
            await asyncio.wait([aborting, committer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborting.cancel()
        if committer.done() and not committer.cancelled() and committer.exception() is not None:
            raise cast(BaseException, committer.exception())

    async def _wind_down(self, claimer: asyncio.Task[None], committer: asyncio.Task[None]) -> None:
        """After a clean stop, nothing is left; after an abort, give back what is held, within
        what is left of `shutdown_timeout`."""
        if self._abort_timer is not None:
            self._abort_timer.cancel()
        now = time.monotonic()
        budget = self._reserve
        if self._stop_at is not None:
            budget = min(budget, self._stop_at + self.shutdown_timeout - now)
        self._abort()
        # The claim loop ends by itself (a claim in flight gets its grace, or its answer is read
        # when it has begun to arrive): what it brings is held, then released.
        await asyncio.wait([claimer], timeout=max(0.0, budget / 2))
        tasks = [claimer, committer, *self._tasks()]
        for task in tasks:
            task.cancel()
        # Tasks end at their next await; a handler that ignores cancellation is not waited for.
        await asyncio.wait([claimer, committer], timeout=0.1)
        if self._leases:
            left = max(0.05, budget - (time.monotonic() - now))
            try:
                await asyncio.wait_for(self._flush(), timeout=left)
            except (asyncio.TimeoutError, ProblemError, ConnectionFailed):
                pass
            except Exception:
                self.log.exception("settled worker %s: reporting at the stop failed", self.worker_id)
        if self._leases:
            self.log.warning(
                "settled worker %s: stopped holding %d leases: their receipts are claimable again once "
                "the leases end, with no attempt used",
                self.worker_id,
                len(self._leases),
            )
            self._leases.clear()

    async def _flush(self) -> None:
        """One last report of the outcomes ready, and a release of every other lease."""
        ready = [lease for lease in self._leases.values() if lease.state == "reporting" and lease.outcome]
        for lease in self._leases.values():
            if lease not in ready:
                lease.state = "releasing"
        await asyncio.gather(self._send_batch(ready[:MAX_ITEMS]), self._send_releases(), return_exceptions=True)

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
        self.stats.errors[error.code] += 1
        message = f"settled worker {self.worker_id}: {what} refused with {error.status} {error.code}: {error.detail}"
        self.log.error(message)
        self._fatal = WorkerStopped(message, error)
        self._abort()

    @staticmethod
    def _fatal_answer(error: ProblemError) -> bool:
        return error.status in (400, 401, 403, 422)

    # Claims.

    async def _claim_loop(self) -> None:
        assert self._stopping is not None and self._slots is not None
        backoff = Backoff()
        # A server that fails (500) is asked again ever more slowly, never in a tight loop.
        failing = Backoff(0.25, 10.0, floor=0.5)
        try:
            while not self._stopping.is_set():
                self._claim_phase = "ready"
                # A slot is free once its handler returned: the next claim goes out while
                # outcomes are being reported (at most 4 x concurrency wait to be).
                held = sum(1 for lease in self._leases.values() if lease.state in ("queued", "running"))
                reporting = len(self._leases) - held
                if held >= self.concurrency or reporting >= 4 * self.concurrency:
                    self._slots.clear()
                    if self._linger_until is not None:
                        self._poke()  # no claim is coming: the outcomes left for one go now
                    await self._either(self._slots.wait(), timeout=None)
                    if not self._stopping.is_set():
                        # Jobs finishing together free their slots one by one: gather
                        # them into one claim instead of a claim per slot.
                        await asyncio.sleep(GATHER_SLOTS)
                    continue
                # Not clamped: a refused batch size stops the worker naming it (422 claim_batch).
                limit = self.batch_size or (self.concurrency - held)
                sent = time.monotonic()
                # The outcomes ready ride along: recorded before the claim, in one round trip.
                carried = self._take_outcomes()
                self._claim_phase = "claiming"
                try:
                    try:
                        answer = await self._claim(limit, carried)
                    finally:
                        # Whatever happens, they are no longer on their way: an outcome whose
                        # claim failed as a whole is sent again (the commit loop sends it at
                        # once, the claim loop backing off); it cannot be recorded twice.
                        for lease in carried:
                            lease.sending = False
                except ProblemError as e:
                    if carried and e.status in ITEM_FAULTS:
                        # Refused as a whole, maybe for an outcome it carried (too large, not
                        # valid JSON): those go in POST /v1/outcomes, which finds the one at
                        # fault; the claim is made again without them at once.
                        self.log.warning(
                            "settled worker %s: a claim carrying %d outcomes refused (%s): sending them apart",
                            self.worker_id,
                            len(carried),
                            e,
                        )
                        for lease in carried:
                            lease.uncarried = True
                        self._carry_refusals += 1
                        if self._carry_refusals >= 2 and self._carrying:
                            self._carrying = False
                            self.log.warning(
                                "settled worker %s: claims carrying outcomes were refused twice in a row "
                                "(a server older than outcomes in claims?): outcomes go in POST /v1/outcomes "
                                "from now on",
                                self.worker_id,
                            )
                        self._poke()
                        continue
                    if not await self._claim_failed(e, backoff, failing):
                        return
                    continue
                except ConnectionFailed as e:
                    self._error("invalid_answer" if isinstance(e, InvalidAnswer) else "connection", "claim", e)
                    self._claim_phase = "pausing"
                    self._poke()
                    await self._either(self._stopping.wait(), timeout=backoff.next())
                    continue
                if answer is None:
                    break  # stopped with the claim in flight, and it was cancelled
                if carried:
                    self._carry_refusals = 0
                    # The outcomes first, as a POST /v1/outcomes answer: a receipt claimed again
                    # in this same answer (a retry due at once) is then a new lease.
                    await self._outcome_results(carried, answer.get("results"))
                claim_error = answer.get("claim_error")
                if isinstance(claim_error, dict):
                    # The outcomes were recorded, the claim then failed: as a failed claim.
                    if not await self._claim_failed(_problem(claim_error), backoff, failing):
                        return
                    continue
                backoff.reset()
                failing.reset()
                claims = []
                for claim in answer["claims"]:
                    if _looks_like_claim(claim):
                        claims.append(claim)
                    else:
                        self._error("invalid_answer", "claim", InvalidAnswer(f"not a claim: {str(claim)[:80]!r}"))
                look_again = answer.get("look_again_ms")
                if not isinstance(look_again, int) or isinstance(look_again, bool) or look_again <= 0:
                    look_again = None
                self._emit("poll", None, claimed=len(claims), look_again_ms=look_again)
                for claim in claims:
                    self._hold(claim, sent)
                if claims:
                    self._start_queued()
                    continue
                pause = self._pause(look_again, time.monotonic() - sent, polled=not carried)
                if pause > 0:
                    self._claim_phase = "pausing"
                    self._poke()
                    await self._either(self._stopping.wait(), timeout=pause)
        finally:
            self._claim_phase = "done"
            self._claiming_done = True
            self._poke()

    async def _claim_failed(self, e: ProblemError, backoff: Backoff, failing: Backoff) -> bool:
        """A claim refused or failed (its status, or its `claim_error`): back off; False when
        the worker must stop (401, 403, 422)."""
        assert self._stopping is not None
        if self._fatal_answer(e):
            self._fail("claim", e)
            return False
        self._error(e.code, "claim", e)
        self._claim_phase = "pausing"
        self._poke()
        wait = backoff.next() if e.retryable else failing.next()
        await self._either(self._stopping.wait(), timeout=wait)
        return True

    def _take_outcomes(self) -> list[_Lease]:
        """The outcomes a claim carries: every one ready (up to 1024), except those the commit
        loop sends on their own."""
        if not self._carrying:
            return []
        now = time.monotonic()
        taken = [
            lease
            for lease in self._leases.values()
            if lease.state == "reporting"
            and lease.outcome is not None
            and not lease.sending
            and not lease.alone
            and not lease.uncarried
            and lease.retry_at <= now
            and now < lease.deadline
        ][:MAX_ITEMS]
        for lease in taken:
            lease.sending = True
        return taken

    def _claim_soon(self) -> bool:
        """Whether the claim loop is about to send a claim (which takes the outcomes ready):
        not stopping, not backing off or pausing, and a claim on its way (a busy worker's next
        one follows it at once) or a slot free."""
        if self._stopping is None or self._stopping.is_set() or self._claim_phase in ("pausing", "done"):
            return False
        if self._claim_phase == "claiming":
            return True
        held = sum(1 for lease in self._leases.values() if lease.state in ("queued", "running"))
        reporting = len(self._leases) - held
        return held < self.concurrency and reporting < 4 * self.concurrency

    def _pause(self, look_again_ms: int | None, waited: float, polled: bool = True) -> float:
        """How long to wait after a claim that brought nothing (`polled`: a long poll, not a
        claim that carried outcomes, which does not wait)."""
        # An answer that came back before its long poll ended (a wait_ms of 0, a server
        # stopping) is not asked again at once. After a claim carrying outcomes, the long poll
        # follows at once.
        pause = 0.0 if not polled or (self.wait_ms > 0 and waited >= self.wait_ms / 2000) else 0.25
        if look_again_ms is None:
            return pause
        look = min(look_again_ms, MAX_LOOK_AGAIN_MS) / 1000
        if self.groups is not None and len(self.groups) == 1:
            # One group, held back by its rate: nothing can be claimed before its next token.
            return look
        # A rate-limited group says nothing of the others: work can arrive there at any
        # moment, and the next long poll waits for it (and for the token) by itself.
        return min(look, pause)

    async def _claim(self, limit: int, carried: Sequence[_Lease] = ()) -> s.ClaimsOut | None:
        """One claim, carrying the outcomes of `carried`; None when the worker stopped while it
        was in flight and it was cancelled."""
        assert self._stopping is not None and self._aborting is not None
        started = asyncio.Event()
        request = asyncio.create_task(
            self.client.claim(
                self.worker_id,
                lease_ms=self.lease_ms,
                limit=limit,
                # A claim carrying outcomes does not wait for work: their results come back at
                # once (a stop waits for them, no lease waits on them unextended); when it
                # brings nothing, the next claim, without them, is the long poll.
                wait_ms=0 if carried else self.wait_ms,
                groups=self.groups,
                started=started,
                outcomes=[(lease.job.claim, cast(s.OutcomeIn, lease.outcome)) for lease in carried] or None,
            )
        )
        stopped = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait([request, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                # Stopping: an answer on its way is still taken (its receipts are released);
                # a long poll still waiting is cancelled, which ends it on the server too.
                await asyncio.wait([request], timeout=CLAIM_GRACE)
            if not request.done() and (started.is_set() or carried):
                # It has begun to arrive: its leases are ours, read it to give them back. One
                # carrying outcomes is waited for too (it does not wait for work): cut off, its
                # outcomes may be recorded with no answer to say so.
                await asyncio.wait([request], timeout=self.shutdown_timeout)
        finally:
            stopped.cancel()
            if not request.done():
                request.cancel()
                await asyncio.wait([request])
        if request.cancelled():
            return None
        return request.result()

    def _hold(self, claim: s.Claim, sent: float) -> None:
        job = Job(claim)
        old = self._leases.get(job.receipt_id)
        if old is not None:
            # Claimed again: the lease held before has ended on the server.
            self._lose(old, "claimed again")
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

    async def _call_handler(self, job: Job) -> Any:
        if inspect.iscoroutinefunction(self.handler):
            result = await self.handler(job)
        else:
            result = await _in_thread(self.handler, job)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _run(self, lease: _Lease) -> None:
        job = lease.job
        outcome: s.OutcomeIn | None = None
        error: BaseException | None = None
        invalid: InvalidOutcome | None = None
        cancelled = False
        # The handler runs in a span continuing the producer's trace (when
        # OpenTelemetry is installed); a thread handler carries it along.
        with handler_span(job.claim) as span:
            try:
                result = await self._call_handler(job)
                transcript = result if isinstance(result, str) and result else job.receipt_id
                outcome = {"kind": "accepted", "transcript_id": transcript}
            except asyncio.CancelledError:
                cancelled = True
            except Retryable as e:
                outcome = cast(s.OutcomeIn, _without_none(kind="retryable", code=e.code, detail=e.detail,
                                                        retry_after_ms=e.retry_after_ms, rail_code=e.rail_code))
            except Permanent as e:
                outcome = cast(s.OutcomeIn, _without_none(kind="permanent", code=e.code, detail=e.detail,
                                                        rail_code=e.rail_code))
            except Skip as e:
                outcome = cast(s.OutcomeIn, {"kind": "skipped", "reason": e.reason})
            except InvalidOutcome as e:  # Retryable / Permanent / Skip made outside the spec
                invalid = e
            except Exception as e:
                error = e
            finally:
                self._running -= 1
                if self._slots is not None:
                    self._slots.set()
            if outcome is not None:
                try:
                    check_outcome(outcome)  # again: a field may have been changed after it was made
                except InvalidOutcome as e:
                    outcome, invalid = None, e
            ended(span, outcome["kind"] if outcome is not None else None, error or invalid)
        if job.lost:
            self._start_queued()
            return
        if cancelled:
            # Cancelled at the stop: give the lease back.
            lease.state = "releasing"
            self._poke()
            return
        if invalid is not None:
            self._note_refused(lease, "invalid_outcome", None, str(invalid))
            lease.fallback = True
            outcome = await self._fallback(invalid, job)
        elif error is not None:
            self.log.warning("settled worker: handler raised on %s: %r", job.receipt_id, error)
            outcome = await self._fallback(error, job)
        if job.lost or self._leases.get(job.receipt_id) is not lease:
            return
        lease.outcome = outcome
        lease.state = "reporting"
        lease.ready_at = time.monotonic()
        self._poke()
        self._start_queued()

    async def _fallback(self, error: BaseException, job: Job) -> s.OutcomeIn:
        """`on_error`'s outcome; the default one when the hook raises or gives no valid outcome."""
        try:
            outcome: Any = self.on_error(error, job)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            if outcome is None:
                raise InvalidOutcome("on_error returned None")
            check_outcome(outcome)
            return cast(s.OutcomeIn, outcome)
        except Exception as e:
            self.stats.errors["on_error"] += 1
            self.log.error(
                "settled worker %s: on_error failed on %s (%s: %s): reporting the default outcome",
                self.worker_id,
                job.receipt_id,
                type(e).__name__,
                e,
            )
            self._emit("error", job, code="on_error", during="on_error", error=str(e))
            return default_error_outcome(error, job)

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

    # Heartbeats, releases and outcome batches: this one task (a claim carries outcomes too).

    async def _commit_loop(self) -> None:
        assert self._stopping is not None and self._wake is not None
        tick = max(0.01, min(0.25, self.lease_ms / 12_000))
        backoff = Backoff(floor=0.5)
        while True:
            self._wake.clear()
            now = time.monotonic()
            for lease in list(self._leases.values()):
                # An outcome riding in a claim was sent before its deadline: its answer decides.
                if now >= lease.deadline and not lease.sending:
                    self._lose(lease, "local deadline passed")
            if self._stopping.is_set():
                self._stop_step()
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
                self._error("invalid_answer" if isinstance(e, InvalidAnswer) else "connection", "a lease request", e)
                ok = False
            if self._stopping.is_set() and self._claiming_done and not self._leases:
                return
            wait = tick if ok else min(backoff.next(), tick * 4)
            deadlines = [lease.deadline for lease in self._leases.values() if not lease.sending]
            if self._linger_until is not None:
                # Wake when an outcome left for the next claim has waited long enough.
                deadlines.append(self._linger_until)
            if deadlines:
                # Wake for the first local deadline: a lost lease's job is cancelled at once.
                wait = min(wait, max(0.0, min(deadlines) - time.monotonic()) + 0.001)
            if not ok:
                # Backing off: finished jobs do not wake it, only the wait's end.
                assert self._aborting is not None
                await self._either(self._aborting.wait(), timeout=wait)
            elif not self._wake.is_set():
                await self._either(self._wake.wait(), timeout=wait)

    def _stop_step(self) -> None:
        """Claims not started are released (running ones are cancelled when the time is up)."""
        for lease in self._leases.values():
            if lease.state == "queued":
                lease.state = "releasing"

    async def _send_outcomes(self) -> None:
        """The outcomes no claim is about to carry, in one `POST /v1/outcomes`.

        The rule: when the claim loop is about to claim (`_claim_soon`: a claim on its way,
        or a slot free; not pausing, not stopping), an outcome is left for the next claim for
        at most `LINGER` after it became ready; then, or at once when no claim is coming (all
        slots busy, backing off, pausing after an empty claim, stopping), it is sent here. A
        long poll out holds an outcome back `LINGER` at most. So an outcome waits at most
        `LINGER` longer than before, and a stop still flushes everything."""
        now = time.monotonic()
        soon = self._carrying and self._claim_soon()
        self._linger_until = None
        ready = []
        for lease in self._leases.values():
            if lease.state != "reporting" or lease.outcome is None or lease.retry_at > now or lease.sending:
                continue
            due = max(lease.ready_at, lease.retry_at) + LINGER
            if soon and not lease.alone and not lease.uncarried and now < due:
                self._linger_until = due if self._linger_until is None else min(self._linger_until, due)
                continue
            ready.append(lease)
        together = [lease for lease in ready if not lease.alone][:MAX_ITEMS]
        if together:
            await self._send_batch(together)
        for lease in ready:
            if (
                lease.alone
                and self._leases.get(lease.job.receipt_id) is lease
                and lease.state == "reporting"
                and not lease.sending
            ):
                await self._send_batch([lease])

    async def _send_batch(self, batch: list[_Lease]) -> None:
        if not batch:
            return
        for lease in batch:
            lease.sending = True
        try:
            results = await self.client.outcomes([(lease.job.claim, cast(s.OutcomeIn, lease.outcome)) for lease in batch])
        except ProblemError as e:
            if e.status not in ITEM_FAULTS:
                raise
            if len(batch) > 1:
                # Refused as a whole, maybe for one item (too large, not valid JSON): one by one.
                self.log.warning(
                    "settled worker %s: %d outcomes refused together (%s): sending them one by one",
                    self.worker_id,
                    len(batch),
                    e,
                )
                for lease in batch:
                    lease.alone = True
                return
            await self._refused(batch[0], e)
            return
        finally:
            for lease in batch:
                lease.sending = False
        await self._outcome_results(batch, results)

    async def _outcome_results(self, batch: Sequence[_Lease], results: object) -> None:
        """The `results` of a `POST /v1/outcomes`, or of a claim that carried outcomes."""
        if not isinstance(results, list) or len(results) != len(batch):
            # An answer we cannot read: each outcome is sent again while its lease lasts.
            self._error("invalid_answer", "outcome",
                        InvalidAnswer(f"not {len(batch)} outcome results: {str(results)[:80]!r}"))
            for lease in batch:
                self._retry_later(lease)
            return
        for lease, result in zip(batch, results):
            error = result.get("error") if isinstance(result, dict) else None
            route = result.get("route") if isinstance(result, dict) else None
            if isinstance(route, dict):
                self._count(lease, cast(s.Route, route))
                self._done(lease)
            elif isinstance(error, dict):
                await self._item_error(lease, _problem(error))
            else:
                # Neither: an answer we cannot read; send it again while the lease lasts.
                self._error("invalid_answer", "outcome", InvalidAnswer(f"not an outcome result: {str(result)[:80]!r}"))
                self._retry_later(lease)

    def _retry_later(self, lease: _Lease) -> None:
        lease.tries += 1
        lease.retry_at = time.monotonic() + Backoff(0.05, 2.0, floor=0.5).next() * min(2**lease.tries, 32) / 2

    def _count(self, lease: _Lease, route: s.Route) -> None:
        job = lease.job
        kind = route.get("kind")
        if kind == "retry_scheduled":
            self.stats.retried += 1
        elif kind == "dead_lettered":
            self.stats.dead_lettered += 1
        elif lease.outcome is not None and lease.outcome["kind"] == "skipped":
            self.stats.skipped += 1
        else:
            self.stats.settled += 1
        self._emit(str(kind), job, route=route)

    async def _item_error(self, lease: _Lease, problem: ProblemError) -> None:
        if problem.status == 409:
            self._lose(lease, problem.code)
        elif problem.retryable or problem.internal:
            # Not recorded this time: sent again while the lease lasts.
            self.stats.errors[problem.code] += 1
            self._retry_later(lease)
        else:
            await self._refused(lease, problem)

    def _note_refused(self, lease: _Lease, code: str, status: int | None, detail: str) -> None:
        job = lease.job
        kind = lease.outcome["kind"] if lease.outcome is not None else None
        then = "releasing the lease" if lease.fallback else "reporting on_error's outcome instead"
        self.stats.outcomes_refused += 1
        self.stats.errors[code] += 1
        self.log.error(
            "settled worker %s: outcome for %s refused (%s%s: %s): %s",
            self.worker_id,
            job.receipt_id,
            f"{status} " if status is not None else "",
            code,
            detail,
            then,
        )
        self._emit("outcome_refused", job, code=code, status=status, detail=detail, outcome=lease.outcome, kind=kind,
                   fallback=not lease.fallback)

    async def _refused(self, lease: _Lease, problem: ProblemError) -> None:
        """The server refused the outcome: report `on_error`'s instead; if that is refused too,
        release the lease rather than let it run out."""
        self._note_refused(lease, problem.code, problem.status, problem.detail)
        if lease.fallback:
            lease.state = "releasing"
            return
        lease.fallback = True
        lease.alone = False
        refused, lease.outcome = lease.outcome, None
        # No outcome while on_error runs: neither a claim nor the commit loop sends the refused
        # one again meanwhile (refused twice, the lease would be released).
        outcome = await self._fallback(OutcomeRefused(problem, refused), lease.job)
        if self._leases.get(lease.job.receipt_id) is lease:
            lease.outcome = outcome
            lease.retry_at = 0.0
            lease.ready_at = time.monotonic()

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
                    if e.retryable or e.internal:
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
        # An outcome riding in a claim is not extended meanwhile: the claim it sent is the one
        # the outcome names.
        live = [lease for lease in self._leases.values() if lease.state != "releasing" and not lease.sending]
        if not any(now >= lease.extend_at for lease in live):
            return
        # Leases coming due within half an interval go now too, so that a
        # worker's leases fall into step: one request per interval.
        due = [lease for lease in live if lease.extend_at <= now + interval / 2]
        for start in range(0, len(due), MAX_ITEMS):
            chunk = due[start : start + MAX_ITEMS]
            sent = time.monotonic()
            for lease in chunk:
                lease.sending = True
            try:
                results = await self.client.extend_many([(lease.job.claim, self.lease_ms) for lease in chunk])
            finally:
                for lease in chunk:
                    lease.sending = False
            self.stats.heartbeats += 1
            for lease, result in zip(chunk, results):
                claim = result.get("claim")
                error = result.get("error")
                if _looks_like_claim(claim):
                    lease.job._claim = cast(s.Claim, claim)
                    lease.deadline = sent + self.lease_ms / 1000 - self.margin
                    lease.extend_at = sent + interval
                    self.stats.leases_extended += 1
                elif isinstance(error, dict) and error.get("status") == 409:
                    self._lose(lease, str(error.get("code")))
                else:
                    # Not extended this time (a 503, a 500): tried again soon, while the lease lasts.
                    self.stats.errors[str(error.get("code")) if isinstance(error, dict) else "invalid_answer"] += 1
                    lease.extend_at = sent + min(1.0, interval / 4)
            self._emit("heartbeat", None, leases=len(chunk))


def _problem(error: Mapping[str, Any]) -> ProblemError:
    return ProblemError(
        int(error.get("status") or 0),
        str(error.get("code") or "unknown"),
        str(error.get("class") or ""),
        str(error.get("detail") or ""),
        error,
    )


def _in_thread(function: Callable[[Job], Any], job: Job) -> asyncio.Future[Any]:
    """Run a plain handler in a daemon thread of its own, with the caller's context (its
    trace span): unlike the loop's executor, a handler that never returns cannot hold up
    the end of `run()`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            result = context.run(function, job)
        except BaseException as e:  # handed to the job's task, like any handler's exception
            outcome: tuple[bool, Any] = (False, e)
        else:
            outcome = (True, result)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop has ended meanwhile
            pass

    threading.Thread(target=target, name=f"settled-handler-{job.receipt_id}"[:60], daemon=True).start()
    return future
