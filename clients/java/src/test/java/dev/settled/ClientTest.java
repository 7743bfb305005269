package dev.settled;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.IntFunction;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

class ClientTest {
    /** A local server answering each request with what {@code answer} gives for its number (from 1). */
    static final class Fake {
        final HttpServer server;
        final AtomicInteger requests = new AtomicInteger();
        final ConcurrentLinkedQueue<String> paths = new ConcurrentLinkedQueue<>();
        final ConcurrentLinkedQueue<String> auth = new ConcurrentLinkedQueue<>();

        record Answer(int status, String contentType, String body, Map<String, String> headers) {}

        Fake(IntFunction<Answer> answer) throws IOException {
            server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            server.createContext("/", exchange -> {
                int n = requests.incrementAndGet();
                paths.add(exchange.getRequestURI().getRawPath());
                String a = exchange.getRequestHeaders().getFirst("authorization");
                auth.add(a == null ? "" : a);
                exchange.getRequestBody().readAllBytes();
                Answer out = answer.apply(n);
                byte[] body = out.body().getBytes(StandardCharsets.UTF_8);
                exchange.getResponseHeaders().add("content-type", out.contentType());
                out.headers().forEach((k, v) -> exchange.getResponseHeaders().add(k, v));
                exchange.sendResponseHeaders(out.status(), body.length == 0 ? -1 : body.length);
                exchange.getResponseBody().write(body);
                exchange.close();
            });
            server.start();
        }

        Client client() {
            return Client.builder("http://127.0.0.1:" + server.getAddress().getPort() + "/").token("t0ken").retries(3).timeoutMs(5000).build();
        }
    }

    static Fake.Answer problem(int status, String code, String cls) {
        return new Fake.Answer(status, "application/problem+json",
                "{\"type\":\"about:blank\",\"title\":\"x\",\"status\":" + status + ",\"detail\":\"because\",\"code\":\"" + code + "\",\"class\":\"" + cls + "\"}",
                Map.of());
    }

    static Fake.Answer json(String body) {
        return new Fake.Answer(200, "application/json", body, Map.of());
    }

    Fake fake;

    @AfterEach
    void close() {
        if (fake != null) fake.server.stop(0);
    }

    @Test
    void idsArePercentEncoded() {
        assertEquals("a%2Fb%20%C3%A9%3F%23%25%2B", Client.encode("a/b é?#%+"));
        assertEquals("plain-id_1.2~x", Client.encode("plain-id_1.2~x"));
    }

    @Test
    void problemAnswersBecomeTypedExceptions() {
        ProblemException p = Client.problem(409, "{\"type\":\"about:blank\",\"title\":\"Conflict\",\"status\":409,\"detail\":\"held\",\"code\":\"lease_conflict\",\"class\":\"conflict\"}".getBytes(StandardCharsets.UTF_8), null);
        assertEquals(409, p.status());
        assertEquals(ProblemCode.LEASE_CONFLICT, p.code());
        assertEquals(ProblemClass.CONFLICT, p.problemClass());
        assertEquals("held", p.detail());
        assertTrue(p.isLeaseLost());
        assertFalse(p.isRetryable());

        ProblemException unknown = Client.problem(422, "{\"code\":\"brand_new\",\"class\":\"validation\",\"detail\":\"d\"}".getBytes(StandardCharsets.UTF_8), null);
        assertEquals(ProblemCode.UNKNOWN, unknown.code());
        assertEquals("brand_new", unknown.rawCode());

        ProblemException busy = Client.problem(503, "{\"code\":\"backend_unavailable\",\"class\":\"backend\",\"detail\":\"d\"}".getBytes(StandardCharsets.UTF_8), "2");
        assertTrue(busy.isRetryable());
        assertEquals(2000L, busy.retryAfterMs());

        ProblemException internal = Client.problem(500, "{\"code\":\"internal_error\",\"class\":\"internal\",\"detail\":\"d\"}".getBytes(StandardCharsets.UTF_8), null);
        assertTrue(internal.isInternal());
        assertFalse(Client.problem(500, "{\"code\":\"invalid_record\",\"class\":\"invalid_record\",\"detail\":\"d\"}".getBytes(StandardCharsets.UTF_8), null).isInternal());
    }

    @Test
    void anAnswerThatIsNoProblemStillBecomesOne() {
        ProblemException p = Client.problem(502, "<html>bad gateway</html>".getBytes(StandardCharsets.UTF_8), null);
        assertEquals("http_502", p.rawCode());
        assertEquals(ProblemCode.UNKNOWN, p.code());
        assertTrue(p.isRetryable(), "a 5xx that is no problem is worth another try");
        assertNull(p.body());
        assertFalse(Client.problem(404, "nope".getBytes(StandardCharsets.UTF_8), null).isRetryable());
    }

    @Test
    void enqueueIsRetriedOn503AndALostAnswer() throws IOException {
        fake = new Fake(n -> n == 1 ? problem(503, "backend_unavailable", "backend")
                : n == 2 ? new Fake.Answer(200, "text/html", "<html>proxy</html>", Map.of())
                : json("{\"receipt_id\":\"a/b\",\"state\":\"pending\"}"));
        JsonNode view = fake.client().enqueue(new Types.ReceiptIn("a/b", 1, null));
        assertEquals("a/b", view.path("receipt_id").asText());
        assertEquals(3, fake.requests.get());
        assertTrue(fake.auth.stream().allMatch("Bearer t0ken"::equals));
    }

    @Test
    void internalErrorsAreRetriedABoundedNumberOfTimes() throws IOException {
        fake = new Fake(n -> problem(500, "internal_error", "internal"));
        ProblemException e = assertThrows(ProblemException.class, () -> fake.client().status());
        assertEquals(ProblemCode.INTERNAL_ERROR, e.code());
        assertEquals(4, fake.requests.get(), "one try and three retries");
    }

    @Test
    void aClaimIsNeverRetried() throws IOException {
        fake = new Fake(n -> problem(503, "backend_unavailable", "backend"));
        assertThrows(ProblemException.class, () -> fake.client().claim(new Types.ClaimsIn("w", 1000, 1, 0L, null)));
        assertEquals(1, fake.requests.get());
    }

    @Test
    void aSuccessThatIsNotJsonIsAnInvalidAnswer() throws IOException {
        fake = new Fake(n -> new Fake.Answer(200, "text/plain", "surprise", Map.of()));
        InvalidAnswerException e = assertThrows(InvalidAnswerException.class,
                () -> fake.client().claim(new Types.ClaimsIn("w", 1000, 1, 0L, null)));
        assertTrue(e.getMessage().contains("not JSON"), e.getMessage());
    }

    @Test
    void claimsAndItemResultsAreParsed() throws IOException {
        String claim = "{\"receipt_id\":\"r 1\",\"finalized_at\":5,\"attempts\":2,\"row_version\":7,\"lease_owner\":\"w\","
                + "\"lease_token\":\"tok\",\"lease_until_ms\":99,\"group\":\"rail:ach\",\"observation\":{\"amount_cents\":3},"
                + "\"traceparent\":\"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}";
        fake = new Fake(n -> switch (n) {
            case 1 -> json("{\"claims\":[" + claim + "],\"look_again_ms\":40}");
            default -> json("{\"results\":[{\"receipt_id\":\"r 1\",\"route\":{\"kind\":\"no_action\"}},"
                    + "{\"receipt_id\":\"r 2\",\"error\":{\"type\":\"about:blank\",\"title\":\"Conflict\",\"status\":409,\"detail\":\"d\",\"code\":\"lease_expired\",\"class\":\"conflict\"}}]}");
        });
        Client c = fake.client();
        Types.ClaimsOut out = c.claim(new Types.ClaimsIn("w", 1000, 1, 0L, List.of("rail:ach")));
        assertEquals(40L, out.lookAgainMs());
        Job job = new Job(out.claims().get(0));
        assertEquals("r 1", job.receiptId());
        assertEquals(3, job.attempt());
        assertEquals("rail:ach", job.group());
        assertEquals(3, job.observation().path("amount_cents").asInt());
        assertTrue(job.traceparent().startsWith("00-0af7"));
        assertEquals(7, job.claimView().rowVersion());
        List<Types.OutcomeResult> results = c.outcomes(List.of(
                new Types.OutcomeRequest(out.claims().get(0), Outcome.accepted("tx")),
                new Types.OutcomeRequest(out.claims().get(0), Outcome.skipped(SkipReason.DENIED))));
        assertEquals("no_action", results.get(0).route().path("kind").asText());
        assertEquals(409, results.get(1).error().status());
        assertEquals("lease_expired", results.get(1).error().code());
    }

    @Test
    void theClaimIsSentBackExactly() throws Exception {
        JsonNode claim = Client.object("{\"receipt_id\":\"x/y\",\"finalized_at\":1,\"attempts\":0,\"row_version\":1,\"lease_owner\":\"w\","
                + "\"lease_token\":\"t\",\"lease_until_ms\":5,\"group\":null,\"observation\":null}");
        String body = Client.JSON.writeValueAsString(new Types.OutcomeRequest(claim, Outcome.accepted("tx")));
        assertEquals("{\"claim\":" + claim + ",\"outcome\":{\"kind\":\"accepted\",\"transcript_id\":\"tx\"}}", body);
        fake = new Fake(n -> new Fake.Answer(204, "application/json", "", Map.of()));
        fake.client().release(claim);
        assertEquals("/v1/receipts/x%2Fy/lease", fake.paths.peek());
    }
}
