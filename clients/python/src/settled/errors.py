"""Errors the client raises, and the outcomes a handler raises."""

from __future__ import annotations

from typing import Any


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
        """A 503 or 429 (a backend problem, or a server limit reached): worth trying again later."""
        return self.problem_class in ("backend", "capacity") or self.status in (429, 503)

    @property
    def lease_lost(self) -> bool:
        """A 409 on a request that carried a claim: the lease is no longer ours."""
        return self.status == 409


class ConnectionFailed(SettledError):
    """No answer: the connection failed or timed out (the request may or may not have been done)."""


class WorkerStopped(SettledError):
    """The worker stopped on an error retrying cannot fix (bad token, refused parameter)."""

    def __init__(self, message: str, cause: ProblemError | None = None):
        super().__init__(message)
        self.cause = cause


class Retryable(Exception):
    """Raise from a handler: the settlement failed and may pass later (`code` `rpc` or `backend`)."""

    def __init__(self, code: str = "rpc", detail: str | None = None, retry_after_ms: int | None = None):
        super().__init__(detail or code)
        self.code = code
        self.detail = detail
        self.retry_after_ms = retry_after_ms


class Permanent(Exception):
    """Raise from a handler: the settlement failed for good; the receipt is dead-lettered."""

    def __init__(self, code: str, detail: str | None = None):
        super().__init__(detail or code)
        self.code = code
        self.detail = detail


class Skip(Exception):
    """Raise from a handler: no settlement is needed (`zero_charge`, `denied`, `no_economic_intent`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
