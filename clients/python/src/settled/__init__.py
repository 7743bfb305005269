"""settled: the client and worker runtime for the settled service.

    import settled

    async def settle(job: settled.Job) -> str:
        return await rail.charge(job.observation, idempotency_key=job.receipt_id)

    client = settled.AsyncClient("http://127.0.0.1:8080", token="...")
    settled.Worker(client, worker_id="w-1", handler=settle).run()

A producer:

    async with settled.AsyncClient("http://127.0.0.1:8080", token="...") as client:
        await client.enqueue("r-1", finalized_at=1764460800, observation={"amount_cents": 1250})
"""

from ._schema import (
    Claim,
    OutcomeIn,
    ReceiptBatchResult,
    ReceiptIn,
    ReceiptSummary,
    ReceiptView,
    Route,
)
from .client import AsyncClient, Backoff
from .errors import (
    FAILURE_CODES,
    RETRYABLE_CODES,
    SKIP_REASONS,
    ConnectionFailed,
    FailureCode,
    InvalidAnswer,
    InvalidOutcome,
    OutcomeRefused,
    Permanent,
    ProblemError,
    Retryable,
    SettledError,
    Skip,
    SkipReason,
    WorkerStopped,
)
from .worker import ErrorPolicy, Handler, Job, Worker, WorkerStats, check_outcome, default_error_outcome

__all__ = [
    "FAILURE_CODES",
    "RETRYABLE_CODES",
    "SKIP_REASONS",
    "AsyncClient",
    "Backoff",
    "Claim",
    "ConnectionFailed",
    "ErrorPolicy",
    "FailureCode",
    "Handler",
    "InvalidAnswer",
    "InvalidOutcome",
    "Job",
    "OutcomeIn",
    "OutcomeRefused",
    "Permanent",
    "ProblemError",
    "ReceiptBatchResult",
    "ReceiptIn",
    "ReceiptSummary",
    "ReceiptView",
    "Retryable",
    "Route",
    "SettledError",
    "Skip",
    "SkipReason",
    "Worker",
    "WorkerStats",
    "WorkerStopped",
    "check_outcome",
    "default_error_outcome",
]
