"""settled: the client and worker runtime for the settled service.

    import settled

    async def settle(job: settled.Job) -> str:
        return await rail.charge(job.observation, idempotency_key=job.receipt_id)

    client = settled.AsyncClient("http://127.0.0.1:8080", token="...")
    settled.Worker(client, worker_id="w-1", handler=settle).run()
"""

from .client import AsyncClient, Backoff
from .errors import ConnectionFailed, Permanent, ProblemError, Retryable, SettledError, Skip, WorkerStopped
from .worker import Job, Worker, WorkerStats, default_error_outcome

__all__ = [
    "AsyncClient",
    "Backoff",
    "ConnectionFailed",
    "Job",
    "Permanent",
    "ProblemError",
    "Retryable",
    "SettledError",
    "Skip",
    "Worker",
    "WorkerStats",
    "WorkerStopped",
    "default_error_outcome",
]
