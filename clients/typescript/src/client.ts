// A client of settled's HTTP API: one method per operation, on the global fetch.
//
// Every error answer throws ProblemError (branch on `.code`); no answer throws
// ConnectionFailed; a success whose body is not the JSON expected throws
// InvalidAnswer. Only requests safe to repeat are retried here: enqueues
// (idempotent by receipt id) and reads, on 503, 504, 429, 500 internal_error or a
// lost connection, a bounded number of times with full-jitter backoff. A claim is
// never retried blindly (the server may have leased receipts already); the worker
// polls again instead.

import type { components, paths } from "./schema.js";
import { ConnectionFailed, InvalidAnswer, ProblemError } from "./errors.js";
import { traceHeaders } from "./tracing.js";

type Schemas = components["schemas"];
export type Claim = Schemas["Claim"];
export type Route = Schemas["Route"];
export type Problem = Schemas["Problem"];
/** A receipt to enqueue: the body of `enqueue`, and one item of `enqueueBatch`. */
export type ReceiptIn = Schemas["ReceiptIn"];
/** What `enqueueBatch` answers for one receipt (`status`: `created`, `existing`, `conflict`, `invalid`). */
export type ReceiptBatchResult = Schemas["ReceiptBatchResult"];
export type ReceiptView = Schemas["ReceiptView"];
export type ClaimsIn = Schemas["ClaimsIn"];
export type ClaimsOut = Schemas["ClaimsOut"];
export type OutcomeResult = Schemas["OutcomeResult"];
export type LeaseExtendResult = Schemas["LeaseExtendResult"];

export type AcceptedOutcome = Schemas["AcceptedOutcome"];
export type SkippedOutcome = Schemas["SkippedOutcome"];
export type RetryableOutcome = Schemas["RetryableOutcome"];
export type PermanentOutcome = Schemas["PermanentOutcome"];
/** What a worker reports for a claimed receipt, told apart by `kind`. */
export type OutcomeIn = Schemas["OutcomeIn"];

type Json<P extends keyof paths, M extends keyof paths[P]> = paths[P][M] extends {
  requestBody?: { content: { "application/json": infer B } };
}
  ? B
  : never;
type Answer<P extends keyof paths, M extends keyof paths[P]> = paths[P][M] extends {
  responses: { 200: { content: { "application/json": infer A } } };
}
  ? A
  : paths[P][M] extends { responses: { 201: { content: { "application/json": infer A } } } }
    ? A
    : never;

export interface ClientOptions {
  /** Bearer token (`worker`, `producer`, `reader` or `operator`). */
  token?: string;
  /** Per-request time limit in ms (a long poll gets its `wait_ms` on top). Default 10 000. */
  timeoutMs?: number;
  /** How many times an idempotent request is tried again on 503 or a lost connection. Default 5. */
  retries?: number;
  /** A fetch to use instead of the global one. */
  fetch?: typeof fetch;
}

/**
 * Full jitter: a random wait up to `base * 2**n`, capped (ms). With `floor` (0..1) at least
 * that share of it is always waited, so that a run of quick failures never storms.
 */
export class Backoff {
  private n = 0;
  constructor(
    private readonly baseMs = 100,
    private readonly capMs = 5_000,
    private readonly floor = 0,
  ) {}
  next(): number {
    const ceiling = Math.min(this.capMs, this.baseMs * 2 ** this.n);
    this.n = Math.min(this.n + 1, 30);
    return ceiling * (this.floor + (1 - this.floor) * Math.random());
  }
  reset(): void {
    this.n = 0;
  }
}

/** Ids may hold '/', '?', '#', '%', spaces or any Unicode: always encoded. */
function fill(template: string, params: Record<string, string>): string {
  return template.replace(/\{(\w+)\}/g, (_, name: string) => {
    const value = params[name];
    if (value === undefined) throw new TypeError(`missing path parameter ${name}`);
    return encodeURIComponent(value);
  });
}

export const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });

interface Call {
  method: "GET" | "POST" | "DELETE" | "PUT";
  path: string;
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined | null>;
  idempotent?: boolean;
  extraMs?: number;
  /** Cancels the request until its answer starts to arrive (it then throws ConnectionFailed). */
  signal?: AbortSignal;
  headers?: Record<string, string>;
}

/** The longest `Retry-After` a retried request honours, ms. */
const MAX_RETRY_AFTER_MS = 10_000;

/** A client of one settled server. */
export class Client {
  readonly baseUrl: string;
  readonly timeoutMs: number;
  readonly retries: number;
  private readonly headers: Record<string, string>;
  private readonly fetch: typeof fetch;

  constructor(baseUrl = "http://127.0.0.1:8080", options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.retries = options.retries ?? 5;
    this.fetch = options.fetch ?? globalThis.fetch;
    // Answers are small JSON: compressing and inflating them costs both sides more CPU than
    // the bytes saved on the wire.
    this.headers = { accept: "application/json", "accept-encoding": "identity" };
    if (options.token) this.headers.authorization = `Bearer ${options.token}`;
  }

  /** Send one request: the parsed JSON answer, or undefined for 204. */
  async request<T>(call: Call): Promise<T> {
    const backoff = new Backoff();
    const tries = call.idempotent ? this.retries + 1 : 1;
    for (let attempt = 1; ; attempt++) {
      let wait: number;
      try {
        return await this.once<T>(call);
      } catch (e) {
        // InvalidAnswer is a ConnectionFailed: the request may or may not have been done.
        const again = e instanceof ConnectionFailed || (e instanceof ProblemError && (e.retryable || e.internal));
        if (!again || attempt >= tries || call.signal?.aborted) throw e;
        wait = backoff.next();
        if (e instanceof ProblemError && e.retryAfterMs !== undefined) {
          wait = Math.max(wait, Math.min(e.retryAfterMs, MAX_RETRY_AFTER_MS));
        }
      }
      await sleep(wait, call.signal);
    }
  }

  private async once<T>(call: Call): Promise<T> {
    let url = this.baseUrl + call.path;
    if (call.query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(call.query)) if (v !== undefined && v !== null) q.set(k, String(v));
      const text = q.toString();
      if (text) url += `?${text}`;
    }
    const headers = { ...this.headers, ...call.headers };
    let body: string | undefined;
    if (call.method !== "GET") {
      headers["content-type"] = "application/json";
      body = JSON.stringify(call.body ?? {});
    }
    // A plain controller and timer: AbortSignal.timeout() costs more CPU per request.
    const limit = new AbortController();
    const timer = setTimeout(() => limit.abort(), this.timeoutMs + (call.extraMs ?? 0));
    const cancel = () => limit.abort();
    call.signal?.addEventListener("abort", cancel, { once: true });
    if (call.signal?.aborted) limit.abort();
    let answer: Response;
    let text: string;
    try {
      try {
        answer = await this.fetch(url, { method: call.method, headers, body, signal: limit.signal });
      } catch (e) {
        const why = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
        throw new ConnectionFailed(`${call.method} ${call.path}: ${why}`, { cause: e });
      }
      // An answer on its way is read to its end: `signal` cancels only a request not yet answered.
      call.signal?.removeEventListener("abort", cancel);
      try {
        text = await answer.text();
      } catch (e) {
        throw new ConnectionFailed(`${call.method} ${call.path}: the answer was cut off`, { cause: e });
      }
    } finally {
      clearTimeout(timer);
      call.signal?.removeEventListener("abort", cancel);
    }
    if (answer.status >= 400) throw problem(answer.status, text, answer.headers.get("retry-after"));
    if (!text) return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      const shown = text.length > 80 ? `${text.slice(0, 80)}…` : text;
      throw new InvalidAnswer(
        `${call.method} ${call.path}: ${answer.status} answer is not JSON (${text.length} bytes: ${JSON.stringify(shown)})`,
        answer.status,
        { cause: e },
      );
    }
  }

  /** Throw InvalidAnswer unless `ok` (the answer parsed, but is not the shape the operation answers). */
  private expect(ok: boolean, call: string, what: string): void {
    if (!ok) throw new InvalidAnswer(`${call}: the answer has no ${what}`, 200);
  }

  // Producers.

  /**
   * Enqueue one receipt; answers its view. The same receipt again (same `finalized_at`,
   * observation, group and priority) changes nothing and answers the same, whatever state it
   * is in; the same id with other content throws ProblemError 409 `receipt_conflict`. Retried
   * on 503, 504, 429, 500 `internal_error` or a lost connection (`retries` times), then throws.
   * Without a `traceparent` of its own the receipt gets the active OpenTelemetry span's.
   */
  async enqueue(receipt: ReceiptIn): Promise<ReceiptView> {
    const headers = await traceHeaders();
    const out = await this.request<ReceiptView>({ method: "POST", path: "/v1/receipts", body: receipt, idempotent: true, headers });
    this.expect(typeof out?.receipt_id === "string", "POST /v1/receipts", "receipt");
    return out;
  }

  /**
   * Enqueue up to 1024 receipts in one commit, each judged on its own: one result per
   * receipt, in order (`created`, `existing`, or `conflict` / `invalid` with its `error`).
   * Receipts without a `traceparent` of their own get the active OpenTelemetry span's.
   */
  async enqueueBatch(receipts: ReceiptIn[]): Promise<ReceiptBatchResult[]> {
    const headers = await traceHeaders();
    const out = await this.request<Answer<"/v1/receipts/batch", "post">>({
      method: "POST",
      path: "/v1/receipts/batch",
      body: { receipts },
      idempotent: true,
      headers,
    });
    this.expect(Array.isArray(out?.results) && out.results.length === receipts.length, "POST /v1/receipts/batch", "results");
    return out.results;
  }

  // Workers.

  /**
   * Claim up to `limit` due receipts, waiting up to `wait_ms` for work. Never retried.
   * `signal` cancels it until its answer starts to arrive: a long poll still waiting ends on
   * the server too, before it leases anything (but receipts leased at that very moment come
   * back only when their leases end). `outcomes` (up to 1024) are recorded first, as
   * outcomes() records them, and answered in `results`, in order; a claim that fails after
   * them answers `claim_error` (and no claims) rather than an error status. When the request
   * fails as a whole nothing may be assumed: sending them again is safe.
   */
  async claim(params: ClaimsIn, options: { signal?: AbortSignal } = {}): Promise<ClaimsOut> {
    const out = await this.request<ClaimsOut>({
      method: "POST",
      path: "/v1/claims",
      body: params,
      extraMs: params.wait_ms ?? 0,
      signal: options.signal,
    });
    this.expect(Array.isArray(out?.claims), "POST /v1/claims", "claims");
    return out;
  }

  /** Claim one receipt by id. */
  claimReceipt(receiptId: string, params: Json<"/v1/receipts/{id}/claim", "post">): Promise<Claim> {
    return this.request({ method: "POST", path: fill("/v1/receipts/{id}/claim", { id: receiptId }), body: params });
  }

  /** Extend one lease to now + `extendMs`; the answer is the claim to send from now on. */
  extend(claim: Claim, extendMs: number): Promise<Claim> {
    const path = fill("/v1/receipts/{id}/lease", { id: claim.receipt_id });
    return this.request({ method: "POST", path, body: { claim, extend_ms: extendMs } });
  }

  /** Extend up to 1024 leases in one request, each judged on its own. */
  async extendMany(leases: Array<[Claim, number]>): Promise<LeaseExtendResult[]> {
    const body: Json<"/v1/leases/extend", "post"> = {
      leases: leases.map(([claim, extend_ms]) => ({ claim, extend_ms })),
    };
    const out = await this.request<Answer<"/v1/leases/extend", "post">>({
      method: "POST",
      path: "/v1/leases/extend",
      body,
    });
    this.expect(Array.isArray(out?.results) && out.results.length === leases.length, "POST /v1/leases/extend", "results");
    return out.results;
  }

  /** Give a lease back: due again at once, no attempt used. */
  async release(claim: Claim): Promise<void> {
    const path = fill("/v1/receipts/{id}/lease", { id: claim.receipt_id });
    await this.request({ method: "DELETE", path, body: { claim } });
  }

  /** Record the outcome of a claimed receipt. */
  outcome(claim: Claim, outcome: OutcomeIn): Promise<Route> {
    const path = fill("/v1/receipts/{id}/outcome", { id: claim.receipt_id });
    return this.request({ method: "POST", path, body: { claim, outcome } });
  }

  /** Record up to 1024 outcomes in one commit, each judged on its own. */
  async outcomes(items: Array<[Claim, OutcomeIn]>): Promise<OutcomeResult[]> {
    const body = { outcomes: items.map(([claim, outcome]) => ({ claim, outcome })) };
    const out = await this.request<Answer<"/v1/outcomes", "post">>({ method: "POST", path: "/v1/outcomes", body });
    this.expect(Array.isArray(out?.results) && out.results.length === items.length, "POST /v1/outcomes", "results");
    return out.results;
  }

  // Readers and operators.

  /** A receipt's state, lease (never its token) and history. */
  get(receiptId: string): Promise<ReceiptView> {
    return this.request({ method: "GET", path: fill("/v1/receipts/{id}", { id: receiptId }), idempotent: true });
  }

  /** Find receipts (`state`, `code`, `owner`, `prefix`, `group`, ranges, `limit`, `cursor`, …). */
  search(query: NonNullable<paths["/v1/receipts"]["get"]["parameters"]["query"]> = {}): Promise<Answer<"/v1/receipts", "get">> {
    return this.request({ method: "GET", path: "/v1/receipts", query: { ...query }, idempotent: true });
  }

  /** Counts per state, oldest due age, samples, groups. */
  status(): Promise<Answer<"/v1/status", "get">> {
    return this.request({ method: "GET", path: "/v1/status", idempotent: true });
  }

  deadLetters(query: NonNullable<paths["/v1/dead-letters"]["get"]["parameters"]["query"]> = {}): Promise<Answer<"/v1/dead-letters", "get">> {
    return this.request({ method: "GET", path: "/v1/dead-letters", query: { ...query }, idempotent: true });
  }

  /** Put a dead letter back to work (attempts restart at 0). */
  redrive(receiptId: string): Promise<Answer<"/v1/dead-letters/{id}/redrive", "post">> {
    return this.request({ method: "POST", path: fill("/v1/dead-letters/{id}/redrive", { id: receiptId }) });
  }

  hold(receiptId: string, reason?: string): Promise<ReceiptView> {
    return this.act("/v1/receipts/{receipt_id}/hold", receiptId, reason);
  }

  unhold(receiptId: string, reason?: string): Promise<ReceiptView> {
    return this.act("/v1/receipts/{receipt_id}/unhold", receiptId, reason);
  }

  cancel(receiptId: string, reason: string): Promise<ReceiptView> {
    return this.act("/v1/receipts/{receipt_id}/cancel", receiptId, reason);
  }

  /** Act on up to 1000 receipts by id or filter (`dry_run` first). */
  bulk(action: Schemas["BulkAction"], body: Json<"/v1/bulk/{action}", "post">): Promise<Answer<"/v1/bulk/{action}", "post">> {
    return this.request({ method: "POST", path: fill("/v1/bulk/{action}", { action }), body });
  }

  info(): Promise<Answer<"/v1/info", "get">> {
    return this.request({ method: "GET", path: "/v1/info", idempotent: true });
  }

  private act(template: keyof paths, receiptId: string, reason?: string): Promise<ReceiptView> {
    const body = reason === undefined ? {} : { reason };
    return this.request({ method: "POST", path: fill(template, { receipt_id: receiptId }), body });
  }
}

function problem(status: number, text: string, retryAfter: string | null): ProblemError {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    body = undefined;
  }
  // Retry-After in seconds (an HTTP date is not worth the parsing here).
  const seconds = retryAfter === null ? NaN : Number(retryAfter);
  const wait = Number.isFinite(seconds) && seconds >= 0 ? Math.round(seconds * 1000) : undefined;
  if (body && typeof body === "object" && "code" in body) {
    const p = body as Partial<Problem>;
    const code = String(p.code);
    return new ProblemError(status, code, String(p.class ?? ""), String(p.detail ?? ""), body, wait);
  }
  // Not a problem (a proxy's page, say): a 5xx is worth another try, anything else is not.
  const cls = status >= 500 ? "backend" : "validation";
  return new ProblemError(status, `http_${status}`, cls, text.slice(0, 200), body, wait);
}
