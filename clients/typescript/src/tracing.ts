// Run each handler inside a span that continues the producer's trace, and hand
// a producer's active trace context to what it enqueues.
//
// Only when @opentelemetry/api is installed (with an SDK to export, and a
// context manager such as the NodeSDK's): the claim carries the producer's W3C
// `traceparent` and `tracestate` (docs/operators.md, "Traces"), which become
// the parent of a `settle receipt` span around the handler. Without the
// package, the handler just runs.

import type { Claim } from "./client.js";

type Api = typeof import("@opentelemetry/api");

let loading: Promise<Api | null> | undefined;

/** OpenTelemetry's API if it is installed, loaded once. */
export function loadTracing(): Promise<Api | null> {
  loading ??= import("@opentelemetry/api").catch(() => null);
  return loading;
}

/**
 * The active span's `traceparent` / `tracestate` headers, for an enqueue: the server keeps
 * them with the receipt unless its body carries its own. None without OpenTelemetry or
 * outside a valid span.
 */
export async function traceHeaders(): Promise<Record<string, string>> {
  const api = await loadTracing();
  if (!api) return {};
  try {
    const context = api.trace.getSpan(api.context.active())?.spanContext();
    if (!context || !api.isSpanContextValid(context)) return {};
    const flags = (context.traceFlags & 0xff).toString(16).padStart(2, "0");
    const headers: Record<string, string> = { traceparent: `00-${context.traceId}-${context.spanId}-${flags}` };
    const state = context.traceState?.serialize();
    if (state) headers.tracestate = state;
    return headers;
  } catch {
    // Tracing never costs an enqueue.
    return {};
  }
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** A span around one handler run. */
export interface HandlerSpan {
  /** Run `fn` with the span as the active one. */
  run<T>(fn: () => T): T;
  /** End the span with what the run ended with. */
  end(outcomeKind?: string, error?: unknown): void;
}

/** A span whose parent is the claim's producer context; null without OpenTelemetry. */
export function startHandlerSpan(api: Api | null, claim: Claim): HandlerSpan | null {
  if (!api) return null;
  let parent = api.context.active();
  const m = TRACEPARENT.exec(claim.traceparent ?? "");
  if (m && m[1] !== "ff" && !/^0+$/.test(m[2]) && !/^0+$/.test(m[3])) {
    parent = api.trace.setSpanContext(parent, {
      traceId: m[2],
      spanId: m[3],
      traceFlags: parseInt(m[4], 16) & 1,
      isRemote: true,
      traceState: claim.tracestate ? api.createTraceState(claim.tracestate) : undefined,
    });
  }
  const span = api.trace.getTracer("settled").startSpan(
    "settle receipt",
    {
      kind: api.SpanKind.CONSUMER,
      attributes: {
        "settled.receipt_id": claim.receipt_id,
        "settled.group": claim.group ?? "default",
        "settled.attempt": claim.attempts + 1,
        "settled.worker_id": claim.lease_owner,
      },
    },
    parent,
  );
  const active = api.trace.setSpan(parent, span);
  return {
    run: (fn) => api.context.with(active, fn),
    end: (outcomeKind, error) => {
      if (outcomeKind) span.setAttribute("settled.outcome.kind", outcomeKind);
      if (error !== undefined) {
        span.recordException(error instanceof Error ? error : String(error));
        span.setStatus({ code: api.SpanStatusCode.ERROR, message: error instanceof Error ? error.name : "error" });
      }
      span.end();
    },
  };
}
