package dev.settled;

import com.fasterxml.jackson.databind.JsonNode;
import java.lang.System.Logger.Level;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The worker runtime: claims, runs a handler per receipt, heartbeats, reports. It keeps the
 * rules of docs/worker-loop.md, so a handler only settles one receipt:
 * <ul>
 * <li>every claim is sent back exactly, and after a heartbeat the new claim;
 * <li>nothing is committed after the local deadline (the time the claim or heartbeat was
 *     <em>sent</em>, plus the lease, minus a margin, on the monotonic clock);
 * <li>every held lease is extended once a third of it has passed, all in one
 *     POST /v1/leases/extend;
 * <li>requests that carry claims are sent by one thread (the one in {@link #run()}), so a
 *     heartbeat and an outcome for the same claim never race;
 * <li>a 409 or the local deadline means the lease is lost: the handler's thread is
 *     interrupted, {@link Job#isCancelled()} turns true, and no outcome is sent;
 * <li>503, 504, 429, 500 internal_error, answers that are not JSON and lost connections back
 *     off with jitter; 400, 401, 403 and 422 stop the worker with {@link WorkerStoppedException};
 * <li>an outcome refused by the server (a 422 for one item) is replaced by onError's outcome;
 *     if that is refused too, the lease is released;
 * <li>on stop: no more claims, running jobs get the shutdown timeout to finish and are
 *     reported, claims not started are released.
 * </ul>
 */
public final class Worker {
    /** Settles one receipt: returns the transcript id (null: the receipt id), or throws Retryable, Permanent or Skip. */
    @FunctionalInterface
    public interface Handler {
        String handle(Job job) throws Exception;
    }

    /** The outcome for an unexpected exception, or for an outcome the server refused (OutcomeRefusedException). */
    @FunctionalInterface
    public interface OnError {
        Outcome apply(Throwable error, Job job) throws Exception;
    }

    /** Told about each event; what it throws is logged and ignored. */
    @FunctionalInterface
    public interface Listener {
        void onEvent(Event event, Job job, Map<String, Object> info);
    }

    public enum Event {
        CLAIMED, POLL, NO_ACTION, RETRY_SCHEDULED, DEAD_LETTERED, RELEASED, LEASE_LOST, OUTCOME_REFUSED, HEARTBEAT, ERROR;

        public String wire() { return name().toLowerCase(); }
    }

    /** The counters, at one instant. */
    public record Stats(long claimed, long settled, long retried, long deadLettered, long skipped, long released,
                        long leasesLost, long outcomesRefused, long heartbeats, long leasesExtended, Map<String, Long> errors) {}

    static final int MAX_ITEMS = 1024;
    static final long MAX_LOOK_AGAIN_MS = 86_400_000;
    /** How long a stop lets the claim in flight answer before cancelling it (rule 6). */
    static final long CLAIM_GRACE_MS = 200;
    static final int MAX_DETAIL = 1000;

    private enum State { QUEUED, RUNNING, HOOK, REPORTING, RELEASING }

    private static final class Lease {
        final Job job;
        long deadline;
        long extendAt;
        State state = State.QUEUED;
        Outcome outcome;
        long retryAt;
        boolean sending;
        int tries;
        int internalErrors;
        boolean fallback;
        boolean alone;
        Thread runner;

        Lease(Job job, long sent, long leaseMs, long margin) {
            this.job = job;
            this.deadline = sent + leaseMs - margin;
            this.extendAt = sent + leaseMs / 3;
        }
    }

    private final Client client;
    private final String workerId;
    private final Handler handler;
    private final int concurrency;
    private final long leaseMs;
    private final List<String> groups;
    private final Integer batchSize;
    private final long waitMs;
    private final long shutdownTimeoutMs;
    private final long margin;
    private final boolean handleSignals;
    private final OnError onError;
    private final Listener listener;
    private final System.Logger log;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();
    private final Map<String, Lease> leases = new LinkedHashMap<>();
    private int running;
    private boolean stopping;
    private boolean aborting;
    private boolean active;
    private boolean finished;
    private boolean claimingDone;
    private boolean wake;
    private long expireAt = Long.MAX_VALUE;
    private long hardAt = Long.MAX_VALUE;
    private boolean expired;
    private WorkerStoppedException fatal;
    private CompletableFuture<Types.ClaimsOut> inFlight;
    private CompletableFuture<Void> ended = CompletableFuture.completedFuture(null);

    private long claimed, settled, retried, deadLettered, skipped, released, leasesLost, outcomesRefused, heartbeats, leasesExtended;
    private final Map<String, Long> errors = new TreeMap<>();

    private ExecutorService handlers;
    private ExecutorService hooks;
    private ScheduledExecutorService timer;

    private Worker(Builder b) {
        this.client = Objects.requireNonNull(b.client, "client");
        this.workerId = Objects.requireNonNull(b.workerId, "workerId");
        this.handler = Objects.requireNonNull(b.handler, "handler");
        this.onError = Objects.requireNonNull(b.onError, "onError");
        if (b.concurrency < 1) throw new IllegalArgumentException("concurrency must be at least 1");
        this.concurrency = b.concurrency;
        this.leaseMs = b.leaseMs;
        this.groups = b.groups == null ? null : List.copyOf(b.groups);
        this.batchSize = b.batchSize;
        this.waitMs = b.waitMs;
        this.shutdownTimeoutMs = b.shutdownTimeoutMs;
        this.margin = b.marginMs != null ? b.marginMs : Math.min(1000, leaseMs / 10);
        this.handleSignals = b.handleSignals;
        this.listener = b.listener;
        this.log = b.logger != null ? b.logger : System.getLogger(Worker.class.getName());
    }

    public static Builder builder(Client client) {
        return new Builder(client);
    }

    public static final class Builder {
        private final Client client;
        private String workerId;
        private Handler handler;
        private int concurrency = 8;
        private long leaseMs = 30_000;
        private List<String> groups;
        private Integer batchSize;
        private long waitMs = 5_000;
        private long shutdownTimeoutMs = 30_000;
        private Long marginMs;
        private boolean handleSignals;
        private OnError onError = Worker::defaultErrorOutcome;
        private Listener listener;
        private System.Logger logger;

        private Builder(Client client) { this.client = client; }

        /** The lease owner's name, 1..=128 bytes. */
        public Builder workerId(String id) { this.workerId = id; return this; }
        public Builder handler(Handler h) { this.handler = h; return this; }
        /** Jobs run at once. Default 8. */
        public Builder concurrency(int n) { this.concurrency = n; return this; }
        /** Lease length in ms. Default 30 000. */
        public Builder leaseMs(long ms) { this.leaseMs = ms; return this; }
        /** Claim only from these groups. */
        public Builder groups(List<String> groups) { this.groups = groups; return this; }
        /** Receipts per claim (default: the free slots); more than concurrency queues them. */
        public Builder batchSize(int n) { this.batchSize = n; return this; }
        /** Long poll per claim, ms (at most 20 000). Default 5 000. */
        public Builder waitMs(long ms) { this.waitMs = ms; return this; }
        /** The most a stop takes, ms. Default 30 000. */
        public Builder shutdownTimeoutMs(long ms) { this.shutdownTimeoutMs = ms; return this; }
        /** Safety margin before the local deadline, ms. Default min(1000, leaseMs / 10). */
        public Builder marginMs(long ms) { this.marginMs = ms; return this; }
        /** Stop on SIGTERM / SIGINT (a second one stops at once), and on JVM shutdown. */
        public Builder handleSignals(boolean on) { this.handleSignals = on; return this; }
        public Builder onError(OnError hook) { this.onError = hook; return this; }
        public Builder listener(Listener l) { this.listener = l; return this; }
        /** Where stops, lost leases, refusals and errors are logged. Default: System.getLogger("dev.settled.Worker"). */
        public Builder logger(System.Logger logger) { this.logger = logger; return this; }
        public Worker build() { return new Worker(this); }
    }

    /**
     * The default onError: an unexpected exception is a retryable rpc failure; an outcome the
     * server refused or one outside the spec is the worker's own fault, a retryable backend
     * failure. The server stores only the SHA-256 of the detail.
     */
    public static Outcome defaultErrorOutcome(Throwable error, Job job) {
        boolean ours = error instanceof OutcomeRefusedException || error instanceof InvalidOutcomeException;
        return Outcome.retryable(ours ? FailureCode.BACKEND : FailureCode.RPC, cut(describe(error)), null, null);
    }

    static String describe(Throwable e) {
        try {
            return e == null ? "null" : e.getClass().getSimpleName() + ": " + e.getMessage();
        } catch (RuntimeException ignored) {
            return "(unprintable)";
        }
    }

    static String cut(String s) {
        return s.length() > MAX_DETAIL ? s.substring(0, MAX_DETAIL - 1) + "…" : s;
    }

    private static long now() {
        return System.nanoTime() / 1_000_000;
    }

    // -------------------------------------------------------------------------------------------
    // Counters, events, logs

    public Stats stats() {
        lock.lock();
        try {
            return new Stats(claimed, settled, retried, deadLettered, skipped, released, leasesLost, outcomesRefused,
                    heartbeats, leasesExtended, Collections.unmodifiableMap(new TreeMap<>(errors)));
        } finally {
            lock.unlock();
        }
    }

    private void countError(String code) {
        lock.lock();
        try {
            errors.merge(code, 1L, Long::sum);
        } finally {
            lock.unlock();
        }
    }

    private void emit(Event event, Job job, Map<String, Object> info) {
        if (listener == null) return;
        try {
            listener.onEvent(event, job, info == null ? Map.of() : info);
        } catch (Throwable e) {
            say(Level.ERROR, "listener threw: " + describe(e));
        }
    }

    private void say(Level level, String message) {
        try {
            log.log(level, "settled worker " + workerId + ": " + message);
        } catch (Throwable ignored) {
            // A logger that throws must not stop the worker.
        }
    }

    private static String errorCode(Throwable e) {
        if (e instanceof ProblemException p) return p.rawCode();
        if (e instanceof InvalidAnswerException) return "invalid_answer";
        if (e instanceof ConnectionFailedException) return "connection";
        return "unexpected";
    }

    private void error(String code, String what, Throwable e, String more) {
        countError(code);
        say(Level.WARNING, what + " failed: " + describe(e) + more);
        emit(Event.ERROR, null, Map.of("code", code, "during", what, "error", describe(e)));
    }

    private static boolean isFatal(ProblemException e) {
        int s = e.status();
        return s == 400 || s == 401 || s == 403 || s == 422;
    }

    /** 400 / 401 / 403 / 422: retrying cannot fix it. */
    private void fail(String what, ProblemException e) {
        countError(e.rawCode());
        String message = "settled worker " + workerId + ": " + what + " refused with " + e.status() + " " + e.rawCode() + ": " + e.detail();
        say(Level.ERROR, what + " refused with " + e.status() + " " + e.rawCode() + ": " + e.detail());
        lock.lock();
        try {
            if (fatal == null) fatal = new WorkerStoppedException(message, e);
            stopping = true;
            aborting = true;
            if (inFlight != null) inFlight.cancel(true);
            poke();
        } finally {
            lock.unlock();
        }
    }

    /** Under the lock: wake the lease loop and whoever waits for a slot. */
    private void poke() {
        wake = true;
        changed.signalAll();
    }

    // -------------------------------------------------------------------------------------------
    // Running and stopping

    /**
     * Stop claiming, let running jobs finish within the shutdown timeout, report them and release
     * the rest. A second call stops at once. Returns a future that completes when run() ends.
     */
    public CompletableFuture<Void> stop() {
        lock.lock();
        try {
            if (!stopping) {
                beginStop();
            } else if (active && !aborting) {
                say(Level.WARNING, "second stop, stopping at once");
                aborting = true;
                expire();
            }
            poke();
            return ended;
        } finally {
            lock.unlock();
        }
    }

    /** Under the lock. */
    private void beginStop() {
        stopping = true;
        if (!active) return;
        long t = now();
        long reserve = Math.min(1000, shutdownTimeoutMs / 4);
        expireAt = t + shutdownTimeoutMs - reserve;
        hardAt = t + shutdownTimeoutMs;
        say(Level.INFO, "stopping: no more claims, " + running + " running job(s) get up to " + (shutdownTimeoutMs - reserve)
                + " ms to finish, leases not started are released");
        CompletableFuture<Types.ClaimsOut> claim = inFlight;
        if (claim != null && timer != null) {
            // An answer already on its way is taken (its receipts released); a long poll still
            // waiting is cancelled, which ends it on the server before it leases anything.
            timer.schedule(() -> claim.cancel(true), CLAIM_GRACE_MS, TimeUnit.MILLISECONDS);
        }
    }

    /** Run until stopped, on this thread (which sends every request carrying a claim). */
    public void run() {
        Thread claimThread;
        Object signals = null;
        Thread hook = null;
        lock.lock();
        try {
            if (active) throw new IllegalStateException("settled worker " + workerId + ": already running");
            active = true;
            finished = false;
            claimingDone = false;
            ended = new CompletableFuture<>();
            handlers = Executors.newFixedThreadPool(concurrency, daemon("settled-handler"));
            hooks = Executors.newCachedThreadPool(daemon("settled-on-error"));
            timer = Executors.newSingleThreadScheduledExecutor(daemon("settled-timer"));
            if (stopping) {
                stopping = false;
                beginStop();
            }
        } finally {
            lock.unlock();
        }
        if (handleSignals) {
            signals = Signals.install(this::stop);
            hook = new Thread(() -> {
                try {
                    stop().get(shutdownTimeoutMs + 2000, TimeUnit.MILLISECONDS);
                } catch (Exception ignored) {
                    // The JVM is going anyway.
                }
            }, "settled-shutdown");
            try {
                Runtime.getRuntime().addShutdownHook(hook);
            } catch (IllegalStateException alreadyShuttingDown) {
                hook = null;
            }
        }
        claimThread = new Thread(this::claimLoop, "settled-claims");
        claimThread.setDaemon(true);
        claimThread.start();
        List<Lease> left = new ArrayList<>();
        try {
            commitLoop();
        } finally {
            lock.lock();
            try {
                finished = true;
                stopping = true;
                aborting = true;
                if (inFlight != null) timer.schedule(() -> cancelInFlight(), CLAIM_GRACE_MS, TimeUnit.MILLISECONDS);
                left.addAll(leases.values());
                leases.clear();
                for (Lease l : left) cancelJob(l, "worker stopped", false);
                poke();
            } finally {
                lock.unlock();
            }
            drain(left);
            try {
                claimThread.join(CLAIM_GRACE_MS + 2000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            handlers.shutdownNow();
            hooks.shutdownNow();
            timer.shutdownNow();
            if (signals != null) Signals.restore(signals);
            if (hook != null) {
                try {
                    Runtime.getRuntime().removeShutdownHook(hook);
                } catch (IllegalStateException ignored) {
                    // Shutting down: the hook is running.
                }
            }
            lock.lock();
            try {
                active = false;
            } finally {
                lock.unlock();
            }
            ended.complete(null);
        }
        if (fatal != null) throw fatal;
    }

    private void cancelInFlight() {
        lock.lock();
        try {
            if (inFlight != null) inFlight.cancel(true);
        } finally {
            lock.unlock();
        }
    }

    private static ThreadFactory daemon(String name) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, name + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }

    /** Under the lock: the shutdown timeout, cancel what still runs; its lease is released. */
    private void expire() {
        expired = true;
        int n = 0;
        for (Lease l : leases.values()) {
            if (l.state == State.RUNNING || l.state == State.HOOK) {
                n++;
                cancelJob(l, "shutdown timeout", false);
            }
        }
        if (n > 0) say(Level.WARNING, "shutdown timeout reached with " + n + " job(s) running: cancelling them");
    }

    /** Under the lock. */
    private void cancelJob(Lease l, String reason, boolean lost) {
        l.job.cancel(reason, lost);
        if (l.runner != null) l.runner.interrupt();
    }

    // -------------------------------------------------------------------------------------------
    // The lease loop: everything that carries a claim goes through it.

    private void commitLoop() {
        long tick = Math.max(10, Math.min(250, leaseMs / 12));
        Backoff backoff = new Backoff(100, 5000, 0.5);
        boolean interrupted = false;
        while (true) {
            boolean ok = true;
            lock.lock();
            try {
                wake = false;
                long t = now();
                for (Lease l : new ArrayList<>(leases.values())) if (t >= l.deadline) lose(l, "local deadline passed");
                if (stopping) {
                    for (Lease l : leases.values()) if (l.state == State.QUEUED) l.state = State.RELEASING;
                    if (!expired && t >= expireAt) expire();
                    if (t >= hardAt) {
                        say(Level.WARNING, "shutdown timeout reached: stopping with " + leases.size() + " lease(s) held");
                        return;
                    }
                }
                if (aborting) return;
            } finally {
                lock.unlock();
            }
            for (String step : new String[] {"outcomes", "release", "heartbeat"}) {
                String what = step.equals("heartbeat") ? "a heartbeat" : "a " + step + " request";
                try {
                    switch (step) {
                        case "outcomes" -> sendOutcomes();
                        case "release" -> sendReleases();
                        default -> sendHeartbeats();
                    }
                } catch (ProblemException e) {
                    if (isFatal(e)) {
                        fail(what, e);
                        return;
                    }
                    error(errorCode(e), what, e, "");
                    ok = false;
                } catch (RuntimeException e) {
                    error(errorCode(e), what, e, "");
                    ok = false;
                }
            }
            if (ok) backoff.reset();
            lock.lock();
            try {
                if (aborting) return;
                if (stopping && claimingDone && leases.isEmpty()) return;
                long wait = ok ? tick : Math.min(backoff.next(), tick * 4);
                long t = now();
                for (Lease l : leases.values()) wait = Math.min(wait, Math.max(0, l.deadline - t) + 1);
                if (stopping) wait = Math.min(wait, Math.max(1, Math.min(expired ? hardAt : expireAt, hardAt) - t));
                // Backing off, finished jobs do not wake it: only the wait's end.
                long until = t + wait;
                while (!(ok && wake) && !aborting) {
                    long left = until - now();
                    if (left <= 0) break;
                    try {
                        changed.await(left, TimeUnit.MILLISECONDS);
                    } catch (InterruptedException e) {
                        // An interrupt stops the worker like stop(); a second one at once.
                        if (!stopping) {
                            beginStop();
                        } else if (!aborting && !interrupted) {
                            aborting = true;
                            expire();
                        }
                        interrupted = stopping;
                    }
                    if (stopping && !ok) break;
                }
            } finally {
                lock.unlock();
            }
        }
    }

    /** Under the lock. */
    private void lose(Lease l, String reason) {
        if (leases.get(l.job.receiptId()) != l) return;
        leases.remove(l.job.receiptId());
        leasesLost++;
        cancelJob(l, "lease lost: " + reason, true);
        say(Level.WARNING, "lease lost on " + l.job.receiptId() + " (" + reason + ")");
        emit(Event.LEASE_LOST, l.job, Map.of("reason", reason));
        poke();
    }

    /** Under the lock. */
    private void done(Lease l) {
        if (leases.get(l.job.receiptId()) == l) leases.remove(l.job.receiptId());
        poke();
    }

    private void sendOutcomes() {
        List<Lease> together = new ArrayList<>();
        List<Lease> alone = new ArrayList<>();
        lock.lock();
        try {
            long t = now();
            for (Lease l : leases.values()) {
                if (l.state != State.REPORTING || l.outcome == null || l.retryAt > t || l.sending) continue;
                if (l.alone) alone.add(l);
                else if (together.size() < MAX_ITEMS) together.add(l);
            }
        } finally {
            lock.unlock();
        }
        if (!together.isEmpty()) sendBatch(together);
        for (Lease l : alone) {
            lock.lock();
            boolean still;
            try {
                still = leases.get(l.job.receiptId()) == l && l.state == State.REPORTING && l.outcome != null;
            } finally {
                lock.unlock();
            }
            if (still) sendBatch(List.of(l));
        }
    }

    private void sendBatch(List<Lease> batch) {
        List<Types.OutcomeRequest> items = new ArrayList<>();
        lock.lock();
        try {
            for (Lease l : batch) {
                l.sending = true;
                items.add(new Types.OutcomeRequest(l.job.claim(), l.outcome));
            }
        } finally {
            lock.unlock();
        }
        List<Types.OutcomeResult> results;
        try {
            results = client.outcomes(items);
        } catch (ProblemException e) {
            lock.lock();
            try {
                for (Lease l : batch) l.sending = false;
                int s = e.status();
                if (s != 400 && s != 413 && s != 422) {
                    if (e.isInternal()) for (Lease l : batch) l.internalErrors++;
                    throw e;
                }
                if (batch.size() > 1) {
                    // Refused as a whole, maybe for one item: one by one.
                    say(Level.WARNING, batch.size() + " outcomes refused together (" + e.getMessage() + "): sending them one by one");
                    for (Lease l : batch) l.alone = true;
                    poke();
                    return;
                }
                refuse(batch.get(0), e.status(), e.rawCode(), e.detail());
                return;
            } finally {
                lock.unlock();
            }
        } catch (RuntimeException e) {
            lock.lock();
            try {
                for (Lease l : batch) l.sending = false;
            } finally {
                lock.unlock();
            }
            throw e;
        }
        lock.lock();
        try {
            for (int i = 0; i < batch.size(); i++) {
                Lease l = batch.get(i);
                l.sending = false;
                Types.OutcomeResult r = results.get(i);
                if (leases.get(l.job.receiptId()) != l) continue;
                if (r != null && r.route() != null && r.route().isObject()) {
                    count(l, r.route());
                    done(l);
                } else if (r != null && r.error() != null) {
                    itemError(l, r.error());
                } else {
                    countError("invalid_answer");
                    say(Level.WARNING, "outcome for " + l.job.receiptId() + ": an answer that is no outcome result");
                    retryLater(l);
                }
            }
        } finally {
            lock.unlock();
        }
    }

    /** Under the lock. */
    private void retryLater(Lease l) {
        l.tries++;
        l.retryAt = now() + (long) (Math.min(2000, 50 * Math.pow(2, l.tries)) * (0.5 + 0.5 * ThreadLocalRandom.current().nextDouble()));
    }

    /** Under the lock. */
    private void count(Lease l, JsonNode route) {
        String kind = route.path("kind").asText();
        Event event;
        switch (kind) {
            case "retry_scheduled" -> { retried++; event = Event.RETRY_SCHEDULED; }
            case "dead_lettered" -> { deadLettered++; event = Event.DEAD_LETTERED; }
            default -> {
                if (l.outcome instanceof Outcome.Skipped) skipped++;
                else settled++;
                event = Event.NO_ACTION;
            }
        }
        emit(event, l.job, Map.of("route", route));
    }

    /** Under the lock. */
    private void itemError(Lease l, Types.Problem p) {
        if (p.status() == 409) {
            lose(l, p.code());
            return;
        }
        ProblemException e = new ProblemException(p.status(), p.code(), p.problemClass(), p.detail(), null, null);
        if (e.isRetryable() || e.isInternal()) {
            // Not recorded this time: sent again while the lease lasts.
            errors.merge(p.code(), 1L, Long::sum);
            if (p.status() == 500) l.internalErrors++;
            retryLater(l);
            return;
        }
        refuse(l, p.status(), p.code(), p.detail());
    }

    /**
     * Under the lock. The server refused this lease's outcome: report onError's instead; if that
     * is refused too, release the lease. Never drop it: a receipt left to expire unreported comes
     * back with no attempt counted, and would be settled again and again.
     */
    private void refuse(Lease l, int status, String code, String detail) {
        Outcome refused = l.outcome;
        noteRefused(l, code, status, detail, refused);
        l.outcome = null;
        l.retryAt = 0;
        if (l.fallback) {
            l.state = State.RELEASING;
            poke();
            return;
        }
        l.fallback = true;
        l.alone = false;
        l.state = State.HOOK;
        OutcomeRefusedException error = new OutcomeRefusedException(status, code, detail, refused);
        // onError may take a while: it runs beside this loop, the lease extended meanwhile.
        hooks.submit(() -> {
            lock.lock();
            try {
                if (leases.get(l.job.receiptId()) != l || l.job.isCancelled()) return;
                l.runner = Thread.currentThread();
            } finally {
                lock.unlock();
            }
            Outcome outcome = null;
            try {
                outcome = hookOutcome(l, error);
            } finally {
                lock.lock();
                try {
                    l.runner = null;
                    Thread.interrupted();
                    if (leases.get(l.job.receiptId()) == l && l.state == State.HOOK) {
                        if (outcome != null) {
                            l.outcome = outcome;
                            l.state = State.REPORTING;
                        } else {
                            l.state = State.RELEASING;
                        }
                        poke();
                    }
                } finally {
                    lock.unlock();
                }
            }
        });
    }

    /** Under the lock. */
    private void noteRefused(Lease l, String code, Integer status, String detail, Outcome outcome) {
        String then = l.fallback ? "releasing the lease" : "reporting onError's outcome instead";
        outcomesRefused++;
        errors.merge(code, 1L, Long::sum);
        say(Level.ERROR, "outcome for " + l.job.receiptId() + " refused (" + (status != null ? status + " " : "") + code + ": " + detail + "): " + then);
        Map<String, Object> info = new LinkedHashMap<>();
        info.put("code", code);
        if (status != null) info.put("status", status);
        info.put("detail", detail);
        if (outcome != null) info.put("kind", outcome.kind());
        info.put("fallback", !l.fallback);
        emit(Event.OUTCOME_REFUSED, l.job, info);
    }

    /**
     * onError's outcome for {@code error}, or the default one when the hook throws or gives no
     * valid outcome; null when the job was cancelled meanwhile.
     */
    private Outcome hookOutcome(Lease l, Throwable error) {
        Job job = l.job;
        try {
            Outcome o = onError.apply(error, job);
            if (o == null) throw new InvalidOutcomeException("onError returned no outcome");
            o = Outcome.check(o);
            return job.isCancelled() ? null : o;
        } catch (Throwable e) {
            if (job.isCancelled()) return null;
            countError("on_error");
            say(Level.ERROR, "onError failed on " + job.receiptId() + " (" + describe(e) + "): reporting the default outcome");
            emit(Event.ERROR, job, Map.of("code", "on_error", "during", "on_error", "error", describe(e)));
            return defaultErrorOutcome(error, job);
        }
    }

    private void sendReleases() {
        List<Lease> releasing = new ArrayList<>();
        lock.lock();
        try {
            for (Lease l : leases.values()) {
                if (l.state == State.RELEASING && !l.sending) {
                    l.sending = true;
                    releasing.add(l);
                }
            }
        } finally {
            lock.unlock();
        }
        RuntimeException failure = null;
        for (Lease l : releasing) {
            try {
                release(l);
            } catch (RuntimeException e) {
                failure = e;
            } finally {
                lock.lock();
                try {
                    l.sending = false;
                } finally {
                    lock.unlock();
                }
            }
        }
        if (failure != null) throw failure;
    }

    /** Release one lease; throws only what is worth trying again (while the lease lasts). */
    private void release(Lease l) {
        try {
            client.release(l.job.claim());
        } catch (ProblemException e) {
            if (e.isRetryable() || e.isInternal()) throw e;
            lock.lock();
            try {
                // 409: the lease had ended already; nothing to give back.
                if (e.status() != 409) {
                    errors.merge(e.rawCode(), 1L, Long::sum);
                    say(Level.ERROR, "release of " + l.job.receiptId() + " refused: " + e.getMessage() + "; it comes back when its lease ends");
                    emit(Event.ERROR, l.job, Map.of("code", e.rawCode(), "during", "release", "error", describe(e)));
                }
                done(l);
            } finally {
                lock.unlock();
            }
            return;
        }
        lock.lock();
        try {
            released++;
            emit(Event.RELEASED, l.job, Map.of());
            done(l);
        } finally {
            lock.unlock();
        }
    }

    private void sendHeartbeats() {
        long interval = leaseMs / 3;
        List<Lease> due = new ArrayList<>();
        lock.lock();
        try {
            long t = now();
            List<Lease> live = new ArrayList<>();
            boolean any = false;
            for (Lease l : leases.values()) {
                // An outcome the server failed on (500) is sent again while its lease lasts, not longer.
                if (l.state == State.RELEASING || (l.state == State.REPORTING && l.internalErrors > 0)) continue;
                live.add(l);
                if (t >= l.extendAt) any = true;
            }
            if (!any) return;
            // Leases due within half an interval go now too: a worker's leases fall into step.
            for (Lease l : live) if (l.extendAt <= t + interval / 2) due.add(l);
        } finally {
            lock.unlock();
        }
        for (int i = 0; i < due.size(); i += MAX_ITEMS) {
            List<Lease> chunk = due.subList(i, Math.min(due.size(), i + MAX_ITEMS));
            List<JsonNode> claims = new ArrayList<>();
            for (Lease l : chunk) claims.add(l.job.claim());
            long sent = now();
            List<Types.LeaseExtendResult> results = client.extendMany(claims, leaseMs);
            lock.lock();
            try {
                heartbeats++;
                for (int j = 0; j < chunk.size(); j++) {
                    Lease l = chunk.get(j);
                    Types.LeaseExtendResult r = results.get(j);
                    if (leases.get(l.job.receiptId()) != l) continue;
                    if (r != null && r.claim() != null && r.claim().isObject() && r.claim().hasNonNull("lease_token")) {
                        l.job.setClaim(r.claim());
                        l.deadline = sent + leaseMs - margin;
                        l.extendAt = sent + interval;
                        leasesExtended++;
                    } else if (r != null && r.error() != null && r.error().status() == 409) {
                        lose(l, r.error().code());
                    } else {
                        // Not extended this time (a 503, a 500): tried again soon, while the lease lasts.
                        errors.merge(r != null && r.error() != null ? r.error().code() : "invalid_answer", 1L, Long::sum);
                        l.extendAt = sent + Math.min(1000, interval / 4);
                    }
                }
            } finally {
                lock.unlock();
            }
            emit(Event.HEARTBEAT, null, Map.of("leases", chunk.size()));
        }
    }

    /** After the loop: report the outcomes ready and release every other lease, once each; what fails comes back when its lease ends. */
    private void drain(List<Lease> left) {
        List<Lease> reports = new ArrayList<>();
        List<Lease> releases = new ArrayList<>();
        for (Lease l : left) {
            if (l.sending || l.job.isLost()) continue;
            if (l.state == State.REPORTING && l.outcome != null) reports.add(l);
            else releases.add(l);
        }
        if (reports.isEmpty() && releases.isEmpty()) return;
        say(Level.WARNING, "stopped holding " + (reports.size() + releases.size()) + " lease(s): reporting or releasing them now");
        for (int i = 0; i < reports.size(); i += MAX_ITEMS) {
            List<Lease> chunk = reports.subList(i, Math.min(reports.size(), i + MAX_ITEMS));
            List<Types.OutcomeRequest> items = new ArrayList<>();
            for (Lease l : chunk) items.add(new Types.OutcomeRequest(l.job.claim(), l.outcome));
            try {
                List<Types.OutcomeResult> results = client.outcomes(items);
                lock.lock();
                try {
                    for (int j = 0; j < chunk.size(); j++) {
                        Types.OutcomeResult r = results.get(j);
                        if (r != null && r.route() != null && r.route().isObject()) count(chunk.get(j), r.route());
                        else errors.merge(r != null && r.error() != null ? r.error().code() : "invalid_answer", 1L, Long::sum);
                    }
                } finally {
                    lock.unlock();
                }
            } catch (RuntimeException e) {
                error(errorCode(e), "a final request", e, "");
            }
        }
        for (Lease l : releases) {
            try {
                release(l);
            } catch (RuntimeException e) {
                error(errorCode(e), "a final request", e, "");
            }
        }
    }

    // -------------------------------------------------------------------------------------------
    // Claims

    private void claimLoop() {
        Backoff backoff = new Backoff();
        // A server that fails (500) is asked again ever more slowly, never in a tight loop.
        Backoff failing = new Backoff(250, 30_000, 0.5);
        try {
            while (true) {
                lock.lock();
                try {
                    if (stopping) break;
                } finally {
                    lock.unlock();
                }
                try {
                    if (claimOnce(backoff, failing)) break;
                } catch (RuntimeException e) {
                    // A bug of ours: keep claiming rather than stop quietly.
                    error("unexpected", "the claim loop", e, "");
                    pause(failing.next());
                }
            }
        } finally {
            lock.lock();
            try {
                claimingDone = true;
                poke();
            } finally {
                lock.unlock();
            }
        }
    }

    /** Wait up to ms, less when stopping. */
    private void pause(long ms) {
        lock.lock();
        try {
            long until = now() + ms;
            while (!stopping) {
                long left = until - now();
                if (left <= 0) break;
                changed.await(left, TimeUnit.MILLISECONDS);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            lock.unlock();
        }
    }

    /** One turn of the claim loop; true when the loop must end. */
    private boolean claimOnce(Backoff backoff, Backoff failing) {
        int limit;
        CompletableFuture<Types.ClaimsOut> call;
        long sent;
        lock.lock();
        try {
            // A slot is free once its handler returned: the next claim goes out while outcomes
            // are being reported (at most 4 x concurrency wait to be).
            int held = 0;
            for (Lease l : leases.values()) if (l.state == State.QUEUED || l.state == State.RUNNING) held++;
            int reporting = leases.size() - held;
            if (held >= concurrency || reporting >= 4 * concurrency) {
                changed.await(250, TimeUnit.MILLISECONDS);
                return false;
            }
            // Not clamped: a refused batch size stops the worker naming it (422 claim_batch).
            limit = batchSize != null ? batchSize : concurrency - held;
            sent = now();
            call = client.claimAsync(new Types.ClaimsIn(workerId, leaseMs, limit, waitMs, groups == null || groups.isEmpty() ? null : groups));
            inFlight = call;
            if (stopping) timer.schedule(() -> call.cancel(true), CLAIM_GRACE_MS, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            return false;
        } finally {
            lock.unlock();
        }
        Types.ClaimsOut answer;
        try {
            answer = call.get();
        } catch (InterruptedException e) {
            call.cancel(true);
            return true;
        } catch (java.util.concurrent.CancellationException e) {
            return true;
        } catch (ExecutionException ee) {
            Throwable e = ee.getCause();
            if (call.isCancelled()) return true;
            if (e instanceof ProblemException p && isFatal(p)) {
                fail("claim", p);
                return true;
            }
            String lost = e instanceof InvalidAnswerException ? " (receipts it may have leased come back when their leases end)" : "";
            error(errorCode(e), "claim", e, lost);
            boolean quick = e instanceof ConnectionFailedException || (e instanceof ProblemException p && p.isRetryable());
            pause(quick ? backoff.next() : failing.next());
            return false;
        } finally {
            lock.lock();
            try {
                if (inFlight == call) inFlight = null;
            } finally {
                lock.unlock();
            }
        }
        backoff.reset();
        failing.reset();
        List<JsonNode> claims = new ArrayList<>();
        for (JsonNode c : answer.claims()) {
            if (c != null && c.isObject() && c.path("receipt_id").isTextual() && c.path("lease_token").isTextual() && c.path("attempts").isNumber()) claims.add(c);
        }
        if (claims.size() < answer.claims().size()) {
            error("invalid_answer", "claim", new InvalidAnswerException((answer.claims().size() - claims.size()) + " claim(s) without a receipt id or token", 200, null), "");
        }
        Long look = answer.lookAgainMs();
        lock.lock();
        try {
            if (finished) {
                // run() has ended while this claim was out: give its receipts back at once.
                claimed += claims.size();
                List<Lease> back = new ArrayList<>();
                for (JsonNode c : claims) back.add(new Lease(new Job(c), sent, leaseMs, margin));
                lock.unlock();
                try {
                    drain(back);
                } finally {
                    lock.lock();
                }
                return true;
            }
            Map<String, Object> info = new LinkedHashMap<>();
            info.put("claimed", claims.size());
            if (look != null && look > 0) info.put("look_again_ms", look);
            emit(Event.POLL, null, info);
            for (JsonNode c : claims) {
                Lease l = new Lease(new Job(c), sent, leaseMs, margin);
                // Claimed while stopping: given back at once.
                if (stopping) l.state = State.RELEASING;
                leases.put(l.job.receiptId(), l);
                claimed++;
                emit(Event.CLAIMED, l.job, Map.of());
            }
            if (!claims.isEmpty()) {
                startQueued();
                poke();
                return false;
            }
        } finally {
            lock.unlock();
        }
        long p = pauseAfterEmpty(look, now() - sent);
        if (p > 0) pause(p);
        return false;
    }

    /** How long to wait before the next claim after one that brought nothing. */
    long pauseAfterEmpty(Long look, long tookMs) {
        // An answer with nothing well before its wait was over: a short pause, never a storm.
        long pause = waitMs == 0 || tookMs < waitMs / 2 ? 250 : 0;
        if (look != null && look > 0) {
            long trusted = Math.min(look, MAX_LOOK_AGAIN_MS);
            // From one group nothing more can come before then; from several, another group's
            // work must not wait for one group's rate.
            pause = groups != null && groups.size() == 1 ? trusted : Math.min(trusted, pause);
        }
        return pause;
    }

    /** Under the lock. */
    private void startQueued() {
        if (stopping) return;
        for (Lease l : leases.values()) {
            if (running >= concurrency) break;
            if (l.state != State.QUEUED) continue;
            l.state = State.RUNNING;
            running++;
            handlers.execute(() -> runJob(l));
        }
    }

    // -------------------------------------------------------------------------------------------
    // Jobs

    private void runJob(Lease l) {
        Job job = l.job;
        Outcome outcome = null;
        Throwable unexpected = null;
        InvalidOutcomeException invalid = null;
        lock.lock();
        try {
            l.runner = Thread.currentThread();
            if (job.isCancelled()) l.runner.interrupt();
        } finally {
            lock.unlock();
        }
        try {
            try {
                String transcript = handler.handle(job);
                outcome = Outcome.accepted(transcript == null || transcript.isEmpty() ? job.receiptId() : transcript);
            } catch (Retryable e) {
                outcome = e.outcome();
            } catch (Permanent e) {
                outcome = e.outcome();
            } catch (Skip e) {
                outcome = Outcome.skipped(e.reason());
            } catch (InvalidOutcomeException e) {
                invalid = e;
            } catch (Throwable e) {
                unexpected = e;
            }
            if (!job.isCancelled()) {
                if (invalid != null) {
                    lock.lock();
                    try {
                        noteRefused(l, "invalid_outcome", null, invalid.getMessage(), null);
                        l.fallback = true;
                    } finally {
                        lock.unlock();
                    }
                    outcome = hookOutcome(l, invalid);
                } else if (unexpected != null) {
                    say(Level.WARNING, "handler threw on " + job.receiptId() + ": " + describe(unexpected));
                    outcome = hookOutcome(l, unexpected);
                }
            }
        } catch (Throwable bug) {
            say(Level.ERROR, "job " + job.receiptId() + " failed: " + describe(bug));
            outcome = null;
        } finally {
            lock.lock();
            try {
                l.runner = null;
                Thread.interrupted(); // an interrupt meant for this job must not reach the next one
                running--;
                if (leases.get(job.receiptId()) == l && !job.isLost()) {
                    if (outcome != null && !job.isCancelled()) {
                        l.outcome = outcome;
                        l.state = State.REPORTING;
                    } else {
                        // Cancelled by the shutdown timeout: give the lease back.
                        l.state = State.RELEASING;
                    }
                }
                startQueued();
                poke();
            } finally {
                lock.unlock();
            }
        }
    }
}
