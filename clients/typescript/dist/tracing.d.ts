import type { Claim } from "./client.js";
type Api = typeof import("@opentelemetry/api");
/** OpenTelemetry's API if it is installed, loaded once. */
export declare function loadTracing(): Promise<Api | null>;
/**
 * The active span's `traceparent` / `tracestate` headers, for an enqueue: the server keeps
 * them with the receipt unless its body carries its own. None without OpenTelemetry or
 * outside a valid span.
 */
export declare function traceHeaders(): Promise<Record<string, string>>;
/** A span around one handler run. */
export interface HandlerSpan {
    /** Run `fn` with the span as the active one. */
    run<T>(fn: () => T): T;
    /** End the span with what the run ended with. */
    end(outcomeKind?: string, error?: unknown): void;
}
/** A span whose parent is the claim's producer context; null without OpenTelemetry. */
export declare function startHandlerSpan(api: Api | null, claim: Claim): HandlerSpan | null;
export {};
