"""The Python SDK continues a producer's trace (docs/operators.md, "Traces").

Starts settled (SQLite), enqueues receipts inside a producer's span, and runs a
worker with OpenTelemetry's SDK and an in-memory exporter: each handler must run
inside a `settle receipt` span whose parent is the producer's span, in the
producer's trace, and see it as the current span; a receipt enqueued without a
trace context starts a trace of its own. Run by tests/sdk/driver.rs.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: E402
from scenarios import WORKER_TOKEN, Database, Server  # noqa: E402

import settled  # noqa: E402

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("producer")


async def run(server: Server) -> None:
    producers: dict[str, Any] = {}
    with server.http as http:
        for receipt_id in ("t-1", "t-2"):
            with tracer.start_as_current_span(f"produce {receipt_id}") as span:
                carrier: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(carrier)
                answer = http.post("/v1/receipts", json={"receipt_id": receipt_id, "finalized_at": 1}, headers=carrier)
                assert answer.status_code == 201, answer.text
                producers[receipt_id] = span.get_span_context()
        answer = http.post("/v1/receipts", json={"receipt_id": "plain", "finalized_at": 1})
        assert answer.status_code == 201, answer.text

    seen: dict[str, Any] = {}

    async def handler(job: settled.Job) -> str:
        seen[job.receipt_id] = trace.get_current_span().get_span_context()
        if len(seen) == 3:
            worker.stop()
        return "tx-" + job.receipt_id

    client = settled.AsyncClient(server.base, token=WORKER_TOKEN)
    worker = settled.Worker(client, worker_id="traced", handler=handler, lease_ms=30_000, concurrency=4)
    await asyncio.wait_for(worker.run_async(), timeout=60)
    await client.aclose()

    spans = {s.attributes["settled.receipt_id"]: s for s in exporter.get_finished_spans() if s.name == "settle receipt"}
    for receipt_id, producer in producers.items():
        span = spans[receipt_id]
        assert span.context.trace_id == producer.trace_id, f"{receipt_id}: not in the producer's trace"
        assert span.parent is not None and span.parent.span_id == producer.span_id, f"{receipt_id}: parent"
        assert span.kind == trace.SpanKind.CONSUMER
        assert span.attributes["settled.outcome.kind"] == "accepted"
        assert span.attributes["settled.worker_id"] == "traced"
        assert seen[receipt_id].span_id == span.context.span_id, "the handler runs inside it"
    plain = spans["plain"]
    assert plain.parent is None and all(plain.context.trace_id != p.trace_id for p in producers.values())
    print("python SDK traces: the handler spans continue the producers' traces")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        db = Database("sqlite", Path(tmp), "traces")
        server = Server(db, Path(tmp))
        try:
            asyncio.run(run(server))
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
