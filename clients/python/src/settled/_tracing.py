"""Run each handler inside a span that continues the producer's trace, and
hand a producer's current trace context to what it enqueues.

Only when OpenTelemetry's API is installed (`pip install opentelemetry-api`,
and an SDK to export): the claim carries the producer's W3C `traceparent` and
`tracestate` (docs/operators.md, "Traces"), which become the parent of a
`settle receipt` span around the handler. Without the package, nothing runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # tracing is optional
    _trace = None  # type: ignore[assignment]

__all__ = ["handler_span", "trace_headers"]


def trace_headers() -> dict[str, str]:
    """The current span's `traceparent` / `tracestate` headers (none outside a valid span)."""
    if _trace is None:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


@contextlib.contextmanager
def handler_span(claim: Any) -> Iterator[Any]:
    """A span around one handler run (None when OpenTelemetry is absent);
    the caller sets what the run ended with on it."""
    if _trace is None:
        yield None
        return
    carrier = {k: claim[k] for k in ("traceparent", "tracestate") if claim.get(k)}
    parent = TraceContextTextMapPropagator().extract(carrier)
    tracer = _trace.get_tracer("settled")
    attributes = {
        "settled.receipt_id": claim["receipt_id"],
        "settled.group": claim.get("group", "default"),
        "settled.attempt": claim["attempts"] + 1,
        "settled.worker_id": claim["lease_owner"],
    }
    with tracer.start_as_current_span(
        "settle receipt", context=parent, kind=_trace.SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


def ended(span: Any, outcome_kind: str | None, error: BaseException | None = None) -> None:
    """Write the run's end on its span."""
    if span is None:
        return
    if outcome_kind is not None:
        span.set_attribute("settled.outcome.kind", outcome_kind)
    if error is not None:
        span.record_exception(error)
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(error).__name__))
