// Errors the client throws, and the outcomes a handler throws.

/** Base of every error this package throws. */
export class SettledError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The server answered an `application/problem+json` error. Branch on `code`
 * (stable, listed in the server's troubleshooting guide) or `class`; `detail`
 * is for people and may change.
 */
export class ProblemError extends SettledError {
  readonly status: number;
  readonly code: string;
  readonly class: string;
  readonly detail: string;
  readonly body: unknown;

  constructor(status: number, code: string, cls: string, detail: string, body?: unknown) {
    super(`${status} ${code}: ${detail}`);
    this.status = status;
    this.code = code;
    this.class = cls;
    this.detail = detail;
    this.body = body;
  }

  /** A 503 or 429 (a backend problem, or a server limit reached): worth trying again later. */
  get retryable(): boolean {
    return this.class === "backend" || this.class === "capacity" || this.status === 503 || this.status === 429;
  }

  /** A 409 on a request that carried a claim: the lease is no longer ours. */
  get leaseLost(): boolean {
    return this.status === 409;
  }
}

/** No answer: the connection failed or timed out (the request may or may not have been done). */
export class ConnectionFailed extends SettledError {}

/** The worker stopped on an error retrying cannot fix (bad token, refused parameter). */
export class WorkerStopped extends SettledError {
  readonly problem: ProblemError | undefined;
  constructor(message: string, problem?: ProblemError) {
    super(message, { cause: problem });
    this.problem = problem;
  }
}

/** Throw from a handler: the settlement failed and may pass later (`code` `rpc` or `backend`). */
export class Retryable extends Error {
  constructor(
    readonly code: string = "rpc",
    readonly detail?: string,
    readonly retryAfterMs?: number,
  ) {
    super(detail ?? code);
    this.name = "Retryable";
  }
}

/** Throw from a handler: the settlement failed for good; the receipt is dead-lettered. */
export class Permanent extends Error {
  constructor(
    readonly code: string,
    readonly detail?: string,
  ) {
    super(detail ?? code);
    this.name = "Permanent";
  }
}

/** Throw from a handler: no settlement is needed (`zero_charge`, `denied`, `no_economic_intent`). */
export class Skip extends Error {
  constructor(readonly reason: string) {
    super(reason);
    this.name = "Skip";
  }
}
