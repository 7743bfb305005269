import type { components, paths } from "./schema.js";
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
    requestBody?: {
        content: {
            "application/json": infer B;
        };
    };
} ? B : never;
type Answer<P extends keyof paths, M extends keyof paths[P]> = paths[P][M] extends {
    responses: {
        200: {
            content: {
                "application/json": infer A;
            };
        };
    };
} ? A : paths[P][M] extends {
    responses: {
        201: {
            content: {
                "application/json": infer A;
            };
        };
    };
} ? A : never;
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
export declare class Backoff {
    private readonly baseMs;
    private readonly capMs;
    private readonly floor;
    private n;
    constructor(baseMs?: number, capMs?: number, floor?: number);
    next(): number;
    reset(): void;
}
export declare const sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
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
/** A client of one settled server. */
export declare class Client {
    readonly baseUrl: string;
    readonly timeoutMs: number;
    readonly retries: number;
    private readonly headers;
    private readonly fetch;
    constructor(baseUrl?: string, options?: ClientOptions);
    /** Send one request: the parsed JSON answer, or undefined for 204. */
    request<T>(call: Call): Promise<T>;
    private once;
    /** Throw InvalidAnswer unless `ok` (the answer parsed, but is not the shape the operation answers). */
    private expect;
    /**
     * Enqueue one receipt; answers its view. The same receipt again (same `finalized_at`,
     * observation, group and priority) changes nothing and answers the same, whatever state it
     * is in; the same id with other content throws ProblemError 409 `receipt_conflict`. Retried
     * on 503, 504, 429, 500 `internal_error` or a lost connection (`retries` times), then throws.
     * Without a `traceparent` of its own the receipt gets the active OpenTelemetry span's.
     */
    enqueue(receipt: ReceiptIn): Promise<ReceiptView>;
    /**
     * Enqueue up to 1024 receipts in one commit, each judged on its own: one result per
     * receipt, in order (`created`, `existing`, or `conflict` / `invalid` with its `error`).
     * Receipts without a `traceparent` of their own get the active OpenTelemetry span's.
     */
    enqueueBatch(receipts: ReceiptIn[]): Promise<ReceiptBatchResult[]>;
    /**
     * Claim up to `limit` due receipts, waiting up to `wait_ms` for work. Never retried.
     * `signal` cancels it until its answer starts to arrive: a long poll still waiting ends on
     * the server too, before it leases anything (but receipts leased at that very moment come
     * back only when their leases end). `outcomes` (up to 1024) are recorded first, as
     * outcomes() records them, and answered in `results`, in order; a claim that fails after
     * them answers `claim_error` (and no claims) rather than an error status. When the request
     * fails as a whole nothing may be assumed: sending them again is safe.
     */
    claim(params: ClaimsIn, options?: {
        signal?: AbortSignal;
    }): Promise<ClaimsOut>;
    /** Claim one receipt by id. */
    claimReceipt(receiptId: string, params: Json<"/v1/receipts/{id}/claim", "post">): Promise<Claim>;
    /** Extend one lease to now + `extendMs`; the answer is the claim to send from now on. */
    extend(claim: Claim, extendMs: number): Promise<Claim>;
    /** Extend up to 1024 leases in one request, each judged on its own. */
    extendMany(leases: Array<[Claim, number]>): Promise<LeaseExtendResult[]>;
    /** Give a lease back: due again at once, no attempt used. */
    release(claim: Claim): Promise<void>;
    /** Record the outcome of a claimed receipt. */
    outcome(claim: Claim, outcome: OutcomeIn): Promise<Route>;
    /** Record up to 1024 outcomes in one commit, each judged on its own. */
    outcomes(items: Array<[Claim, OutcomeIn]>): Promise<OutcomeResult[]>;
    /** A receipt's state, lease (never its token) and history. */
    get(receiptId: string): Promise<ReceiptView>;
    /** Find receipts (`state`, `code`, `owner`, `prefix`, `group`, ranges, `limit`, `cursor`, …). */
    search(query?: NonNullable<paths["/v1/receipts"]["get"]["parameters"]["query"]>): Promise<Answer<"/v1/receipts", "get">>;
    /** Counts per state, oldest due age, samples, groups. */
    status(): Promise<Answer<"/v1/status", "get">>;
    deadLetters(query?: NonNullable<paths["/v1/dead-letters"]["get"]["parameters"]["query"]>): Promise<Answer<"/v1/dead-letters", "get">>;
    /** Put a dead letter back to work (attempts restart at 0). */
    redrive(receiptId: string): Promise<Answer<"/v1/dead-letters/{id}/redrive", "post">>;
    hold(receiptId: string, reason?: string): Promise<ReceiptView>;
    unhold(receiptId: string, reason?: string): Promise<ReceiptView>;
    cancel(receiptId: string, reason: string): Promise<ReceiptView>;
    /** Act on up to 1000 receipts by id or filter (`dry_run` first). */
    bulk(action: Schemas["BulkAction"], body: Json<"/v1/bulk/{action}", "post">): Promise<Answer<"/v1/bulk/{action}", "post">>;
    info(): Promise<Answer<"/v1/info", "get">>;
    private act;
}
export {};
