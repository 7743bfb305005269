package dev.settled;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Function;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The worker against a small fake server: what must never strand a receipt. */
class WorkerTest {
    /** Hands out {@code ids} once, then long-polls empty; judges outcomes with {@code judge}. */
    static final class Server {
        final HttpServer http;
        final List<JsonNode> outcomes = new CopyOnWriteArrayList<>();
        final List<String> released = new CopyOnWriteArrayList<>();
        final AtomicInteger claims = new AtomicInteger();
        final AtomicInteger extensions = new AtomicInteger();
        volatile boolean refuseExtensions;

        Server(List<String> ids, Function<JsonNode, String> judge) throws IOException {
            http = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            http.setExecutor(java.util.concurrent.Executors.newCachedThreadPool());
            http.createContext("/", ex -> {
                try {
                    handle(ex, ids, judge);
                } catch (Exception e) {
                    answer(ex, 500, "{\"code\":\"internal_error\",\"class\":\"internal\",\"detail\":\"" + e + "\"}");
                }
            });
            http.start();
        }

        static ObjectNode claim(String id) {
            return Client.object("{\"receipt_id\":\"" + id + "\",\"finalized_at\":1,\"attempts\":0,\"row_version\":1,"
                    + "\"lease_owner\":\"w\",\"lease_token\":\"t\",\"lease_until_ms\":1,\"observation\":{\"amount_cents\":1}}");
        }

        void handle(HttpExchange ex, List<String> ids, Function<JsonNode, String> judge) throws Exception {
            String path = ex.getRequestURI().getRawPath();
            JsonNode body = Client.JSON.readTree(ex.getRequestBody().readAllBytes());
            if (path.equals("/v1/claims")) {
                ArrayNode list = Client.JSON.createArrayNode();
                if (claims.getAndIncrement() == 0) for (String id : ids) list.add(claim(id));
                else Thread.sleep(Math.min(100, body.path("wait_ms").asLong()));
                answer(ex, 200, "{\"claims\":" + list + "}");
            } else if (path.equals("/v1/outcomes")) {
                ArrayNode results = Client.JSON.createArrayNode();
                for (JsonNode item : body.path("outcomes")) {
                    outcomes.add(item.path("outcome"));
                    String error = judge.apply(item.path("outcome"));
                    results.add(error == null
                            ? Client.object("{\"route\":{\"kind\":\"no_action\"}}")
                            : Client.object("{\"error\":{\"type\":\"about:blank\",\"title\":\"t\",\"status\":422,\"detail\":\"no\",\"code\":\"" + error + "\",\"class\":\"validation\"}}"));
                }
                answer(ex, 200, "{\"results\":" + results + "}");
            } else if (path.equals("/v1/leases/extend")) {
                extensions.incrementAndGet();
                ArrayNode results = Client.JSON.createArrayNode();
                for (JsonNode item : body.path("leases")) {
                    results.add(refuseExtensions
                            ? Client.object("{\"error\":{\"type\":\"about:blank\",\"title\":\"t\",\"status\":409,\"detail\":\"gone\",\"code\":\"lease_conflict\",\"class\":\"conflict\"}}")
                            : Client.object("{\"claim\":" + item.path("claim") + "}"));
                }
                answer(ex, 200, "{\"results\":" + results + "}");
            } else if (ex.getRequestMethod().equals("DELETE")) {
                released.add(body.path("claim").path("receipt_id").asText());
                ex.sendResponseHeaders(204, -1);
                ex.close();
            } else {
                answer(ex, 404, "{\"code\":\"not_found\",\"class\":\"not_found\",\"detail\":\"" + path + "\"}");
            }
        }

        static void answer(HttpExchange ex, int status, String body) throws IOException {
            byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
            ex.getResponseHeaders().add("content-type", status >= 400 ? "application/problem+json" : "application/json");
            ex.sendResponseHeaders(status, bytes.length);
            ex.getResponseBody().write(bytes);
            ex.close();
        }

        Client client() {
            return Client.builder("http://127.0.0.1:" + http.getAddress().getPort()).build();
        }
    }

    Server server;

    @AfterEach
    void close() {
        if (server != null) server.http.stop(0);
    }

    static CompletableFuture<Void> runInBackground(Worker w) {
        return CompletableFuture.runAsync(w::run);
    }

    static void waitFor(String what, java.util.function.BooleanSupplier ok) throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!ok.getAsBoolean()) {
            assertTrue(System.nanoTime() < until, "timed out waiting for " + what);
            Thread.sleep(10);
        }
    }

    @Test
    void anOnErrorHookThatThrowsReportsTheDefaultOutcomeAndTheWorkerKeepsRunning() throws Exception {
        server = new Server(List.of("a", "b"), outcome -> null);
        Worker w = Worker.builder(server.client()).workerId("w").waitMs(100)
                .handler(job -> { throw new IllegalStateException("rail exploded"); })
                .onError((error, job) -> { throw new RuntimeException("hook exploded too"); })
                .build();
        CompletableFuture<Void> running = runInBackground(w);
        waitFor("two outcomes", () -> server.outcomes.size() == 2);
        int claimsThen = server.claims.get();
        waitFor("claims after the failures", () -> server.claims.get() > claimsThen + 1);
        for (JsonNode o : server.outcomes) {
            assertEquals("retryable", o.path("kind").asText());
            assertEquals("rpc", o.path("code").asText());
        }
        w.stop().get(10, TimeUnit.SECONDS);
        running.get(10, TimeUnit.SECONDS);
        assertEquals(2L, w.stats().errors().get("on_error"));
        assertEquals(2L, w.stats().settled(), "reported (the fake answers no_action)");
    }

    @Test
    void aRefusedOutcomeIsReportedAgainWithOnErrorsThenReleased() throws Exception {
        // Every outcome refused: onError's replaces the first, and its refusal releases the lease.
        server = new Server(List.of("r"), outcome -> "invalid_transcript_id");
        Worker w = Worker.builder(server.client()).workerId("w").waitMs(100).handler(job -> "bad").build();
        CompletableFuture<Void> running = runInBackground(w);
        waitFor("the release", () -> server.released.size() == 1);
        assertEquals(2, server.outcomes.size());
        assertEquals("accepted", server.outcomes.get(0).path("kind").asText());
        assertEquals("backend", server.outcomes.get(1).path("code").asText(), "the default for a refused outcome");
        w.stop().get(10, TimeUnit.SECONDS);
        running.get(10, TimeUnit.SECONDS);
        assertEquals(2L, w.stats().outcomesRefused());
        assertEquals(1L, w.stats().released());
    }

    @Test
    void aLostLeaseInterruptsTheHandlerAndSendsNothing() throws Exception {
        server = new Server(List.of("slow"), outcome -> null);
        server.refuseExtensions = true;
        CompletableFuture<String> seen = new CompletableFuture<>();
        Worker w = Worker.builder(server.client()).workerId("w").waitMs(100).leaseMs(600)
                .handler(job -> {
                    try {
                        Thread.sleep(10_000);
                        return "tx";
                    } catch (InterruptedException e) {
                        seen.complete(job.cancelReason());
                        throw e;
                    }
                })
                .build();
        long started = System.nanoTime();
        CompletableFuture<Void> running = runInBackground(w);
        String reason = seen.get(5, TimeUnit.SECONDS);
        long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
        assertTrue(reason.contains("lease_conflict"), reason);
        assertTrue(tookMs < 600, "interrupted within one heartbeat interval: " + tookMs + " ms");
        Thread.sleep(200);
        assertTrue(server.outcomes.isEmpty(), "no outcome for a lost lease");
        w.stop().get(10, TimeUnit.SECONDS);
        running.get(10, TimeUnit.SECONDS);
        assertEquals(1L, w.stats().leasesLost());
    }

    @Test
    void stopReleasesClaimsNotStarted() throws Exception {
        server = new Server(List.of("1", "2", "3"), outcome -> null);
        CompletableFuture<Void> block = new CompletableFuture<>();
        Worker w = Worker.builder(server.client()).workerId("w").waitMs(100).concurrency(1).batchSize(3)
                .handler(job -> {
                    block.get();
                    return "tx";
                })
                .build();
        CompletableFuture<Void> running = runInBackground(w);
        waitFor("a claim", () -> w.stats().claimed() == 3);
        CompletableFuture<Void> stopped = w.stop();
        waitFor("two releases", () -> server.released.size() == 2);
        block.complete(null);
        stopped.get(10, TimeUnit.SECONDS);
        running.get(10, TimeUnit.SECONDS);
        assertEquals(1, server.outcomes.size());
        assertEquals(2L, w.stats().released());
    }
}
