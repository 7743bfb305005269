// The worker runtime: claims, runs a handler per receipt, heartbeats, reports.
//
// It keeps the rules of the server's worker guide (docs/worker-loop.md), so a
// handler only settles one receipt:
// - every claim is sent back exactly, and after a heartbeat the new claim;
// - nothing is committed after the local deadline (the time the claim or the
//   heartbeat was *sent*, plus the lease, minus a margin, on a monotonic clock);
// - every held lease is extended once a third of it has passed, all of them in
//   one POST /v1/leases/extend;
// - requests that carry claims are sent by one loop, one after the other, so
//   a heartbeat and an outcome for the same claim never race;
// - a 409 (or the local deadline) means the lease is lost: the job's
//   AbortSignal fires, job.lost is set, and no outcome is sent for it;
// - 503 and lost connections back off with full jitter; 401, 403 and 422
//   stop the worker with WorkerStopped;
// - on stop: no more claims, running jobs get shutdownTimeoutMs to finish and
//   are reported, claims not started are released;
// - outcomes of jobs that finish together go in one POST /v1/outcomes.
import { performance } from "node:perf_hooks";
import { Backoff, sleep } from "./client.js";
import { ConnectionFailed, Permanent, ProblemError, Retryable, Skip, WorkerStopped } from "./errors.js";
import { loadTracing, startHandlerSpan } from "./tracing.js";
const MAX_ITEMS = 1024;
const now = () => performance.now();
/** One claimed receipt, as a handler sees it. */
export class Job {
    receiptId;
    observation;
    /** Failed attempts before this one. */
    attempts;
    /** This settlement attempt, counting from 1. */
    attempt;
    group;
    /** The producer's `finalized_at` (Unix seconds). */
    finalizedAt;
    /** Set when the lease was lost (409, or its local deadline passed): stop work, nothing is reported. */
    lost = false;
    lostReason;
    /** @internal */
    current;
    constructor(claim) {
        this.current = claim;
        this.receiptId = claim.receipt_id;
        this.observation = (claim.observation ?? null);
        this.attempts = claim.attempts;
        this.attempt = claim.attempts + 1;
        this.group = claim.group ?? "default";
        this.finalizedAt = claim.finalized_at;
    }
    /** The current claim (after heartbeats, the one the last extension answered). */
    get claim() {
        return this.current;
    }
}
/** An unexpected exception is a retryable `rpc` failure; the server stores only the SHA-256 of `detail`. */
export const defaultErrorOutcome = (error) => {
    const name = error instanceof Error ? error.name : typeof error;
    const message = error instanceof Error ? error.message : String(error);
    return { kind: "retryable", code: "rpc", detail: `${name}: ${message}` };
};
function isProblem(value) {
    return typeof value === "object" && value !== null && "status" in value;
}
/** Claims receipts and runs `handler` on each, `concurrency` at a time. */
export class Worker {
    client;
    stats = {
        claimed: 0,
        settled: 0,
        retried: 0,
        deadLettered: 0,
        skipped: 0,
        released: 0,
        leasesLost: 0,
        heartbeats: 0,
        leasesExtended: 0,
        errors: {},
    };
    o;
    leases = new Map();
    runningCount = 0;
    stopping = new AbortController();
    aborting = new AbortController();
    wakeUp = () => { };
    wakeSet = false;
    slotWaiter;
    claimingDone = false;
    fatal;
    margin;
    constructor(client, options) {
        this.client = client;
        const leaseMs = options.leaseMs ?? 30_000;
        this.o = {
            concurrency: 8,
            waitMs: 5_000,
            shutdownTimeoutMs: 30_000,
            marginMs: Math.min(1_000, Math.floor(leaseMs / 10)),
            handleSignals: false,
            onError: defaultErrorOutcome,
            logger: console,
            ...options,
            leaseMs,
        };
        if (this.o.concurrency < 1)
            throw new RangeError("concurrency must be at least 1");
        this.margin = this.o.marginMs;
    }
    /**
     * Stop claiming, let running jobs finish (within shutdownTimeoutMs), report
     * them and release the rest. A second call stops at once.
     */
    stop() {
        if (this.stopping.signal.aborted) {
            this.o.logger.warn(`settled worker ${this.o.workerId}: second stop, stopping at once`);
            this.aborting.abort();
        }
        this.stopping.abort();
        this.poke();
        this.slotWaiter?.();
    }
    /** Run until stopped. Rejects with WorkerStopped when the server refuses the token or a parameter. */
    async run() {
        const onSignal = () => this.stop();
        if (this.o.handleSignals) {
            process.on("SIGTERM", onSignal);
            process.on("SIGINT", onSignal);
        }
        const external = this.o.signal;
        external?.addEventListener("abort", onSignal);
        if (external?.aborted)
            this.stop();
        const claimer = this.claimLoop();
        const committer = this.commitLoop();
        const aborted = new Promise((resolve) => {
            if (this.aborting.signal.aborted)
                resolve();
            this.aborting.signal.addEventListener("abort", () => resolve(), { once: true });
        });
        try {
            await Promise.race([committer, aborted]);
        }
        finally {
            if (this.o.handleSignals) {
                process.off("SIGTERM", onSignal);
                process.off("SIGINT", onSignal);
            }
            external?.removeEventListener("abort", onSignal);
            this.stopping.abort();
            this.aborting.abort();
            for (const lease of this.leases.values())
                lease.abort.abort();
            this.poke();
            this.slotWaiter?.();
            await Promise.allSettled([claimer, committer]);
        }
        if (this.fatal)
            throw this.fatal;
    }
    poke() {
        this.wakeSet = true;
        this.wakeUp();
    }
    wait(ms) {
        if (this.wakeSet)
            return Promise.resolve();
        return new Promise((resolve) => {
            const timer = setTimeout(done, ms);
            function done() {
                clearTimeout(timer);
                resolve();
            }
            this.wakeUp = done;
        });
    }
    emit(event, job, info = {}) {
        try {
            this.o.onEvent?.(event, job, info);
        }
        catch (e) {
            this.o.logger.error(`settled worker: onEvent hook threw: ${String(e)}`);
        }
    }
    countError(code) {
        this.stats.errors[code] = (this.stats.errors[code] ?? 0) + 1;
    }
    error(code, what, error) {
        this.countError(code);
        this.o.logger.warn(`settled worker ${this.o.workerId}: ${what} failed: ${String(error)}`);
        this.emit("error", undefined, { code, during: what });
    }
    static isFatal(e) {
        return e.status === 400 || e.status === 401 || e.status === 403 || e.status === 422;
    }
    /** 401 / 403 / 422: retrying cannot fix it. */
    fail(what, e) {
        this.countError(e.code);
        const message = `settled worker ${this.o.workerId}: ${what} refused with ${e.status} ${e.code}: ${e.detail}`;
        this.o.logger.error(message);
        this.fatal = new WorkerStopped(message, e);
        this.stopping.abort();
        this.aborting.abort();
    }
    // Claims.
    async claimLoop() {
        const backoff = new Backoff();
        const stopped = this.stopping.signal;
        try {
            while (!stopped.aborted) {
                // A slot is free once its handler returned: the next claim goes out while outcomes
                // are being reported (at most 4 x concurrency wait to be).
                let held = 0;
                for (const lease of this.leases.values())
                    if (lease.state === "queued" || lease.state === "running")
                        held++;
                const reporting = this.leases.size - held;
                if (held >= this.o.concurrency || reporting >= 4 * this.o.concurrency) {
                    await new Promise((resolve) => (this.slotWaiter = resolve));
                    this.slotWaiter = undefined;
                    // Jobs finishing together free their slots one by one: gather them into one
                    // claim instead of a claim per slot.
                    if (!stopped.aborted)
                        await new Promise((resolve) => setImmediate(resolve));
                    continue;
                }
                // Not clamped: a refused batch size stops the worker naming it (422 claim_batch).
                const limit = this.o.batchSize ?? this.o.concurrency - held;
                const sent = now();
                let answer;
                try {
                    // Not aborted once sent: the server may lease receipts to us (rule 6).
                    answer = await this.client.claim({
                        worker_id: this.o.workerId,
                        lease_ms: this.o.leaseMs,
                        limit,
                        wait_ms: this.o.waitMs,
                        ...(this.o.groups?.length ? { groups: this.o.groups } : {}),
                    });
                }
                catch (e) {
                    if (e instanceof ProblemError && Worker.isFatal(e))
                        return this.fail("claim", e);
                    this.error(e instanceof ProblemError ? e.code : "connection", "claim", e);
                    await sleep(backoff.next(), stopped);
                    continue;
                }
                backoff.reset();
                this.emit("poll", undefined, { claimed: answer.claims.length });
                for (const claim of answer.claims)
                    this.hold(claim, sent);
                if (answer.claims.length)
                    this.startQueued();
                else if (answer.look_again_ms)
                    await sleep(answer.look_again_ms, stopped);
                else if (this.o.waitMs === 0)
                    await sleep(250, stopped);
            }
        }
        finally {
            this.claimingDone = true;
            this.poke();
        }
    }
    hold(claim, sent) {
        const job = new Job(claim);
        this.leases.set(job.receiptId, {
            job,
            deadline: sent + this.o.leaseMs - this.margin,
            extendAt: sent + this.o.leaseMs / 3,
            state: "queued",
            abort: new AbortController(),
            retryAt: 0,
        });
        this.stats.claimed++;
        this.emit("claimed", job);
    }
    startQueued() {
        if (this.stopping.signal.aborted)
            return;
        for (const lease of this.leases.values()) {
            if (this.runningCount >= this.o.concurrency)
                break;
            if (lease.state !== "queued")
                continue;
            lease.state = "running";
            this.runningCount++;
            lease.running = this.runJob(lease);
        }
    }
    // Jobs.
    async runJob(lease) {
        const job = lease.job;
        let outcome;
        let unexpected;
        // The handler runs in a span continuing the producer's trace (when
        // @opentelemetry/api is installed).
        const span = startHandlerSpan(await loadTracing(), job.claim);
        try {
            const result = await Promise.race([
                Promise.resolve().then(() => span ? span.run(() => this.o.handler(job, lease.abort.signal)) : this.o.handler(job, lease.abort.signal)),
                new Promise((_, reject) => {
                    const cancelled = () => reject(lease.abort.signal.reason);
                    if (lease.abort.signal.aborted)
                        cancelled();
                    lease.abort.signal.addEventListener("abort", cancelled, { once: true });
                }),
            ]);
            outcome = { kind: "accepted", transcript_id: typeof result === "string" && result ? result : job.receiptId };
        }
        catch (e) {
            if (lease.abort.signal.aborted) {
                outcome = undefined;
                // Cancelled by the shutdown deadline: give the lease back.
                if (!job.lost)
                    lease.state = "releasing";
            }
            else if (e instanceof Retryable) {
                outcome = { kind: "retryable", code: e.code, detail: e.detail, retry_after_ms: e.retryAfterMs };
            }
            else if (e instanceof Permanent) {
                outcome = { kind: "permanent", code: e.code, detail: e.detail };
            }
            else if (e instanceof Skip) {
                outcome = { kind: "skipped", reason: e.reason };
            }
            else {
                unexpected = e;
                outcome = this.o.onError(e, job);
                this.o.logger.warn(`settled worker: handler threw on ${job.receiptId}: ${String(e)}`);
            }
        }
        finally {
            this.runningCount--;
            this.slotWaiter?.();
        }
        span?.end(outcome?.kind, unexpected);
        if (job.lost)
            return;
        if (outcome) {
            lease.outcome = JSON.parse(JSON.stringify(outcome)); // drops undefined fields
            lease.state = "reporting";
        }
        this.poke();
        this.startQueued();
    }
    lose(lease, reason) {
        const job = lease.job;
        if (this.leases.get(job.receiptId) !== lease)
            return;
        this.leases.delete(job.receiptId);
        job.lost = true;
        job.lostReason = reason;
        this.stats.leasesLost++;
        this.o.logger.warn(`settled worker ${this.o.workerId}: lease lost on ${job.receiptId} (${reason})`);
        this.emit("lease_lost", job, { reason });
        lease.abort.abort(new Error(`lease lost: ${reason}`));
        this.slotWaiter?.();
    }
    done(lease) {
        if (this.leases.get(lease.job.receiptId) === lease)
            this.leases.delete(lease.job.receiptId);
        this.slotWaiter?.();
    }
    // Everything that carries a claim goes through this one loop.
    async commitLoop() {
        const tick = Math.max(10, Math.min(250, this.o.leaseMs / 12));
        const backoff = new Backoff();
        let stopStarted;
        for (;;) {
            this.wakeSet = false;
            const t = now();
            for (const lease of [...this.leases.values()])
                if (t >= lease.deadline)
                    this.lose(lease, "local deadline passed");
            if (this.stopping.signal.aborted) {
                stopStarted ??= t;
                this.stopStep(t - stopStarted);
            }
            let ok = true;
            try {
                await this.sendOutcomes();
                await this.sendReleases();
                await this.sendHeartbeats();
                backoff.reset();
            }
            catch (e) {
                if (e instanceof ProblemError && Worker.isFatal(e))
                    return this.fail("a lease request", e);
                if (!(e instanceof ProblemError) && !(e instanceof ConnectionFailed))
                    throw e;
                this.error(e instanceof ProblemError ? e.code : "connection", "a lease request", e);
                ok = false;
            }
            if (this.aborting.signal.aborted)
                return;
            if (this.stopping.signal.aborted && this.claimingDone && this.leases.size === 0)
                return;
            let wait = ok ? tick : Math.min(backoff.next(), tick * 4);
            if (this.leases.size) {
                // Wake for the first local deadline: a lost lease's job is aborted at once.
                let first = Infinity;
                for (const lease of this.leases.values())
                    first = Math.min(first, lease.deadline);
                wait = Math.min(wait, Math.max(0, first - now()) + 1);
            }
            // Backing off: finished jobs do not wake it, only the wait's end.
            if (!ok)
                await sleep(wait, this.aborting.signal);
            else
                await this.wait(wait);
        }
    }
    stopStep(sinceStop) {
        for (const lease of this.leases.values()) {
            if (lease.state === "queued")
                lease.state = "releasing";
            else if (lease.state === "running" && sinceStop >= this.o.shutdownTimeoutMs)
                lease.abort.abort(new Error("shutdown timeout"));
        }
    }
    async sendOutcomes() {
        const t = now();
        const ready = [...this.leases.values()]
            .filter((l) => l.state === "reporting" && l.outcome && l.retryAt <= t)
            .slice(0, MAX_ITEMS);
        if (!ready.length)
            return;
        const results = await this.client.outcomes(ready.map((l) => [l.job.claim, l.outcome]));
        ready.forEach((lease, i) => {
            const result = results[i];
            if (result?.route) {
                this.count(lease, result.route);
                this.done(lease);
            }
            else if (isProblem(result?.error)) {
                this.itemError(lease, result.error, "outcome");
            }
        });
    }
    count(lease, route) {
        if (route.kind === "retry_scheduled")
            this.stats.retried++;
        else if (route.kind === "dead_lettered")
            this.stats.deadLettered++;
        else if (lease.outcome?.kind === "skipped")
            this.stats.skipped++;
        else
            this.stats.settled++;
        this.emit(route.kind, lease.job, { route });
    }
    itemError(lease, error, what) {
        if (error.status === 409)
            return this.lose(lease, error.code);
        this.countError(error.code);
        if (error.class === "backend") {
            lease.retryAt = now() + new Backoff(50, 1_000).next();
            return;
        }
        this.o.logger.error(`settled worker ${this.o.workerId}: ${what} for ${lease.job.receiptId} refused: ${error.status} ${error.code}: ${error.detail}`);
        this.emit("error", lease.job, { code: error.code, during: what });
        lease.abort.abort(new Error(`refused: ${error.code}`));
        this.done(lease);
    }
    async sendReleases() {
        const releasing = [...this.leases.values()].filter((l) => l.state === "releasing");
        let failure;
        // Different claims may go side by side; each claim is sent once.
        for (let i = 0; i < releasing.length; i += 8) {
            await Promise.all(releasing.slice(i, i + 8).map(async (lease) => {
                try {
                    await this.client.release(lease.job.claim);
                }
                catch (e) {
                    if (!(e instanceof ProblemError) || e.retryable) {
                        failure = e;
                        return;
                    }
                    // 409: the lease had ended already; nothing to give back.
                    if (e.status !== 409)
                        this.countError(e.code);
                    this.done(lease);
                    return;
                }
                this.stats.released++;
                this.emit("released", lease.job);
                this.done(lease);
            }));
        }
        if (failure !== undefined)
            throw failure;
    }
    async sendHeartbeats() {
        const t = now();
        const interval = this.o.leaseMs / 3;
        const live = [...this.leases.values()].filter((l) => l.state !== "releasing");
        if (!live.some((l) => t >= l.extendAt))
            return;
        // Leases coming due within half an interval go now too, so that a
        // worker's leases fall into step: one request per interval.
        const due = live.filter((l) => l.extendAt <= t + interval / 2);
        for (let i = 0; i < due.length; i += MAX_ITEMS) {
            const chunk = due.slice(i, i + MAX_ITEMS);
            const sent = now();
            const results = await this.client.extendMany(chunk.map((l) => [l.job.claim, this.o.leaseMs]));
            this.stats.heartbeats++;
            chunk.forEach((lease, j) => {
                const result = results[j];
                if (result?.claim) {
                    lease.job.current = result.claim;
                    lease.deadline = sent + this.o.leaseMs - this.margin;
                    lease.extendAt = sent + interval;
                    this.stats.leasesExtended++;
                }
                else if (isProblem(result?.error)) {
                    if (result.error.status === 409)
                        this.lose(lease, result.error.code);
                    else
                        this.countError(result.error.code);
                }
            });
            this.emit("heartbeat", undefined, { leases: chunk.length });
        }
    }
}
