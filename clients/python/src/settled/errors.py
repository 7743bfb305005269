"""Errors the client raises, and the outcomes a handler raises."""

from __future__ import annotations

import re
from typing import Any, get_args

from typing_extensions import TypeAlias

from . import _schema as s

__all__ = [
    "FAILURE_CODES",
    "RETRYABLE_CODES",
    "SKIP_REASONS",
    "ConnectionFailed",
    "FailureCode",
    "InvalidAnswer",
    "InvalidOutcome",
    "OutcomeRefused",
    "Permanent",
    "ProblemError",
    "Retryable",
    "SettledError",
    "Skip",
    "SkipReason",
    "WorkerStopped",
]

#: A settlement failure code: the spec's closed set (`openapi.yaml`, `SettlementFailureCode`).
FailureCode: TypeAlias = s.SettlementFailureCode
#: Why no settlement is needed: the spec's closed set (`SettlementSkipReason`).
SkipReason: TypeAlias = s.SettlementSkipReason

FAILURE_CODES: frozenset[str] = frozenset(get_args(s.SettlementFailureCode))
#: The codes the server retries; a `retryable` outcome with any other code is dead-lettered.
RETRYABLE_CODES: frozenset[str] = frozenset({"rpc", "backend"})
SKIP_REASONS: frozenset[str] = frozenset(get_args(s.SettlementSkipReason))
#: A rail's own code for a failure, kept beside the closed `code` (`rail_code` on the wire).
RAIL_CODE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


class SettledError(Exception):
    """Base of every error this package raises."""


class ProblemError(SettledError):
    """The server answered an `application/problem+json` error.

    Branch on `code` (stable, listed in the server's troubleshooting guide)
    or `problem_class`; `detail` is for people and may change.
    """

    def __init__(self, status: int, code: str, problem_class: str, detail: str, body: Any = None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.problem_class = problem_class
        self.detail = detail
        self.body = body

    @property
    def retryable(self) -> bool:
        """Worth trying again soon: a 503 (the database is unavailable), a 504 (the
        server's time limit), a 429 (a server limit reached)."""
        return self.problem_class in ("backend", "capacity") or self.status in (429, 503, 504)

    @property
    def internal(self) -> bool:
        """A 500 `internal_error`: a fault in the server. Retried, but only a few times,
        since the same request may fail the same way."""
        return self.status == 500 and self.problem_class == "internal"

    @property
    def lease_lost(self) -> bool:
        """A 409 on a request that carried a claim: the lease is no longer ours."""
        return self.status == 409


class ConnectionFailed(SettledError):
    """No answer: the connection failed or timed out (the request may or may not have been done)."""


class InvalidAnswer(ConnectionFailed):
    """A success status whose body is not the JSON the operation answers (say, a proxy's HTML
    page, or a body cut short): as with no answer, the request may or may not have been done."""


class WorkerStopped(SettledError):
    """The worker stopped on an error retrying cannot fix (bad token, refused parameter)."""

    def __init__(self, message: str, cause: ProblemError | None = None):
        super().__init__(message)
        self.cause = cause


class InvalidOutcome(SettledError, ValueError):
    """An outcome outside the spec: a failure code or skip reason not in its closed set, a
    malformed `rail_code` or `retry_after_ms`. Raised when the outcome is made, so that a typo
    shows at once; a worker reports such a handler through `on_error`."""


class OutcomeRefused(SettledError):
    """The server refused an outcome the worker reported (say `422 invalid_transcript_id`): what
    `on_error` is called with, to choose the outcome to report instead."""

    def __init__(self, problem: ProblemError, outcome: Any):
        super().__init__(f"outcome refused: {problem}")
        self.problem = problem
        self.code = problem.code
        #: The outcome that was refused.
        self.outcome = outcome


def _sorted(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


def check_failure_code(code: object) -> None:
    if not isinstance(code, str) or code not in FAILURE_CODES:
        raise InvalidOutcome(f"unknown failure code {code!r}: the codes are {_sorted(FAILURE_CODES)}")


def check_skip_reason(reason: object) -> None:
    if not isinstance(reason, str) or reason not in SKIP_REASONS:
        raise InvalidOutcome(f"unknown skip reason {reason!r}: the reasons are {_sorted(SKIP_REASONS)}")


def check_rail_code(rail_code: object) -> None:
    if rail_code is not None and not (isinstance(rail_code, str) and RAIL_CODE.fullmatch(rail_code)):
        raise InvalidOutcome(f"invalid rail_code {rail_code!r}: 1..=64 characters of A-Z a-z 0-9 _ . : -")


def check_detail(detail: object) -> None:
    if detail is not None and not isinstance(detail, str):
        raise InvalidOutcome(f"detail must be a string, not {type(detail).__name__}")


def check_retry_after(retry_after_ms: object) -> None:
    ok = isinstance(retry_after_ms, int) and not isinstance(retry_after_ms, bool) and 0 <= retry_after_ms < 2**63
    if retry_after_ms is not None and not ok:
        raise InvalidOutcome(f"retry_after_ms must be a whole number of milliseconds >= 0, not {retry_after_ms!r}")


class Retryable(Exception):
    """Raise from a handler: the settlement failed and may pass later.

    Only `rpc` and `backend` are retried; any other `code` is dead-lettered. `rail_code` is the
    rail's own word for the failure (`insufficient_funds`), kept in the receipt's history;
    `retry_after_ms` the rail's own wait (a 429's `Retry-After`). An unknown `code` is a type
    error, and raises `InvalidOutcome` (a `ValueError`) here.
    """

    def __init__(
        self,
        code: FailureCode = "rpc",
        detail: str | None = None,
        retry_after_ms: int | None = None,
        *,
        rail_code: str | None = None,
    ):
        check_failure_code(code)
        check_detail(detail)
        check_retry_after(retry_after_ms)
        check_rail_code(rail_code)
        super().__init__(detail or code)
        self.code: FailureCode = code
        self.detail = detail
        self.retry_after_ms = retry_after_ms
        self.rail_code = rail_code


class Permanent(Exception):
    """Raise from a handler: the settlement failed for good; the receipt is dead-lettered.

    `rail_code` is the rail's own word for the failure (`card_declined`). An unknown `code` is
    a type error, and raises `InvalidOutcome` (a `ValueError`) here.
    """

    def __init__(self, code: FailureCode, detail: str | None = None, *, rail_code: str | None = None):
        check_failure_code(code)
        check_detail(detail)
        check_rail_code(rail_code)
        super().__init__(detail or code)
        self.code: FailureCode = code
        self.detail = detail
        self.rail_code = rail_code


class Skip(Exception):
    """Raise from a handler: no settlement is needed (`zero_charge`, `denied`, `no_economic_intent`).
    An unknown reason is a type error, and raises `InvalidOutcome` (a `ValueError`) here."""

    def __init__(self, reason: SkipReason):
        check_skip_reason(reason)
        super().__init__(reason)
        self.reason: SkipReason = reason
