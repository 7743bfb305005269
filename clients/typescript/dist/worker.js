// The worker runtime: claims, runs a handler per receipt, heartbeats, reports.
//
// It keeps the rules of the server's worker guide (docs/worker-loop.md), so a
// handler only settles one receipt:
// - every claim is sent back exactly, and after a heartbeat the new claim;
// - nothing is committed after the local deadline (the time the claim or the
//   heartbeat was *sent*, plus the lease, minus a margin, on a monotonic clock);
// - every held lease is extended once a third of it has passed, all of them in
//   one POST /v1/leases/extend;
// - a lease's claim is in one request at a time (`sending`): heartbeats, releases
//   and outcome batches go from one loop, one after the other, and an outcome
//   riding in a claim (from the claim loop) is neither heartbeated nor sent again
//   while that claim is out, so a heartbeat and an outcome for the same claim
//   never race;
// - a 409 (or the local deadline) means the lease is lost: the job's
//   AbortSignal fires, job.lost is set, and no outcome is sent for it;
// - 503, 504, 429, 500 internal_error, answers that are not JSON and lost
//   connections back off with jitter; 401, 403 and 422 stop the worker with
//   WorkerStopped;
// - an outcome outside the spec (checked before it is sent) or refused by the
//   server (a 422 for one item) is replaced by onError's outcome, so that the
//   receipt uses up an attempt instead of coming back unreported for ever; if
//   that is refused too, the lease is released;
// - on stop: no more claims, running jobs get shutdownTimeoutMs to finish and
//   are reported, claims not started are released; run() ends within
//   shutdownTimeoutMs whatever the server does;
// - outcomes ride along with the next claim (POST /v1/claims with `outcomes`): a busy
//   worker reports what it finished and asks for more work in one round trip. The commit
//   loop sends them in a POST /v1/outcomes instead (those of jobs that finish together in
//   one) when no claim is about to take them: see sendOutcomes() and LINGER_MS.
//
// No promise of this module is left to reject unobserved: a hook or handler
// that throws, and an answer that cannot be read, are logged and counted.
import { performance } from "node:perf_hooks";
import { Backoff, sleep } from "./client.js";
import { ConnectionFailed, InvalidAnswer, InvalidOutcome, OutcomeRefused, Permanent, ProblemError, Retryable, Skip, WorkerStopped, checkOutcome, } from "./errors.js";
import { loadTracing, startHandlerSpan } from "./tracing.js";
const MAX_ITEMS = 1024;
/** The most a claim answer's `look_again_ms` is trusted for: a day. */
const MAX_LOOK_AGAIN_MS = 86_400_000;
/**
 * How long a stop lets the claim in flight answer before cancelling it: an answer already on
 * its way is taken (and its receipts released); a long poll still waiting is cancelled, which
 * ends it on the server too, before it leases anything.
 */
const CLAIM_GRACE_MS = 200;
/** The whole-batch answers to outcomes that may be one item's fault: then sent one by one. */
const ITEM_FAULTS = new Set([400, 413, 422]);
/**
 * How long an outcome that is ready waits for the next claim to carry it, when a claim is
 * about to be sent; after that the commit loop sends it in a POST /v1/outcomes itself.
 */
const LINGER_MS = 25;
/** Details the runtime writes are cut to this length: outcome batches must stay small. */
const MAX_DETAIL = 1_000;
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
/** Text for logs and details, whatever was thrown. */
function describe(value) {
    try {
        if (value instanceof Error)
            return `${value.name}: ${value.message}`;
        return typeof value === "string" ? value : String(value);
    }
    catch {
        return "(unprintable value)";
    }
}
const cut = (text) => (text.length > MAX_DETAIL ? `${text.slice(0, MAX_DETAIL - 1)}…` : text);
/**
 * The default onError: an unexpected exception is a retryable `rpc` failure (the rail call
 * may pass next time); an outcome the server refused (OutcomeRefused) or one outside the spec
 * (InvalidOutcome) is the worker's own fault, a retryable `backend` failure. Both are retried
 * under the server's retry policy, then dead-lettered, visibly, instead of settled again and
 * again unreported. The server stores only the SHA-256 of `detail` ("Name: message", cut to
 * 1000 characters).
 */
export const defaultErrorOutcome = (error, _job) => {
    let name = typeof error;
    let message;
    try {
        if (error instanceof Error) {
            name = error.name;
            message = error.message;
        }
        else {
            message = String(error);
        }
    }
    catch {
        message = "(unprintable value)";
    }
    const code = error instanceof OutcomeRefused || error instanceof InvalidOutcome ? "backend" : "rpc";
    return { kind: "retryable", code, detail: cut(`${name}: ${message}`) };
};
/**
 * A plain JSON copy of `value` (undefined and null fields dropped), checked against the spec's
 * kinds and closed sets; throws InvalidOutcome otherwise.
 */
function clean(value) {
    let copy;
    try {
        copy = JSON.parse(JSON.stringify(value, (_, v) => (v === null ? undefined : v)) ?? "null");
    }
    catch (e) {
        throw new InvalidOutcome(`an outcome must be plain JSON: ${describe(e)}`);
    }
    checkOutcome(copy);
    return copy;
}
/** Worth sending again while the lease lasts: 503, 504, 429, or a 500 internal_error. */
function isTransient(p) {
    const e = new ProblemError(p.status, String(p.code), String(p.class), String(p.detail));
    return e.retryable || e.internal;
}
/** `work`, or a rejection with the signal's reason once `signal` fires. */
function unlessAborted(work, signal) {
    if (signal.aborted)
        return Promise.reject(signal.reason);
    let cancelled;
    const aborted = new Promise((_, reject) => {
        cancelled = () => reject(signal.reason);
        signal.addEventListener("abort", cancelled, { once: true });
    });
    return Promise.race([work, aborted]).finally(() => signal.removeEventListener("abort", cancelled));
}
function isProblem(value) {
    return typeof value === "object" && value !== null && "status" in value && "code" in value;
}
function isClaim(value) {
    if (typeof value !== "object" || value === null)
        return false;
    const c = value;
    return typeof c.receipt_id === "string" && typeof c.attempts === "number" && typeof c.lease_token === "string";
}
/** The counter an error is counted under. */
function errorCode(e) {
    if (e instanceof ProblemError)
        return e.code;
    if (e instanceof InvalidAnswer)
        return "invalid_answer";
    if (e instanceof ConnectionFailed)
        return "connection";
    return "unexpected";
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
        outcomesRefused: 0,
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
    active = false;
    /** run() has ended: what a claim still brings is released at once. */
    finished = false;
    ended = Promise.resolve();
    inFlight;
    /**
     * What the claim loop does: "ready" (about to claim, or waiting for a free slot),
     * "claiming" (a claim on its way), "pausing" (backing off, or after an empty claim), "done".
     */
    claimPhase = "ready";
    /** When the first outcome the commit loop left for the next claim is its to send. */
    lingerUntil;
    /**
     * Whether claims carry outcomes: no longer once two claims in a row that carried some were
     * refused as a whole (a server older than `outcomes` in claims refuses them all).
     */
    carrying = true;
    carryRefusals = 0;
    log;
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
        if (typeof this.o.handler !== "function")
            throw new TypeError("handler must be a function");
        if (typeof this.o.onError !== "function")
            throw new TypeError("onError must be a function");
        this.margin = this.o.marginMs;
        // A logger that throws must not stop the worker.
        const given = this.o.logger;
        const safe = (write) => (message) => {
            try {
                write?.call(given, message);
            }
            catch {
                // Nothing better to do with it.
            }
        };
        this.log = { info: safe(given.info ?? given.warn), warn: safe(given.warn), error: safe(given.error) };
    }
    /**
     * Stop claiming, let running jobs finish, report them and release the rest; resolves
     * when run() has ended, within shutdownTimeoutMs (at once when not running). A second
     * call stops at once: running jobs are cancelled and their leases released.
     */
    stop() {
        if (!this.stopping.signal.aborted) {
            this.stopping.abort();
        }
        else if (this.active && !this.aborting.signal.aborted) {
            this.log.warn(`settled worker ${this.o.workerId}: second stop, stopping at once`);
            this.aborting.abort();
        }
        this.poke();
        this.slotWaiter?.();
        return this.ended;
    }
    /** Run until stopped. Rejects with WorkerStopped when the server refuses the token or a parameter. */
    async run() {
        if (this.active)
            throw new Error(`settled worker ${this.o.workerId}: already running`);
        this.active = true;
        this.finished = false;
        let endRun;
        this.ended = new Promise((resolve) => (endRun = resolve));
        const timers = [];
        let hardStop;
        const hard = new Promise((resolve) => (hardStop = resolve));
        const onAborting = () => hardStop();
        const onStopping = () => {
            const t = this.o.shutdownTimeoutMs;
            // Running jobs are cancelled early enough to report or release them before the end.
            const reserve = Math.min(1_000, t / 4);
            this.log.info(`settled worker ${this.o.workerId}: stopping: no more claims, ${this.runningCount} running job(s) get up to ` +
                `${Math.round(t - reserve)} ms to finish, leases not started are released (stop again to stop at once)`);
            timers.push(setTimeout(() => this.expire(), Math.max(0, t - reserve)));
            timers.push(setTimeout(hardStop, t));
            this.cancelClaimSoon();
        };
        const onSignal = () => void this.stop();
        if (this.o.handleSignals) {
            process.on("SIGTERM", onSignal);
            process.on("SIGINT", onSignal);
        }
        const external = this.o.signal;
        external?.addEventListener("abort", onSignal);
        this.aborting.signal.addEventListener("abort", onAborting);
        if (this.stopping.signal.aborted)
            onStopping();
        else
            this.stopping.signal.addEventListener("abort", onStopping, { once: true });
        if (external?.aborted)
            void this.stop();
        if (this.aborting.signal.aborted)
            hardStop();
        // Neither loop rejects; the catches are there so that a bug cannot end the process.
        void this.claimLoop().catch((e) => this.log.error(`settled worker: claim loop: ${describe(e)}`));
        const committer = this.commitLoop().catch((e) => this.log.error(`settled worker: lease loop: ${describe(e)}`));
        try {
            await Promise.race([committer, hard]);
        }
        finally {
            if (this.o.handleSignals) {
                process.off("SIGTERM", onSignal);
                process.off("SIGINT", onSignal);
            }
            external?.removeEventListener("abort", onSignal);
            this.stopping.signal.removeEventListener("abort", onStopping);
            this.aborting.signal.removeEventListener("abort", onAborting);
            for (const timer of timers)
                clearTimeout(timer);
            this.finished = true;
            this.stopping.abort();
            this.aborting.abort();
            this.cancelClaimSoon();
            const left = [...this.leases.values()];
            this.leases.clear();
            for (const lease of left)
                lease.abort.abort(new Error("worker stopped"));
            if (left.length)
                void this.drain(left);
            this.poke();
            this.slotWaiter?.();
            // The claim loop ends by itself (a claim still in flight releases what it brings).
            this.active = false;
            endRun();
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
            this.log.error(`settled worker ${this.o.workerId}: onEvent hook threw: ${describe(e)}`);
        }
    }
    countError(code) {
        this.stats.errors[code] = (this.stats.errors[code] ?? 0) + 1;
    }
    error(code, what, error, more = "") {
        this.countError(code);
        this.log.warn(`settled worker ${this.o.workerId}: ${what} failed: ${describe(error)}${more}`);
        this.emit("error", undefined, { code, during: what, error: describe(error) });
    }
    static isFatal(e) {
        return e.status === 400 || e.status === 401 || e.status === 403 || e.status === 422;
    }
    /** 401 / 403 / 422: retrying cannot fix it. */
    fail(what, e) {
        this.countError(e.code);
        const message = `settled worker ${this.o.workerId}: ${what} refused with ${e.status} ${e.code}: ${e.detail}`;
        this.log.error(message);
        this.fatal ??= new WorkerStopped(message, e);
        this.stopping.abort();
        this.aborting.abort();
    }
    /** The shutdown timeout: cancel what still runs; its lease is released. */
    expire() {
        let running = 0;
        for (const lease of this.leases.values()) {
            if (lease.state === "running" || lease.state === "hook") {
                running++;
                lease.abort.abort(new Error("shutdown timeout"));
            }
        }
        if (running) {
            this.log.warn(`settled worker ${this.o.workerId}: shutdown timeout reached with ${running} job(s) running: cancelling them`);
        }
        this.poke();
    }
    // Claims.
    /**
     * Stopping: cancel the claim in flight unless it answers within CLAIM_GRACE_MS; one carrying
     * outcomes gets the shutdown timeout (it does not wait for work, and cut off, its outcomes
     * may be recorded with no answer to say so).
     */
    cancelClaimSoon() {
        const claim = this.inFlight;
        if (!claim || claim.cancel.signal.aborted || claim.timer)
            return;
        const grace = claim.carrying ? this.o.shutdownTimeoutMs : CLAIM_GRACE_MS;
        // After the grace, one more turn of the event loop: an answer already received is read
        // first (the client stops listening to the cancel once its answer arrives).
        claim.timer = setTimeout(() => setImmediate(() => claim.cancel.abort()), grace);
    }
    async claimLoop() {
        const backoff = new Backoff();
        // A server that fails (500) is asked again ever more slowly, never in a tight loop.
        const failing = new Backoff(250, 30_000, 0.5);
        const stopped = this.stopping.signal;
        try {
            while (!stopped.aborted) {
                try {
                    if (await this.claimOnce(backoff, failing))
                        break;
                }
                catch (e) {
                    // A bug of ours: keep claiming rather than stop quietly.
                    this.error("unexpected", "the claim loop", e);
                    await sleep(failing.next(), stopped);
                }
            }
        }
        finally {
            this.claimPhase = "done";
            this.claimingDone = true;
            this.poke();
        }
    }
    /** One turn of the claim loop; true when the loop must end. */
    async claimOnce(backoff, failing) {
        const stopped = this.stopping.signal;
        // A slot is free once its handler returned: the next claim goes out while outcomes
        // are being reported (at most 4 x concurrency wait to be).
        this.claimPhase = "ready";
        let held = 0;
        for (const lease of this.leases.values())
            if (lease.state === "queued" || lease.state === "running")
                held++;
        const reporting = this.leases.size - held;
        if (held >= this.o.concurrency || reporting >= 4 * this.o.concurrency) {
            // No claim is coming: the outcomes left for one go now.
            if (this.lingerUntil !== undefined)
                this.poke();
            await new Promise((resolve) => (this.slotWaiter = resolve));
            this.slotWaiter = undefined;
            // Jobs finishing together free their slots one by one: gather them into one
            // claim instead of a claim per slot.
            if (!stopped.aborted)
                await new Promise((resolve) => setImmediate(resolve));
            return false;
        }
        // Not clamped: a refused batch size stops the worker naming it (422 claim_batch).
        const limit = this.o.batchSize ?? this.o.concurrency - held;
        const sent = now();
        const claim = { sent, cancel: new AbortController() };
        this.inFlight = claim;
        // The outcomes ready ride along: recorded before the claim, in one round trip.
        const carried = this.takeOutcomes();
        claim.carrying = carried.length > 0;
        this.claimPhase = "claiming";
        let answer;
        try {
            // Not cancelled while it may bring work (rule 6): a stop cancels it only if it has not
            // answered within CLAIM_GRACE_MS, that is, when it is a long poll that found nothing.
            answer = await this.client.claim({
                worker_id: this.o.workerId,
                lease_ms: this.o.leaseMs,
                limit,
                // A claim carrying outcomes does not wait for work: their results come back at once
                // (a stop waits for them, no lease waits on them unextended); when it brings
                // nothing, the next claim, without them, is the long poll.
                wait_ms: carried.length ? 0 : this.o.waitMs,
                ...(this.o.groups?.length ? { groups: this.o.groups } : {}),
                ...(carried.length ? { outcomes: carried.map((l) => ({ claim: l.job.claim, outcome: l.outcome })) } : {}),
            }, { signal: claim.cancel.signal });
        }
        catch (e) {
            // The outcomes it carried are no longer on their way: whether they were recorded or
            // not, they are sent again (the commit loop sends them at once, this loop backing off;
            // one already recorded is refused, never recorded twice).
            for (const lease of carried)
                lease.sending = false;
            if (this.finished) {
                // run() has ended meanwhile: report them now, as it reported the others.
                if (carried.length)
                    void this.drain(carried);
            }
            else if (carried.length) {
                if (e instanceof ProblemError && e.internal)
                    for (const lease of carried)
                        lease.internalErrors++;
                this.poke();
            }
            if (claim.cancel.signal.aborted)
                return true;
            if (carried.length && e instanceof ProblemError && ITEM_FAULTS.has(e.status)) {
                // Refused as a whole, maybe for an outcome it carried (too large, not valid JSON): those
                // go in POST /v1/outcomes, which finds the one at fault; the claim is made again without
                // them at once.
                this.log.warn(`settled worker ${this.o.workerId}: a claim carrying ${carried.length} outcomes refused (${e.message}): sending them apart`);
                for (const lease of carried)
                    lease.uncarried = true;
                if (++this.carryRefusals >= 2 && this.carrying) {
                    this.carrying = false;
                    this.log.warn(`settled worker ${this.o.workerId}: claims carrying outcomes were refused twice in a row ` +
                        "(a server older than outcomes in claims?): outcomes go in POST /v1/outcomes from now on");
                }
                return false;
            }
            return this.claimFailed(e, backoff, failing);
        }
        finally {
            if (claim.timer)
                clearTimeout(claim.timer);
            this.inFlight = undefined;
        }
        for (const lease of carried)
            lease.sending = false;
        if (carried.length) {
            this.carryRefusals = 0;
            // The outcomes first, as a POST /v1/outcomes answer: a receipt claimed again in this same
            // answer (a retry due at once) is then a new lease.
            if (this.finished)
                this.drainResults(carried, answer.results);
            else
                this.outcomeResults(carried, answer.results);
        }
        if (isProblem(answer.claim_error)) {
            // The outcomes were recorded, the claim then failed: as a failed claim.
            const p = answer.claim_error;
            const e = new ProblemError(p.status, String(p.code), String(p.class), String(p.detail), p);
            if (this.finished)
                return true;
            return this.claimFailed(e, backoff, failing);
        }
        backoff.reset();
        failing.reset();
        const claims = answer.claims.filter(isClaim);
        if (claims.length < answer.claims.length) {
            this.error("invalid_answer", "claim", `${answer.claims.length - claims.length} claim(s) without a receipt id or token`);
        }
        if (this.finished) {
            // run() has ended while this claim was out: give its receipts back at once.
            this.stats.claimed += claims.length;
            if (claims.length)
                void this.drain(claims.map((c) => this.lease(c, sent)));
            return true;
        }
        const look = answer.look_again_ms;
        this.emit("poll", undefined, { claimed: claims.length, look_again_ms: typeof look === "number" && look > 0 ? look : undefined });
        for (const c of claims)
            this.hold(c, sent);
        if (claims.length) {
            this.startQueued();
            return false;
        }
        const pause = this.pauseAfterEmpty(answer, now() - sent, carried.length === 0);
        if (pause > 0) {
            this.claimPhase = "pausing";
            this.poke();
            await sleep(pause, stopped);
        }
        return false;
    }
    /** A claim refused or failed (its status, or its `claim_error`): back off; true when the loop must end. */
    async claimFailed(e, backoff, failing) {
        if (e instanceof ProblemError && Worker.isFatal(e)) {
            this.fail("claim", e);
            return true;
        }
        const lost = e instanceof InvalidAnswer ? " (receipts it may have leased come back when their leases end)" : "";
        this.error(errorCode(e), "claim", e, lost);
        const quick = e instanceof ConnectionFailed || (e instanceof ProblemError && e.retryable);
        this.claimPhase = "pausing";
        this.poke();
        await sleep(quick ? backoff.next() : failing.next(), this.stopping.signal);
        return false;
    }
    /** The outcomes a claim carries: every one ready (up to 1024), except those sent on their own. */
    takeOutcomes() {
        const t = now();
        const taken = [];
        if (!this.carrying)
            return taken;
        for (const l of this.leases.values()) {
            if (taken.length >= MAX_ITEMS)
                break;
            if (l.state !== "reporting" || !l.outcome || l.sending || l.alone || l.uncarried)
                continue;
            if (l.retryAt > t || t >= l.deadline)
                continue;
            taken.push(l);
        }
        for (const lease of taken)
            lease.sending = true;
        return taken;
    }
    /**
     * Whether the claim loop is about to send a claim (which takes the outcomes ready): not
     * stopping, not backing off or pausing, and a claim on its way (a busy worker's next one
     * follows it at once) or a slot free.
     */
    claimSoon() {
        if (this.stopping.signal.aborted || this.claimingDone)
            return false;
        if (this.claimPhase === "pausing" || this.claimPhase === "done")
            return false;
        if (this.claimPhase === "claiming")
            return true;
        let held = 0;
        for (const lease of this.leases.values())
            if (lease.state === "queued" || lease.state === "running")
                held++;
        return held < this.o.concurrency && this.leases.size - held < 4 * this.o.concurrency;
    }
    /**
     * How long to wait before the next claim after one that brought nothing (`polled`: a long
     * poll, not a claim that carried outcomes, which does not wait: the long poll follows at once).
     */
    pauseAfterEmpty(answer, tookMs, polled = true) {
        // An answer with nothing, well before its wait was over (no long poll, or a server
        // shutting down): a short pause, never a storm.
        let pause = polled && (this.o.waitMs === 0 || tookMs < this.o.waitMs / 2) ? 250 : 0;
        const look = answer.look_again_ms;
        if (typeof look === "number" && Number.isFinite(look) && look > 0) {
            const trusted = Math.min(look, MAX_LOOK_AGAIN_MS);
            // Claiming from one group, nothing more can come before then. From several (or all),
            // another group's work must not wait for one group's rate: the long poll waits.
            pause = this.o.groups?.length === 1 ? trusted : Math.min(trusted, pause);
        }
        return pause;
    }
    lease(claim, sent) {
        return {
            job: new Job(claim),
            deadline: sent + this.o.leaseMs - this.margin,
            extendAt: sent + this.o.leaseMs / 3,
            state: "queued",
            abort: new AbortController(),
            retryAt: 0,
            sending: false,
            tries: 0,
            internalErrors: 0,
            fallback: false,
            alone: false,
            readyAt: 0,
            uncarried: false,
        };
    }
    hold(claim, sent) {
        const lease = this.lease(claim, sent);
        this.leases.set(lease.job.receiptId, lease);
        this.stats.claimed++;
        this.emit("claimed", lease.job);
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
            this.runJob(lease).catch((e) => {
                // Only a bug of ours gets here: give the lease back rather than hold it.
                this.log.error(`settled worker ${this.o.workerId}: job ${lease.job.receiptId} failed: ${describe(e)}`);
                if (lease.state === "running" || lease.state === "hook")
                    lease.state = "releasing";
                this.poke();
            });
        }
    }
    // Jobs.
    async runJob(lease) {
        const job = lease.job;
        const signal = lease.abort.signal;
        let outcome;
        let threw = false;
        let unexpected;
        let invalid;
        let span = null;
        try {
            try {
                // The handler runs in a span continuing the producer's trace (when
                // @opentelemetry/api is installed); tracing never costs a receipt.
                span = startHandlerSpan(await loadTracing(), job.claim);
            }
            catch {
                span = null;
            }
            const handler = this.o.handler;
            const result = await unlessAborted(Promise.resolve().then(() => (span ? span.run(() => handler(job, signal)) : handler(job, signal))), signal);
            outcome = { kind: "accepted", transcript_id: typeof result === "string" && result ? result : job.receiptId };
        }
        catch (e) {
            if (signal.aborted) {
                outcome = undefined;
            }
            else if (e instanceof Retryable) {
                outcome = { kind: "retryable", code: e.code, detail: e.detail, retry_after_ms: e.retryAfterMs, rail_code: e.railCode };
            }
            else if (e instanceof Permanent) {
                outcome = { kind: "permanent", code: e.code, detail: e.detail, rail_code: e.railCode };
            }
            else if (e instanceof Skip) {
                outcome = { kind: "skipped", reason: e.reason };
            }
            else if (e instanceof InvalidOutcome) {
                // Retryable / Permanent / Skip made outside the spec.
                invalid = e;
            }
            else {
                threw = true;
                unexpected = e;
            }
        }
        finally {
            this.runningCount--;
            this.slotWaiter?.();
        }
        if (outcome !== undefined) {
            try {
                // Again: a field may have been changed after it was made.
                outcome = clean(outcome);
            }
            catch (e) {
                outcome = undefined;
                invalid = e instanceof InvalidOutcome ? e : new InvalidOutcome(describe(e));
            }
        }
        try {
            span?.end(outcome?.kind, unexpected ?? invalid);
        }
        catch {
            // As above: tracing never costs a receipt.
        }
        if (invalid !== undefined && !signal.aborted) {
            this.noteRefused(lease, "invalid_outcome", undefined, invalid.message, outcome);
            lease.fallback = true;
            outcome = await this.hookOutcome(lease, invalid);
        }
        else if (threw && !signal.aborted) {
            this.log.warn(`settled worker ${this.o.workerId}: handler threw on ${job.receiptId}: ${describe(unexpected)}`);
            outcome = await this.hookOutcome(lease, unexpected);
        }
        if (job.lost || this.leases.get(job.receiptId) !== lease)
            return;
        if (outcome) {
            lease.outcome = outcome;
            lease.state = "reporting";
            lease.readyAt = now();
        }
        else {
            // Cancelled by the shutdown timeout: give the lease back.
            lease.state = "releasing";
        }
        this.poke();
        this.startQueued();
    }
    /**
     * onError's outcome for `error`, or the default one when the hook throws, rejects or gives
     * no valid outcome; undefined when the lease was lost or cancelled meanwhile.
     */
    async hookOutcome(lease, error) {
        const job = lease.job;
        const signal = lease.abort.signal;
        const onError = this.o.onError;
        let outcome;
        try {
            const value = await unlessAborted(Promise.resolve().then(() => onError(error, job)), signal);
            if (value === undefined || value === null)
                throw new InvalidOutcome("onError returned no outcome");
            outcome = clean(value);
        }
        catch (e) {
            if (signal.aborted)
                return undefined;
            this.countError("on_error");
            this.log.error(`settled worker ${this.o.workerId}: onError failed on ${job.receiptId} (${describe(e)}): reporting the default outcome`);
            this.emit("error", job, { code: "on_error", during: "on_error", error: describe(e) });
            return clean(defaultErrorOutcome(error, job));
        }
        return signal.aborted ? undefined : outcome;
    }
    lose(lease, reason) {
        const job = lease.job;
        if (this.leases.get(job.receiptId) !== lease)
            return;
        this.leases.delete(job.receiptId);
        job.lost = true;
        job.lostReason = reason;
        this.stats.leasesLost++;
        this.log.warn(`settled worker ${this.o.workerId}: lease lost on ${job.receiptId} (${reason})`);
        this.emit("lease_lost", job, { reason });
        lease.abort.abort(new Error(`lease lost: ${reason}`));
        this.slotWaiter?.();
    }
    done(lease) {
        if (this.leases.get(lease.job.receiptId) === lease)
            this.leases.delete(lease.job.receiptId);
        this.slotWaiter?.();
    }
    // Heartbeats, releases and outcome batches: this one loop (a claim carries outcomes too).
    async commitLoop() {
        const tick = Math.max(10, Math.min(250, this.o.leaseMs / 12));
        const backoff = new Backoff(100, 5_000, 0.5);
        const steps = [
            ["outcomes", () => this.sendOutcomes()],
            ["release", () => this.sendReleases()],
            ["heartbeat", () => this.sendHeartbeats()],
        ];
        for (;;) {
            this.wakeSet = false;
            let ok = true;
            try {
                const t = now();
                // An outcome riding in a claim was sent before its deadline: its answer decides.
                for (const lease of [...this.leases.values()]) {
                    if (t >= lease.deadline && !lease.sending)
                        this.lose(lease, "local deadline passed");
                }
                if (this.stopping.signal.aborted) {
                    for (const lease of this.leases.values())
                        if (lease.state === "queued")
                            lease.state = "releasing";
                }
                // Each step on its own: outcomes that keep failing must not hold heartbeats back.
                for (const [what, step] of steps) {
                    try {
                        await step();
                    }
                    catch (e) {
                        if (e instanceof ProblemError && Worker.isFatal(e)) {
                            this.fail(what === "heartbeat" ? "a heartbeat" : `a ${what} request`, e);
                            return;
                        }
                        this.error(errorCode(e), what === "heartbeat" ? "a heartbeat" : `a ${what} request`, e);
                        ok = false;
                    }
                    if (this.aborting.signal.aborted)
                        return;
                }
            }
            catch (e) {
                this.error("unexpected", "the lease loop", e);
                ok = false;
            }
            if (ok)
                backoff.reset();
            if (this.aborting.signal.aborted)
                return;
            if (this.stopping.signal.aborted && this.claimingDone && this.leases.size === 0)
                return;
            let wait = ok ? tick : Math.min(backoff.next(), tick * 4);
            // Wake for the first local deadline (a lost lease's job is aborted at once), and when an
            // outcome left for the next claim has waited long enough.
            let first = this.lingerUntil ?? Infinity;
            for (const lease of this.leases.values())
                if (!lease.sending)
                    first = Math.min(first, lease.deadline);
            if (first < Infinity)
                wait = Math.min(wait, Math.max(0, first - now()) + 1);
            // Backing off: finished jobs do not wake it, only the wait's end.
            if (!ok)
                await sleep(wait, this.aborting.signal);
            else
                await this.wait(wait);
        }
    }
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
    async sendOutcomes() {
        const t = now();
        const soon = this.carrying && this.claimSoon();
        this.lingerUntil = undefined;
        const ready = [];
        for (const l of this.leases.values()) {
            if (l.state !== "reporting" || !l.outcome || l.retryAt > t || l.sending)
                continue;
            const due = Math.max(l.readyAt, l.retryAt) + LINGER_MS;
            if (soon && !l.alone && !l.uncarried && t < due) {
                this.lingerUntil = Math.min(this.lingerUntil ?? Infinity, due);
                continue;
            }
            ready.push(l);
        }
        const together = ready.filter((l) => !l.alone).slice(0, MAX_ITEMS);
        if (together.length)
            await this.sendBatch(together);
        for (const lease of ready) {
            if (lease.alone && this.leases.get(lease.job.receiptId) === lease && lease.state === "reporting" && !lease.sending) {
                await this.sendBatch([lease]);
            }
        }
    }
    async sendBatch(batch) {
        let results;
        for (const lease of batch)
            lease.sending = true;
        try {
            results = await this.client.outcomes(batch.map((l) => [l.job.claim, l.outcome]));
        }
        catch (e) {
            if (!(e instanceof ProblemError) || !ITEM_FAULTS.has(e.status)) {
                if (e instanceof ProblemError && e.internal)
                    for (const lease of batch)
                        lease.internalErrors++;
                throw e;
            }
            if (batch.length > 1) {
                // Refused as a whole, maybe for one item (too large, not valid JSON): one by one.
                this.log.warn(`settled worker ${this.o.workerId}: ${batch.length} outcomes refused together (${e.message}): sending them one by one`);
                for (const lease of batch)
                    lease.alone = true;
                this.poke();
                return;
            }
            this.refuse(batch[0], e);
            return;
        }
        finally {
            for (const lease of batch)
                lease.sending = false;
        }
        this.outcomeResults(batch, results);
    }
    /** The `results` of a POST /v1/outcomes, or of a claim that carried outcomes. */
    outcomeResults(batch, results) {
        if (!Array.isArray(results) || results.length !== batch.length) {
            // An answer we cannot read: each outcome is sent again while its lease lasts.
            this.error("invalid_answer", "outcome", `not ${batch.length} outcome results: ${describe(JSON.stringify(results)).slice(0, 80)}`);
            for (const lease of batch)
                this.retryLater(lease);
            return;
        }
        batch.forEach((lease, i) => {
            const result = results[i];
            if (result?.route && typeof result.route === "object") {
                this.count(lease, result.route);
                this.done(lease);
            }
            else if (isProblem(result?.error)) {
                this.itemError(lease, result.error);
            }
            else {
                // Neither: an answer we cannot read; sent again while the lease lasts.
                this.error("invalid_answer", "outcome", `not an outcome result: ${describe(JSON.stringify(result)).slice(0, 80)}`);
                this.retryLater(lease);
            }
        });
    }
    retryLater(lease) {
        lease.tries++;
        lease.retryAt = now() + Math.min(2_000, 50 * 2 ** lease.tries) * (0.5 + 0.5 * Math.random());
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
    itemError(lease, error) {
        if (error.status === 409)
            return this.lose(lease, String(error.code));
        if (isTransient(error)) {
            // Not recorded this time: sent again while the lease lasts.
            this.countError(String(error.code));
            if (error.status === 500)
                lease.internalErrors++;
            this.retryLater(lease);
            return;
        }
        this.refuse(lease, error);
    }
    /** Count, log (once) and tell onEvent about an outcome refused or outside the spec. */
    noteRefused(lease, code, status, detail, outcome) {
        const job = lease.job;
        const then = lease.fallback ? "releasing the lease" : "reporting onError's outcome instead";
        this.stats.outcomesRefused++;
        this.countError(code);
        this.log.error(`settled worker ${this.o.workerId}: outcome for ${job.receiptId} refused (${status ? `${status} ` : ""}${code}: ${detail}): ${then}`);
        const kind = typeof outcome === "object" && outcome !== null ? outcome.kind : undefined;
        this.emit("outcome_refused", job, { code, status, detail, outcome, kind, fallback: !lease.fallback });
    }
    /**
     * The server refused this lease's outcome: report onError's instead; if that is refused
     * too, release the lease. Never drop it: a receipt left to expire unreported comes back
     * with no attempt counted, and would be settled again and again.
     */
    refuse(lease, problem) {
        const refused = lease.outcome;
        const p = { status: problem.status, code: String(problem.code), class: String(problem.class), detail: String(problem.detail) };
        this.noteRefused(lease, p.code, p.status, p.detail, refused);
        lease.outcome = undefined;
        lease.retryAt = 0;
        if (lease.fallback) {
            lease.state = "releasing";
            this.poke();
            return;
        }
        lease.fallback = true;
        lease.alone = false;
        // onError may take a while: it runs beside this loop, the lease extended meanwhile.
        lease.state = "hook";
        void this.hookOutcome(lease, new OutcomeRefused(p, refused)).then((outcome) => this.hookDone(lease, outcome), () => this.hookDone(lease, undefined));
    }
    hookDone(lease, outcome) {
        if (lease.job.lost || this.leases.get(lease.job.receiptId) !== lease || lease.state !== "hook")
            return;
        if (outcome) {
            lease.outcome = outcome;
            lease.state = "reporting";
            lease.readyAt = now();
        }
        else {
            lease.state = "releasing";
        }
        this.poke();
    }
    async sendReleases() {
        const releasing = [...this.leases.values()].filter((l) => l.state === "releasing" && !l.sending);
        let failure;
        // Different claims may go side by side; each claim is sent once.
        for (let i = 0; i < releasing.length; i += 8) {
            await Promise.all(releasing.slice(i, i + 8).map(async (lease) => {
                lease.sending = true;
                try {
                    await this.release(lease);
                }
                catch (e) {
                    failure = e;
                }
                finally {
                    lease.sending = false;
                }
            }));
        }
        if (failure !== undefined)
            throw failure;
    }
    /** Release one lease; throws only what is worth trying again (while the lease lasts). */
    async release(lease) {
        try {
            await this.client.release(lease.job.claim);
        }
        catch (e) {
            if (!(e instanceof ProblemError) || e.retryable || e.internal)
                throw e;
            // 409: the lease had ended already; nothing to give back.
            if (e.status !== 409) {
                this.countError(e.code);
                this.log.error(`settled worker ${this.o.workerId}: release of ${lease.job.receiptId} refused: ${e.status} ${e.code}: ${e.detail}; ` +
                    `it comes back when its lease ends`);
                this.emit("error", lease.job, { code: e.code, during: "release", error: describe(e) });
            }
            this.done(lease);
            return;
        }
        this.stats.released++;
        this.emit("released", lease.job);
        this.done(lease);
    }
    async sendHeartbeats() {
        const t = now();
        const interval = this.o.leaseMs / 3;
        // An outcome the server failed on (500) is sent again while its lease lasts, not longer.
        // An outcome riding in a claim is not extended meanwhile: the claim it sent is the one the
        // outcome names.
        const live = [...this.leases.values()].filter((l) => l.state !== "releasing" && !l.sending && !(l.state === "reporting" && l.internalErrors > 0));
        if (!live.some((l) => t >= l.extendAt))
            return;
        // Leases coming due within half an interval go now too, so that a
        // worker's leases fall into step: one request per interval.
        const due = live.filter((l) => l.extendAt <= t + interval / 2);
        for (let i = 0; i < due.length; i += MAX_ITEMS) {
            const chunk = due.slice(i, i + MAX_ITEMS);
            const sent = now();
            for (const lease of chunk)
                lease.sending = true;
            let results;
            try {
                results = await this.client.extendMany(chunk.map((l) => [l.job.claim, this.o.leaseMs]));
            }
            finally {
                for (const lease of chunk)
                    lease.sending = false;
            }
            this.stats.heartbeats++;
            chunk.forEach((lease, j) => {
                const result = results[j];
                if (isClaim(result?.claim)) {
                    lease.job.current = result.claim;
                    lease.deadline = sent + this.o.leaseMs - this.margin;
                    lease.extendAt = sent + interval;
                    this.stats.leasesExtended++;
                }
                else if (isProblem(result?.error) && result.error.status === 409) {
                    this.lose(lease, String(result.error.code));
                }
                else {
                    // Not extended this time (a 503, a 500): tried again soon, while the lease lasts.
                    this.countError(isProblem(result?.error) ? String(result.error.code) : "invalid_answer");
                    lease.extendAt = sent + Math.min(1_000, interval / 4);
                }
            });
            this.emit("heartbeat", undefined, { leases: chunk.length });
        }
    }
    /**
     * After run() has ended: report the outcomes ready and release every other lease, once
     * each, in the background; what fails comes back when its lease ends. Never rejects.
     */
    async drain(leases) {
        try {
            await this.drainOnce(leases);
        }
        catch (e) {
            this.log.error(`settled worker ${this.o.workerId}: final reports: ${describe(e)}`);
        }
    }
    async drainOnce(leases) {
        const idle = leases.filter((l) => !l.sending && !l.job.lost);
        if (!idle.length)
            return;
        this.log.warn(`settled worker ${this.o.workerId}: stopped holding ${idle.length} lease(s): reporting or releasing them now`);
        const reports = idle.filter((l) => l.state === "reporting" && l.outcome);
        const releases = idle.filter((l) => !reports.includes(l));
        const tasks = [];
        for (let i = 0; i < reports.length; i += MAX_ITEMS) {
            const chunk = reports.slice(i, i + MAX_ITEMS);
            tasks.push(this.client
                .outcomes(chunk.map((l) => [l.job.claim, l.outcome]))
                .then((results) => this.drainResults(chunk, results)));
        }
        for (const lease of releases)
            tasks.push(this.release(lease));
        for (const result of await Promise.allSettled(tasks)) {
            if (result.status === "rejected")
                this.error(errorCode(result.reason), "a final request", result.reason);
        }
    }
    /** After run() has ended: count the results of outcomes reported, once each. */
    drainResults(leases, results) {
        leases.forEach((lease, j) => {
            const result = Array.isArray(results) ? results[j] : undefined;
            if (result?.route && typeof result.route === "object")
                this.count(lease, result.route);
            else
                this.countError(isProblem(result?.error) ? String(result.error.code) : "invalid_answer");
        });
    }
}
