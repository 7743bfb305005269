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
    constructor(status: number, code: string, cls: string, detail: string, body?: unknown);
    /** A 503 or 429 (a backend problem, or a server limit reached): worth trying again later. */
    get retryable(): boolean;
    /** A 409 on a request that carried a claim: the lease is no longer ours. */
    get leaseLost(): boolean;
}
/** No answer: the connection failed or timed out (the request may or may not have been done). */
export declare class ConnectionFailed extends SettledError {
}
/** The worker stopped on an error retrying cannot fix (bad token, refused parameter). */
export declare class WorkerStopped extends SettledError {
    readonly problem: ProblemError | undefined;
    constructor(message: string, problem?: ProblemError);
}
/** Throw from a handler: the settlement failed and may pass later (`code` `rpc` or `backend`). */
export declare class Retryable extends Error {
    readonly code: string;
    readonly detail?: string | undefined;
    readonly retryAfterMs?: number | undefined;
    constructor(code?: string, detail?: string | undefined, retryAfterMs?: number | undefined);
}
/** Throw from a handler: the settlement failed for good; the receipt is dead-lettered. */
export declare class Permanent extends Error {
    readonly code: string;
    readonly detail?: string | undefined;
    constructor(code: string, detail?: string | undefined);
}
/** Throw from a handler: no settlement is needed (`zero_charge`, `denied`, `no_economic_intent`). */
export declare class Skip extends Error {
    readonly reason: string;
    constructor(reason: string);
}
