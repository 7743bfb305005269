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
export type ErrorPolicy = (error: unknown, job: Job) => OutcomeIn;
export type WorkerEvent = "claimed" | "poll" | "no_action" | "retry_scheduled" | "dead_lettered" | "released" | "lease_lost" | "heartbeat" | "error";
export interface Logger {
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
    /** How long running jobs may take to finish once stopped. Default 30 000 ms. */
    shutdownTimeoutMs?: number;
    /** Safety margin before the local deadline, ms. Default min(1000, leaseMs / 10). */
    marginMs?: number;
    /** Stops the worker when aborted (like stop()). */
    signal?: AbortSignal;
    /** Install SIGTERM / SIGINT handlers while running (a second signal stops at once). */
    handleSignals?: boolean;
    /** What an unexpected exception reports. Default: retryable `rpc`, type and message in detail. */
    onError?: ErrorPolicy;
    onEvent?: (event: WorkerEvent, job: Job | undefined, info: Record<string, unknown>) => void;
    /** Where lost leases and errors are logged, one line each. Default: console. */
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
    heartbeats: number;
    leasesExtended: number;
    errors: Record<string, number>;
}
/** An unexpected exception is a retryable `rpc` failure; the server stores only the SHA-256 of `detail`. */
export declare const defaultErrorOutcome: ErrorPolicy;
/** Claims receipts and runs `handler` on each, `concurrency` at a time. */
export declare class Worker {
    readonly client: Client;
    readonly stats: WorkerStats;
    private readonly o;
    private readonly leases;
    private runningCount;
    private stopping;
    private aborting;
    private wakeUp;
    private wakeSet;
    private slotWaiter;
    private claimingDone;
    private fatal;
    private readonly margin;
    constructor(client: Client, options: WorkerOptions);
    /**
     * Stop claiming, let running jobs finish (within shutdownTimeoutMs), report
     * them and release the rest. A second call stops at once.
     */
    stop(): void;
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
    private claimLoop;
    private hold;
    private startQueued;
    private runJob;
    private lose;
    private done;
    private commitLoop;
    private stopStep;
    private sendOutcomes;
    private count;
    private itemError;
    private sendReleases;
    private sendHeartbeats;
}
