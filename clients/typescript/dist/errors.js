// Errors the client throws, and the outcomes a handler throws.
// Keyed by the generated unions, so that tsc fails when the spec adds or drops a code and
// these lists are not brought along.
const FAILURE_CODE_SET = {
    invalid_receipt_signature: true,
    invalid_action_hash: true,
    untrusted_receipt_signer: true,
    malformed_financial_metadata: true,
    invalid_observation: true,
    rpc: true,
    invalid_input: true,
    invalid_dispatch: true,
    invalid_binding: true,
    unsupported: true,
    serialization: true,
    signature: true,
    verification: true,
    backend: true,
};
const SKIP_REASON_SET = {
    denied: true,
    no_economic_intent: true,
    zero_charge: true,
};
/** Every failure code the server accepts. */
export const FAILURE_CODES = Object.freeze(Object.keys(FAILURE_CODE_SET));
/** Every skip reason the server accepts. */
export const SKIP_REASONS = Object.freeze(Object.keys(SKIP_REASON_SET));
/** A rail's own code (`railCode`): 1..=64 characters of `A-Z a-z 0-9 _ . : -`. */
export const RAIL_CODE_PATTERN = /^[A-Za-z0-9_.:-]{1,64}$/;
export function isFailureCode(value) {
    return typeof value === "string" && Object.prototype.hasOwnProperty.call(FAILURE_CODE_SET, value);
}
export function isSkipReason(value) {
    return typeof value === "string" && Object.prototype.hasOwnProperty.call(SKIP_REASON_SET, value);
}
/** Base of every error this package throws. */
export class SettledError extends Error {
    constructor(message, options) {
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
    status;
    code;
    class;
    detail;
    body;
    /** The answer's `Retry-After`, in ms, when it had one. */
    retryAfterMs;
    constructor(status, code, cls, detail, body, retryAfterMs) {
        super(`${status} ${code}: ${detail}`);
        this.status = status;
        this.code = code;
        this.class = cls;
        this.detail = detail;
        this.body = body;
        this.retryAfterMs = retryAfterMs;
    }
    /**
     * Worth trying again soon: the database is unavailable (503), the request ran out of time
     * on the server (504), a server limit was reached (429).
     */
    get retryable() {
        return this.class === "backend" || this.class === "capacity" || [429, 503, 504].includes(this.status);
    }
    /**
     * A 500 `internal_error`: a fault in the server. Retried, but only a few times, since the
     * same request may fail the same way (not `invalid_record`, which no retry fixes).
     */
    get internal() {
        return this.status === 500 && (this.class === "internal" || this.code === "internal_error");
    }
    /** A 409 on a request that carried a claim: the lease is no longer ours. */
    get leaseLost() {
        return this.status === 409;
    }
}
/** No answer: the connection failed or timed out (the request may or may not have been done). */
export class ConnectionFailed extends SettledError {
}
/**
 * A success status whose body is not the JSON the operation answers (a proxy's page, a body
 * cut short): as with no answer, the request may or may not have been done.
 */
export class InvalidAnswer extends ConnectionFailed {
    status;
    constructor(message, status, options) {
        super(message, options);
        this.status = status;
    }
}
/** The worker stopped on an error retrying cannot fix (bad token, refused parameter). */
export class WorkerStopped extends SettledError {
    problem;
    constructor(message, problem) {
        super(message, { cause: problem });
        this.problem = problem;
    }
}
/**
 * An outcome outside the spec: a failure code or skip reason not in its closed set, a
 * malformed `railCode` or `retryAfterMs`. Thrown when the outcome is made, so that a typo
 * shows at once; a worker reports such a handler through `onError`.
 */
export class InvalidOutcome extends SettledError {
}
/**
 * The server refused the outcome the worker reported for a job (a 422 such as
 * `invalid_transcript_id`, `invalid_body` or `invalid_rail_code`). Handed to `onError`,
 * whose outcome is reported instead.
 */
export class OutcomeRefused extends SettledError {
    /** The item's problem: `status`, `code`, `class`, `detail`. */
    status;
    code;
    class;
    detail;
    /** The outcome that was refused. */
    outcome;
    constructor(problem, outcome) {
        super(`${problem.status} ${problem.code}: ${problem.detail}`);
        this.status = problem.status;
        this.code = problem.code;
        this.class = problem.class;
        this.detail = problem.detail;
        this.outcome = outcome;
    }
}
const shown = (value) => {
    try {
        return JSON.stringify(value) ?? String(value);
    }
    catch {
        return String(value);
    }
};
function checkCode(code, what) {
    if (!isFailureCode(code)) {
        throw new InvalidOutcome(`${what}unknown failure code ${shown(code)}: the codes are ${FAILURE_CODES.join(", ")} (a rail's own code goes in railCode)`);
    }
}
function checkReason(reason, what) {
    if (!isSkipReason(reason)) {
        throw new InvalidOutcome(`${what}unknown skip reason ${shown(reason)}: the reasons are ${SKIP_REASONS.join(", ")}`);
    }
}
function checkDetail(detail, what) {
    if (detail !== undefined && detail !== null && typeof detail !== "string") {
        throw new InvalidOutcome(`${what}detail must be a string, not ${typeof detail}`);
    }
}
function checkRailCode(railCode, what) {
    if (railCode !== undefined && railCode !== null && !(typeof railCode === "string" && RAIL_CODE_PATTERN.test(railCode))) {
        throw new InvalidOutcome(`${what}invalid rail code ${shown(railCode)}: 1..=64 characters of A-Z a-z 0-9 _ . : -`);
    }
}
function checkRetryAfter(ms, what) {
    if (ms !== undefined && ms !== null && !(typeof ms === "number" && Number.isSafeInteger(ms) && ms >= 0)) {
        throw new InvalidOutcome(`${what}retry after must be a whole number of ms >= 0, not ${shown(ms)}`);
    }
}
/**
 * Throw InvalidOutcome unless `outcome` is an outcome of the spec's kinds and closed sets
 * (the server judges the rest, such as a transcript id's length).
 */
export function checkOutcome(outcome) {
    if (typeof outcome !== "object" || outcome === null) {
        throw new InvalidOutcome(`an outcome is an object with a kind, not ${shown(outcome)}`);
    }
    const o = outcome;
    switch (o.kind) {
        case "accepted":
            if (typeof o.transcript_id !== "string")
                throw new InvalidOutcome("an accepted outcome needs a transcript_id string");
            return;
        case "skipped":
            return checkReason(o.reason, "");
        case "retryable":
        case "permanent":
            checkCode(o.code, "");
            checkDetail(o.detail, "");
            checkRailCode(o.rail_code, "");
            if (o.kind === "retryable")
                checkRetryAfter(o.retry_after_ms, "");
            return;
        default:
            throw new InvalidOutcome(`unknown outcome kind ${shown(o.kind)}: accepted, skipped, retryable or permanent`);
    }
}
function checkFailure(kind, code, options) {
    const what = `${kind}: `;
    checkCode(code, what);
    checkDetail(options.detail, what);
    checkRailCode(options.railCode, what);
    checkRetryAfter(options.retryAfterMs, what);
}
function options(detailOrOptions, retryAfterMs) {
    if (typeof detailOrOptions === "object" && detailOrOptions !== null)
        return { ...detailOrOptions };
    return { detail: detailOrOptions, retryAfterMs };
}
/**
 * Throw from a handler: the settlement failed and may pass later. Only `rpc` and `backend`
 * are retried; any other code dead-letters. An unknown code is a type error, and throws
 * InvalidOutcome here.
 *
 *     new Retryable("rpc", "rail timed out")
 *     new Retryable("rpc", { detail: "429 from the rail", retryAfterMs: 30_000, railCode: "rate_limited" })
 */
export class Retryable extends Error {
    code;
    detail;
    retryAfterMs;
    railCode;
    constructor(code = "rpc", detailOrOptions, retryAfterMs) {
        const o = options(detailOrOptions, retryAfterMs);
        checkFailure("Retryable", code, o);
        super(o.detail ?? code);
        this.name = "Retryable";
        this.code = code;
        this.detail = o.detail;
        this.retryAfterMs = o.retryAfterMs;
        this.railCode = o.railCode;
    }
}
/**
 * Throw from a handler: the settlement failed for good; the receipt is dead-lettered. An
 * unknown code is a type error, and throws InvalidOutcome here: put the rail's own words
 * in `railCode`.
 *
 *     new Permanent("verification", { detail: "declined by the issuer", railCode: "card_declined" })
 */
export class Permanent extends Error {
    code;
    detail;
    railCode;
    constructor(code, detailOrOptions) {
        const o = options(detailOrOptions);
        checkFailure("Permanent", code, o);
        super(o.detail ?? code);
        this.name = "Permanent";
        this.code = code;
        this.detail = o.detail;
        this.railCode = o.railCode;
    }
}
/**
 * Throw from a handler: no settlement is needed (`zero_charge`, `denied`, `no_economic_intent`).
 * An unknown reason is a type error, and throws InvalidOutcome here.
 */
export class Skip extends Error {
    reason;
    constructor(reason) {
        checkReason(reason, "Skip: ");
        super(reason);
        this.name = "Skip";
        this.reason = reason;
    }
}
