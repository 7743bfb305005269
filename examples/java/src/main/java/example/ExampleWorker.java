// A settled worker on the Java SDK (clients/java; `bash clients/java/build.sh` builds both).
//
// It claims due receipts with a long poll, settles each one on a simulated payment rail
// (timeouts, declines, zero charges, slow settlements), and lets the SDK do the rest:
// heartbeats, batched outcomes, backoff, and a clean stop on SIGTERM or Ctrl-C that releases
// the work not started.
//
//     SETTLED_URL=http://127.0.0.1:8080 java -jar examples/java/target/settled-example-worker.jar --worker-id java-1
//
// Every flag can also be set through the environment variable shown by --help. Logs go to
// stderr (warnings and errors, every outcome with --verbose); on exit one JSON line with the
// worker's counters goes to stdout. Exit status: 0 after a clean stop, 2 for a configuration
// error that retrying cannot fix (bad token, refused parameters).
package example;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.settled.Client;
import dev.settled.FailureCode;
import dev.settled.Permanent;
import dev.settled.Retryable;
import dev.settled.Skip;
import dev.settled.SkipReason;
import dev.settled.Worker;
import dev.settled.WorkerStoppedException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.logging.Level;
import java.util.logging.Logger;

public final class ExampleWorker {
    // flag: {environment variable, default, help}
    static final String[][] OPTIONS = {
        {"url", "SETTLED_URL", "http://127.0.0.1:8080", "base URL of settled"},
        {"token", "SETTLED_TOKEN", "", "Bearer token with the worker role"},
        {"worker-id", "SETTLED_WORKER_ID", "", "lease owner name, 1..=128 bytes (default: java-HOST-PID)"},
        {"concurrency", "SETTLED_CONCURRENCY", "8", "receipts settled at once"},
        {"batch-size", "SETTLED_BATCH_SIZE", "16", "receipts claimed per poll, 1..=1024"},
        {"lease-ms", "SETTLED_LEASE_MS", "30000", "lease length asked for and extended to"},
        {"wait-ms", "SETTLED_WAIT_MS", "5000", "long-poll wait when nothing is due, 0..=20000"},
        {"exit-when-idle", "SETTLED_EXIT_WHEN_IDLE", "0", "exit after N consecutive empty polls with no job in hand; 0 = never"},
        {"timeout-rate", "RAIL_TIMEOUT_RATE", "0.05", "probability the rail times out (retryable, code rpc)"},
        {"decline-rate", "RAIL_DECLINE_RATE", "0.02", "probability the rail declines (permanent, code verification)"},
        {"slow-rate", "RAIL_SLOW_RATE", "0", "probability a settlement is slow and needs heartbeats"},
        {"slow-ms", "RAIL_SLOW_MS", "0", "duration of a slow settlement; 0 = 1.5 x lease-ms"},
        {"latency-ms", "RAIL_LATENCY_MS", "5", "upper bound of a normal settlement's duration"},
        {"seed", "RAIL_SEED", "", "seed of the simulated rail's randomness"},
    };

    static final class Config {
        final Map<String, String> values = new HashMap<>();
        boolean verbose;

        String get(String name) { return values.get(name); }

        long integer(String name, long lo, long hi) {
            try {
                long v = Long.parseLong(get(name).trim());
                if (v >= lo && v <= hi) return v;
            } catch (NumberFormatException ignored) {
                // Below.
            }
            throw fail("--" + name + " must be an integer in " + lo + "..=" + hi);
        }

        double rate(String name) {
            try {
                double v = Double.parseDouble(get(name).trim());
                if (v >= 0 && v <= 1) return v;
            } catch (NumberFormatException ignored) {
                // Below.
            }
            throw fail("--" + name + " must be a probability in 0..=1");
        }
    }

    static String usage() {
        StringBuilder s = new StringBuilder("usage: java -jar settled-example-worker.jar [--flag value]... [--verbose]\n\n");
        for (String[] o : OPTIONS) {
            s.append(String.format("  --%-15s %s [env %s] (default: %s)%n", o[0], o[3], o[1], o[2].isEmpty() ? "none" : o[2]));
        }
        return s.append(String.format("  --%-15s log every outcome%n", "verbose")).toString();
    }

    static RuntimeException fail(String message) {
        System.err.println("settled-example-worker: " + message + "\n\n" + usage());
        System.exit(2);
        return new IllegalStateException();
    }

    static Config config(String[] argv) {
        Config c = new Config();
        Map<String, String> given = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (a.equals("--verbose")) { c.verbose = true; continue; }
            if (a.equals("--help") || a.equals("-h")) { System.out.print(usage()); System.exit(0); }
            String name = a.startsWith("--") ? a.substring(2) : null;
            String value = null;
            if (name != null && name.contains("=")) { value = name.substring(name.indexOf('=') + 1); name = name.substring(0, name.indexOf('=')); }
            final String n = name;
            if (n == null || java.util.Arrays.stream(OPTIONS).noneMatch(o -> o[0].equals(n))) throw fail("unknown argument " + a);
            if (value == null) {
                if (i + 1 >= argv.length) throw fail("--" + n + " needs a value");
                value = argv[++i];
            }
            given.put(n, value);
        }
        for (String[] o : OPTIONS) {
            String env = System.getenv(o[1]);
            c.values.put(o[0], given.getOrDefault(o[0], env != null && !env.isEmpty() ? env : o[2]));
        }
        if (c.get("worker-id").isEmpty()) c.values.put("worker-id", "java-" + host() + "-" + ProcessHandle.current().pid());
        return c;
    }

    static String host() {
        try {
            return java.net.InetAddress.getLocalHost().getHostName();
        } catch (Exception e) {
            return "localhost";
        }
    }

    /** Stands in for a payment rail. Idempotent, keyed by receipt id: asking again for a receipt
     *  it accepted returns the same transcript instead of charging twice. */
    static final class SimulatedRail {
        final double timeoutRate, declineRate, slowRate;
        final long slowMs, latencyMs;
        final Random rng;
        final Map<String, String> accepted = new ConcurrentHashMap<>();

        SimulatedRail(Config c, long leaseMs) {
            timeoutRate = c.rate("timeout-rate");
            declineRate = c.rate("decline-rate");
            slowRate = c.rate("slow-rate");
            long slow = c.integer("slow-ms", 0, 86_400_000);
            slowMs = slow == 0 ? leaseMs * 3 / 2 : slow;
            latencyMs = c.integer("latency-ms", 0, 86_400_000);
            rng = c.get("seed").isEmpty() ? new Random() : new Random(c.integer("seed", 0, 4_294_967_295L));
        }

        /** Throws InterruptedException when the job is cancelled (its lease lost): charge nothing. */
        String charge(String receiptId, JsonNode observation) throws InterruptedException {
            String done = accepted.get(receiptId);
            if (done != null) return done;
            JsonNode amount = observation == null ? null : observation.get("amount_cents");
            if (amount == null || !amount.canConvertToLong() || !amount.isIntegralNumber() || amount.asLong() < 0) {
                throw new Permanent(FailureCode.INVALID_OBSERVATION, "amount_cents must be a non-negative integer");
            }
            if (amount.asLong() == 0) throw new Skip(SkipReason.ZERO_CHARGE);
            boolean slow = rng.nextDouble() < slowRate;
            long ms = slow ? slowMs : (long) (rng.nextDouble() * latencyMs);
            if (ms > 0) Thread.sleep(ms);
            else if (Thread.interrupted()) throw new InterruptedException("cancelled");
            double roll = rng.nextDouble();
            if (roll < timeoutRate) throw new Retryable(FailureCode.RPC, "rail timed out");
            if (roll < timeoutRate + declineRate) {
                // The code is one of the spec's closed set; railCode is the rail's own word for it.
                throw new Permanent(FailureCode.VERIFICATION, "rail declined the charge", "card_declined");
            }
            String transcript = "tx-" + sha256(receiptId).substring(0, 24);
            accepted.put(receiptId, transcript);
            return transcript;
        }

        static String sha256(String s) {
            try {
                return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
            } catch (java.security.NoSuchAlgorithmException e) {
                throw new IllegalStateException(e);
            }
        }
    }

    // -------------------------------------------------------------------------------------------
    // The worker: everything settled-specific is below.

    /** Events that end a claimed job here: its outcome's route, a release, a lost lease. */
    static final Set<Worker.Event> DONE = Set.of(Worker.Event.NO_ACTION, Worker.Event.RETRY_SCHEDULED,
            Worker.Event.DEAD_LETTERED, Worker.Event.RELEASED, Worker.Event.LEASE_LOST);

    public static void main(String[] argv) throws Exception {
        Config c = config(argv);
        String id = c.get("worker-id");
        System.setProperty("java.util.logging.SimpleFormatter.format", "%1$tFT%1$tT.%1$tLZ " + id.replace("%", "%%") + " %4$s %5$s%6$s%n");
        Logger.getLogger("").setLevel(c.verbose ? Level.INFO : Level.WARNING);
        long leaseMs = c.integer("lease-ms", 0, Long.MAX_VALUE);
        long exitWhenIdle = c.integer("exit-when-idle", 0, Long.MAX_VALUE);
        SimulatedRail rail = new SimulatedRail(c, leaseMs);
        System.Logger log = System.getLogger("example");
        Set<String> holding = ConcurrentHashMap.newKeySet(); // claimed, not yet answered: a retry may follow
        long[] idle = {0};
        Worker[] self = new Worker[1];

        Client client = Client.builder(c.get("url")).token(c.get("token")).build();
        Worker worker = self[0] = Worker.builder(client)
                .workerId(id)
                .concurrency((int) c.integer("concurrency", 1, 100_000))
                // Ranges are the server's to judge: a refused one stops the worker naming it.
                .batchSize((int) c.integer("batch-size", 0, Integer.MAX_VALUE))
                .leaseMs(leaseMs)
                .waitMs(c.integer("wait-ms", 0, Long.MAX_VALUE))
                .handleSignals(true) // SIGTERM / Ctrl-C: finish, report, release; a second one stops at once
                // The rail's transcript id settles the receipt; Retryable / Permanent / Skip report the rest.
                .handler(job -> rail.charge(job.receiptId(), job.observation()))
                .listener((event, job, info) -> {
                    if (event == Worker.Event.CLAIMED) holding.add(job.receiptId());
                    else if (job != null && (DONE.contains(event) || (event == Worker.Event.ERROR && "release".equals(info.get("during"))))) holding.remove(job.receiptId());
                    if (event == Worker.Event.POLL) {
                        // A poll is idle only with nothing in hand.
                        idle[0] = ((Integer) info.get("claimed")) > 0 || !holding.isEmpty() ? 0 : idle[0] + 1;
                        if (exitWhenIdle > 0 && idle[0] >= exitWhenIdle) self[0].stop();
                    } else if (c.verbose && job != null) {
                        log.log(System.Logger.Level.INFO, event.wire() + " " + job.receiptId() + " " + info);
                    }
                })
                .build();

        int status = 0;
        try {
            worker.run();
        } catch (WorkerStoppedException e) {
            System.err.println(id + ": " + e.getMessage());
            status = 2;
        }
        Worker.Stats s = worker.stats();
        Map<String, Object> summary = new LinkedHashMap<>();
        summary.put("worker_id", id);
        summary.put("claimed", s.claimed());
        summary.put("accepted", s.settled());
        summary.put("skipped", s.skipped());
        summary.put("retryable", s.retried());
        summary.put("permanent", s.deadLettered());
        summary.put("released", s.released());
        summary.put("lost", s.leasesLost());
        summary.put("heartbeats", s.heartbeats());
        summary.put("refused", s.outcomesRefused());
        summary.put("errors", s.errors());
        System.out.println(new ObjectMapper().writeValueAsString(summary));
        System.out.flush();
        System.exit(status);
    }
}
