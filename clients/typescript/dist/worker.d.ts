import type { Claim, Client, OutcomeIn } from "./client.js";
/** One claimed receipt, as a handler sees it. */
export declare class Job {
    readonly receiptId: string;
    readonly observation: Record<string, unknown> | null;
    /** Failed attempts before this one. */
    readonly attempts: number;
    /** This settlement attempt, counting from 1. */
    readonly attempt: number;
    readonly group: string;
    /** The producer's `finalized_at` (Unix seconds). */
    readonly finalizedAt: number;
    /** Set when the lease was lost (409, or its local deadline passed): stop work, nothing is reported. */
    lost: boolean;
    lostReason: string | undefined;
    /** @internal */
    current: Claim;
    constructor(claim: Claim);
    /** The current claim (after heartbeats, the one the last extension answered). */
    get claim(): Claim;
}
/** Returning settles as `accepted` (the string is the transcript id; the receipt id when none). */
export type Handler = (job: Job, signal: AbortSignal) => Promise<string | void> | string | void;
/**
 * The outcome to report for an unexpected exception of the handler, or for an outcome the
 * server refused (`error` is then an OutcomeRefused). Returning nothing, throwing or
 * rejecting reports `defaultErrorOutcome` instead.
 */
export type ErrorPolicy = (error: unknown, job: Job) => OutcomeIn | undefined | void | Promise<OutcomeIn | undefined | void>;
export type WorkerEvent = "claimed" | "poll" | "no_action" | "retry_scheduled" | "dead_lettered" | "released" | "lease_lost" | "outcome_refused" | "heartbeat" | "error";
export interface Logger {
    /** Stopping and stopped; falls back to `warn` when absent. */
    info?(message: string): void;
    warn(message: string): void;
    error(message: string): void;
}
export interface WorkerOptions {
    workerId: string;
    handler: Handler;
    /** Jobs run at once. Default 8. */
    concurrency?: number;
    /** Lease length in ms. Default 30 000. */
    leaseMs?: number;
    /** Claim only from these groups. */
    groups?: string[];
    /** Receipts per claim (default: the free slots); more than `concurrency` queues them. */
    batchSize?: number;
    /** Long poll per claim, ms (≤ 20 000). Default 5 000. */
    waitMs?: number;
    /**
     * The most a stop takes, ms: running jobs get it less a reserve (a fifth, at most 2 s) to
     * finish, then they are cancelled and every lease still held is reported or released.
     * Default 30 000.
     */
    shutdownTimeoutMs?: number;
    /** Safety margin before the local deadline, ms. Default min(1000, leaseMs / 10). */
    marginMs?: number;
    /** Stops the worker when aborted (like stop()). */
    signal?: AbortSignal;
    /** Install SIGTERM / SIGINT handlers while running (a second signal stops at once). */
    handleSignals?: boolean;
    /** What an unexpected exception, or a refused outcome, reports. Default: defaultErrorOutcome. */
    onError?: ErrorPolicy;
    onEvent?: (event: WorkerEvent, job: Job | undefined, info: Record<string, unknown>) => void;
    /** Where stops, lost leases, refusals and errors are logged, one line each. Default: console. */
    logger?: Logger;
}
export interface WorkerStats {
    claimed: number;
    settled: number;
    retried: number;
    deadLettered: number;
    skipped: number;
    released: number;
    leasesLost: number;
    /** Outcomes the server refused (each then replaced by onError's, or released). */
    outcomesRefused: number;
    heartbeats: number;
    leasesExtended: number;
    errors: Record<string, number>;
}
/**
 * The default onError: an unexpected exception is a retryable `rpc` failure (the rail call
 * may pass next time); an outcome the server refused (OutcomeRefused) or one outside the spec
 * (InvalidOutcome) is the worker's own fault, a retryable `backend` failure. Both are retried
 * under the server's retry policy, then dead-lettered, visibly, instead of settled again and
 * again unreported. The server stores only the SHA-256 of `detail` ("Name: message", cut to
 * 1000 characters).
 */
export declare const defaultErrorOutcome: (error: unknown, _job?: Job) => OutcomeIn;
/** Claims receipts and runs `handler` on each, `concurrency` at a time. */
export declare class Worker {
    readonly client: Client;
    readonly stats: WorkerStats;
    private readonly o;
    private readonly leases;
    private runningCount;
    private readonly stopping;
    private readonly aborting;
    private wakeUp;
    private wakeSet;
    private slotWaiter;
    private claimingDone;
    private fatal;
    private readonly margin;
    private active;
    /** run() has ended: what a claim still brings is released at once. */
    private finished;
    private ended;
    private inFlight;
    /**
     * What the claim loop does: "ready" (about to claim, or waiting for a free slot),
     * "claiming" (a claim on its way), "pausing" (backing off, or after an empty claim), "done".
     */
    private claimPhase;
    /** When the first outcome the commit loop left for the next claim is its to send. */
    private lingerUntil;
    /**
     * Whether claims carry outcomes: no longer once two claims in a row that carried some were
     * refused as a whole (a server older than `outcomes` in claims refuses them all).
     */
    private carrying;
    private carryRefusals;
    private readonly log;
    constructor(client: Client, options: WorkerOptions);
    /**
     * Stop claiming, let running jobs finish, report them and release the rest; resolves
     * when run() has ended, within shutdownTimeoutMs (at once when not running). A second
     * call stops at once: running jobs are cancelled and their leases released.
     */
    stop(): Promise<void>;
    /** Run until stopped. Rejects with WorkerStopped when the server refuses the token or a parameter. */
    run(): Promise<void>;
    private poke;
    private wait;
    private emit;
    private countError;
    private error;
    private static isFatal;
    /** 401 / 403 / 422: retrying cannot fix it. */
    private fail;
    /** The shutdown timeout: cancel what still runs; its lease is released. */
    private expire;
    /**
     * Stopping: cancel the claim in flight unless it answers within CLAIM_GRACE_MS; one carrying
     * outcomes gets the shutdown timeout (it does not wait for work, and cut off, its outcomes
     * may be recorded with no answer to say so).
     */
    private cancelClaimSoon;
    private claimLoop;
    /** One turn of the claim loop; true when the loop must end. */
    private claimOnce;
    /** A claim refused or failed (its status, or its `claim_error`): back off; true when the loop must end. */
    private claimFailed;
    /** The outcomes a claim carries: every one ready (up to 1024), except those sent on their own. */
    private takeOutcomes;
    /**
     * Whether the claim loop is about to send a claim (which takes the outcomes ready): not
     * stopping, not backing off or pausing, and a claim on its way (a busy worker's next one
     * follows it at once) or a slot free.
     */
    private claimSoon;
    /**
     * How long to wait before the next claim after one that brought nothing (`polled`: a long
     * poll, not a claim that carried outcomes, which does not wait: the long poll follows at once).
     */
    private pauseAfterEmpty;
    private lease;
    private hold;
    private startQueued;
    private runJob;
    /**
     * onError's outcome for `error`, or the default one when the hook throws, rejects or gives
     * no valid outcome; undefined when the lease was lost or cancelled meanwhile.
     */
    private hookOutcome;
    private lose;
    private done;
    private commitLoop;
    /**
     * The outcomes no claim is about to carry, in one POST /v1/outcomes.
     *
     * The rule: when the claim loop is about to claim (claimSoon(): a claim on its way, or a
     * slot free; not pausing, not stopping), an outcome is left for the next claim for at most
     * LINGER_MS after it became ready; then, or at once when no claim is coming (all slots busy,
     * backing off, pausing after an empty claim, stopping), it is sent here. A long poll out
     * holds an outcome back LINGER_MS at most. So an outcome waits at most LINGER_MS longer
     * than before, and a stop still flushes everything.
     */
    private sendOutcomes;
    private sendBatch;
    /** The `results` of a POST /v1/outcomes, or of a claim that carried outcomes. */
    private outcomeResults;
    private retryLater;
    private count;
    private itemError;
    /** Count, log (once) and tell onEvent about an outcome refused or outside the spec. */
    private noteRefused;
    /**
     * The server refused this lease's outcome: report onError's instead; if that is refused
     * too, release the lease. Never drop it: a receipt left to expire unreported comes back
     * with no attempt counted, and would be settled again and again.
     */
    private refuse;
    private hookDone;
    private sendReleases;
    /** Release one lease; throws only what is worth trying again (while the lease lasts). */
    private release;
    private sendHeartbeats;
    /**
     * After run() has ended: report the outcomes ready and release every other lease, once
     * each, in the background; what fails comes back when its lease ends. Never rejects.
     */
    private drain;
    private drainOnce;
    /** After run() has ended: count the results of outcomes reported, once each. */
    private drainResults;
}
