package dev.settled;

import java.util.concurrent.ThreadLocalRandom;

/**
 * Full jitter: a random wait up to {@code base * 2^n} ms, capped. With {@code floor} (0..1) at
 * least that share of it is always waited, so that a run of quick failures never storms.
 */
public final class Backoff {
    private final long baseMs;
    private final long capMs;
    private final double floor;
    private int n;

    public Backoff(long baseMs, long capMs, double floor) {
        this.baseMs = baseMs;
        this.capMs = capMs;
        this.floor = floor;
    }

    public Backoff() {
        this(100, 5_000, 0);
    }

    public long next() {
        double ceiling = Math.min(capMs, baseMs * Math.pow(2, n));
        n = Math.min(n + 1, 30);
        return (long) (ceiling * (floor + (1 - floor) * ThreadLocalRandom.current().nextDouble()));
    }

    public void reset() {
        n = 0;
    }
}
