import type { components } from "./schema.js";
type Schemas = components["schemas"];
/** A failure code: the server's closed set (only `rpc` and `backend` are retried). */
export type FailureCode = Schemas["SettlementFailureCode"];
/** Why no settlement was needed: the server's closed set. */
export type SkipReason = Schemas["SettlementSkipReason"];
/** Every failure code the server accepts. */
export declare const FAILURE_CODES: readonly FailureCode[];
/** Every skip reason the server accepts. */
export declare const SKIP_REASONS: readonly SkipReason[];
/** A rail's own code (`railCode`): 1..=64 characters of `A-Z a-z 0-9 _ . : -`. */
export declare const RAIL_CODE_PATTERN: RegExp;
export declare function isFailureCode(value: unknown): value is FailureCode;
export declare function isSkipReason(value: unknown): value is SkipReason;
/** Base of every error this package throws. */
export declare class SettledError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/**
 * The server answered an `application/problem+json` error. Branch on `code`
 * (stable, listed in the server's troubleshooting guide) or `class`; `detail`
 * is for people and may change.
 */
export declare class ProblemError extends SettledError {
    readonly status: number;
    readonly code: string;
    readonly class: string;
    readonly detail: string;
    readonly body: unknown;
    /** The answer's `Retry-After`, in ms, when it had one. */
    readonly retryAfterMs: number | undefined;
    constructor(status: number, code: string, cls: string, detail: string, body?: unknown, retryAfterMs?: number);
    /**
     * Worth trying again soon: the database is unavailable (503), the request ran out of time
     * on the server (504), a server limit was reached (429).
     */
    get retryable(): boolean;
    /**
     * A 500 `internal_error`: a fault in the server. Retried, but only a few times, since the
     * same request may fail the same way (not `invalid_record`, which no retry fixes).
     */
    get internal(): boolean;
    /** A 409 on a request that carried a claim: the lease is no longer ours. */
    get leaseLost(): boolean;
}
/** No answer: the connection failed or timed out (the request may or may not have been done). */
export declare class ConnectionFailed extends SettledError {
}
/**
 * A success status whose body is not the JSON the operation answers (a proxy's page, a body
 * cut short): as with no answer, the request may or may not have been done.
 */
export declare class InvalidAnswer extends ConnectionFailed {
    readonly status: number;
    constructor(message: string, status: number, options?: {
        cause?: unknown;
    });
}
/** The worker stopped on an error retrying cannot fix (bad token, refused parameter). */
export declare class WorkerStopped extends SettledError {
    readonly problem: ProblemError | undefined;
    constructor(message: string, problem?: ProblemError);
}
/**
 * An outcome outside the spec: a failure code or skip reason not in its closed set, a
 * malformed `railCode` or `retryAfterMs`. Thrown when the outcome is made, so that a typo
 * shows at once; a worker reports such a handler through `onError`.
 */
export declare class InvalidOutcome extends SettledError {
}
/**
 * The server refused the outcome the worker reported for a job (a 422 such as
 * `invalid_transcript_id`, `invalid_body` or `invalid_rail_code`). Handed to `onError`,
 * whose outcome is reported instead.
 */
export declare class OutcomeRefused extends SettledError {
    /** The item's problem: `status`, `code`, `class`, `detail`. */
    readonly status: number;
    readonly code: string;
    readonly class: string;
    readonly detail: string;
    /** The outcome that was refused. */
    readonly outcome: unknown;
    constructor(problem: {
        status: number;
        code: string;
        class: string;
        detail: string;
    }, outcome: unknown);
}
/** Options of Permanent (and of Retryable). */
export interface FailureOptions {
    /** Free text; the server stores only its SHA-256. */
    detail?: string;
    /** The rail's own code (e.g. `card_declined`), kept in the history: see RAIL_CODE_PATTERN. */
    railCode?: string;
}
/** Options of Retryable. */
export interface RetryableOptions extends FailureOptions {
    /** The rail's own wait before another try (its `Retry-After`), in ms. */
    retryAfterMs?: number;
}
/**
 * Throw InvalidOutcome unless `outcome` is an outcome of the spec's kinds and closed sets
 * (the server judges the rest, such as a transcript id's length).
 */
export declare function checkOutcome(outcome: unknown): asserts outcome is OutcomeShape;
/** What checkOutcome lets through (the outcome types live in client.ts). */
type OutcomeShape = {
    kind: "accepted" | "skipped" | "retryable" | "permanent";
};
/**
 * Throw from a handler: the settlement failed and may pass later. Only `rpc` and `backend`
 * are retried; any other code dead-letters. An unknown code is a type error, and throws
 * InvalidOutcome here.
 *
 *     new Retryable("rpc", "rail timed out")
 *     new Retryable("rpc", { detail: "429 from the rail", retryAfterMs: 30_000, railCode: "rate_limited" })
 */
export declare class Retryable extends Error {
    readonly code: FailureCode;
    readonly detail: string | undefined;
    readonly retryAfterMs: number | undefined;
    readonly railCode: string | undefined;
    constructor(code?: FailureCode, detail?: string, retryAfterMs?: number);
    constructor(code: FailureCode, options: RetryableOptions);
}
/**
 * Throw from a handler: the settlement failed for good; the receipt is dead-lettered. An
 * unknown code is a type error, and throws InvalidOutcome here: put the rail's own words
 * in `railCode`.
 *
 *     new Permanent("verification", { detail: "declined by the issuer", railCode: "card_declined" })
 */
export declare class Permanent extends Error {
    readonly code: FailureCode;
    readonly detail: string | undefined;
    readonly railCode: string | undefined;
    constructor(code: FailureCode, detail?: string);
    constructor(code: FailureCode, options: FailureOptions);
}
/**
 * Throw from a handler: no settlement is needed (`zero_charge`, `denied`, `no_economic_intent`).
 * An unknown reason is a type error, and throws InvalidOutcome here.
 */
export declare class Skip extends Error {
    readonly reason: SkipReason;
    constructor(reason: SkipReason);
}
export {};
