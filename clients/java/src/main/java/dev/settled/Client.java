package dev.settled;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;

/**
 * A client of settled's HTTP API: one method per operation.
 *
 * <p>Every error answer throws {@link ProblemException}; no answer throws
 * {@link ConnectionFailedException}; a success whose body is not the JSON expected throws
 * {@link InvalidAnswerException}. Only requests safe to repeat are retried here: enqueues
 * (idempotent by receipt id) and reads, on 503, 504, 429, 500 internal_error or a lost
 * connection, a bounded number of times with full-jitter backoff. A claim is never retried
 * blindly (the server may have leased receipts already). Thread-safe.
 */
public final class Client {
    /** The longest Retry-After a retried request honours, ms. */
    static final long MAX_RETRY_AFTER_MS = 10_000;

    static final ObjectMapper JSON = new ObjectMapper().configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false);

    private final String baseUrl;
    private final String token;
    private final long timeoutMs;
    private final int retries;
    private final HttpClient http;

    private Client(Builder b) {
        this.baseUrl = b.baseUrl.replaceAll("/+$", "");
        this.token = b.token == null || b.token.isEmpty() ? null : b.token;
        this.timeoutMs = b.timeoutMs;
        this.retries = b.retries;
        this.http = HttpClient.newBuilder()
                .version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofMillis(b.connectTimeoutMs))
                .build();
    }

    public static Builder builder(String baseUrl) {
        return new Builder(baseUrl);
    }

    public static final class Builder {
        private final String baseUrl;
        private String token;
        private long timeoutMs = 10_000;
        private long connectTimeoutMs = 5_000;
        private int retries = 5;

        private Builder(String baseUrl) {
            this.baseUrl = baseUrl == null ? "http://127.0.0.1:8080" : baseUrl;
        }

        /** Bearer token (worker, producer, reader or operator). */
        public Builder token(String token) { this.token = token; return this; }
        /** Per-request time limit (a long poll gets its wait_ms on top). Default 10 000. */
        public Builder timeoutMs(long ms) { this.timeoutMs = ms; return this; }
        public Builder connectTimeoutMs(long ms) { this.connectTimeoutMs = ms; return this; }
        /** How many times an idempotent request is tried again. Default 5. */
        public Builder retries(int retries) { this.retries = retries; return this; }
        public Client build() { return new Client(this); }
    }

    public String baseUrl() { return baseUrl; }

    /** Ids may hold '/', '?', '#', '%', spaces or any Unicode: always encoded (RFC 3986 unreserved kept). */
    public static String encode(String segment) {
        return URLEncoder.encode(segment, StandardCharsets.UTF_8).replace("+", "%20").replace("*", "%2A").replace("%7E", "~");
    }

    // ---------------------------------------------------------------------------------------
    // Sending

    /** One request ready to go; {@link #send} turns it into the parsed answer. */
    final class Call {
        final String method;
        final String path;
        final Object body;
        final boolean idempotent;
        final long extraMs;

        Call(String method, String path, Object body, boolean idempotent, long extraMs) {
            this.method = method;
            this.path = path;
            this.body = body;
            this.idempotent = idempotent;
            this.extraMs = extraMs;
        }

        HttpRequest request() {
            HttpRequest.Builder r = HttpRequest.newBuilder(URI.create(baseUrl + path))
                    .timeout(Duration.ofMillis(timeoutMs + extraMs))
                    .header("accept", "application/json");
            if (token != null) r.header("authorization", "Bearer " + token);
            if (method.equals("GET")) {
                r.GET();
            } else {
                byte[] bytes;
                try {
                    bytes = JSON.writeValueAsBytes(body == null ? JSON.createObjectNode() : body);
                } catch (JsonProcessingException e) {
                    throw new IllegalArgumentException("cannot serialize the body of " + method + " " + path, e);
                }
                r.header("content-type", "application/json");
                r.method(method, HttpRequest.BodyPublishers.ofByteArray(bytes));
            }
            return r.build();
        }

        /** The parsed answer of one try (null for an empty body). */
        JsonNode parse(HttpResponse<byte[]> answer) {
            byte[] text = answer.body();
            int status = answer.statusCode();
            if (status >= 400) throw problem(status, text, answer.headers().firstValue("retry-after").orElse(null));
            if (text == null || text.length == 0) return null;
            try {
                return JSON.readTree(text);
            } catch (IOException e) {
                String s = new String(text, StandardCharsets.UTF_8);
                String shown = s.length() > 80 ? s.substring(0, 80) + "…" : s;
                throw new InvalidAnswerException(method + " " + path + ": " + status + " answer is not JSON ("
                        + text.length + " bytes: " + shown + ")", status, e);
            }
        }

        /** Start one try; the future fails with this SDK's exceptions. */
        CompletableFuture<JsonNode> start() {
            CompletableFuture<HttpResponse<byte[]>> raw = http.sendAsync(request(), HttpResponse.BodyHandlers.ofByteArray());
            CompletableFuture<JsonNode> parsed = raw.handle((answer, e) -> {
                if (e != null) throw connectionFailed(this, e);
                return parse(answer);
            });
            // Cancelling a dependent future does not reach the one it depends on: pass it on, so
            // that the request itself is cancelled (its connection closed).
            return cancelsToo(parsed, raw);
        }
    }

    static SettledException connectionFailed(Call call, Throwable e) {
        Throwable cause = e instanceof java.util.concurrent.CompletionException && e.getCause() != null ? e.getCause() : e;
        if (cause instanceof SettledException s) return s;
        return new ConnectionFailedException(call.method + " " + call.path + ": " + cause, cause);
    }

    JsonNode send(Call call) {
        Backoff backoff = new Backoff();
        int tries = call.idempotent ? retries + 1 : 1;
        for (int attempt = 1; ; attempt++) {
            long wait;
            try {
                return once(call);
            } catch (ConnectionFailedException | ProblemException e) {
                boolean again = e instanceof ConnectionFailedException
                        || ((ProblemException) e).isRetryable() || ((ProblemException) e).isInternal();
                if (!again || attempt >= tries) throw e;
                wait = backoff.next();
                if (e instanceof ProblemException p && p.retryAfterMs() != null) {
                    wait = Math.max(wait, Math.min(p.retryAfterMs(), MAX_RETRY_AFTER_MS));
                }
            }
            try {
                Thread.sleep(wait);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw new ConnectionFailedException(call.method + " " + call.path + ": interrupted", ie);
            }
        }
    }

    private JsonNode once(Call call) {
        HttpResponse<byte[]> answer;
        try {
            answer = http.send(call.request(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (IOException e) {
            throw new ConnectionFailedException(call.method + " " + call.path + ": " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new ConnectionFailedException(call.method + " " + call.path + ": interrupted", e);
        }
        return call.parse(answer);
    }

    /** A problem+json answer as an exception; an answer that is no problem gets code http_STATUS. */
    static ProblemException problem(int status, byte[] text, String retryAfter) {
        JsonNode body = null;
        try {
            body = text == null || text.length == 0 ? null : JSON.readTree(text);
        } catch (IOException ignored) {
            // Not JSON: a proxy's page, say.
        }
        Long wait = null;
        if (retryAfter != null) {
            try {
                double seconds = Double.parseDouble(retryAfter.trim());
                if (seconds >= 0 && Double.isFinite(seconds)) wait = Math.round(seconds * 1000);
            } catch (NumberFormatException ignored) {
                // An HTTP date is not worth the parsing here.
            }
        }
        if (body != null && body.isObject() && body.hasNonNull("code")) {
            return new ProblemException(status, body.path("code").asText(), body.path("class").asText(""),
                    body.path("detail").asText(""), body, wait);
        }
        String s = text == null ? "" : new String(text, StandardCharsets.UTF_8);
        // A 5xx is worth another try, anything else is not.
        return new ProblemException(status, "http_" + status, status >= 500 ? "backend" : "validation",
                s.length() > 200 ? s.substring(0, 200) : s, body, wait);
    }

    private static <T> T as(JsonNode node, Class<T> type, String call) {
        try {
            return JSON.treeToValue(node, type);
        } catch (JsonProcessingException | IllegalArgumentException e) {
            throw new InvalidAnswerException(call + ": the answer is not a " + type.getSimpleName() + ": " + e.getMessage(), 200, e);
        }
    }

    private static <T> List<T> results(JsonNode node, int expected, Class<T> type, String call) {
        JsonNode list = node == null ? null : node.get("results");
        if (list == null || !list.isArray() || list.size() != expected) {
            throw new InvalidAnswerException(call + ": the answer has no results", 200, null);
        }
        List<T> out = new ArrayList<>(expected);
        for (JsonNode item : list) {
            try {
                out.add(JSON.treeToValue(item, type));
            } catch (JsonProcessingException | IllegalArgumentException e) {
                out.add(null); // one unreadable item: the worker sends it again while its lease lasts
            }
        }
        return out;
    }

    private static String query(Map<String, ?> q) {
        if (q == null || q.isEmpty()) return "";
        StringBuilder s = new StringBuilder();
        for (Map.Entry<String, ?> e : q.entrySet()) {
            if (e.getValue() == null) continue;
            s.append(s.length() == 0 ? '?' : '&').append(encode(e.getKey())).append('=').append(encode(String.valueOf(e.getValue())));
        }
        return s.toString();
    }

    // ---------------------------------------------------------------------------------------
    // Producers

    /** Enqueue one receipt; answers its view. Idempotent: retried on 503, 504, 429, 500 internal_error or a lost connection. */
    public JsonNode enqueue(Types.ReceiptIn receipt) {
        JsonNode out = send(new Call("POST", "/v1/receipts", receipt, true, 0));
        if (out == null || !out.path("receipt_id").isTextual()) throw new InvalidAnswerException("POST /v1/receipts: the answer has no receipt", 200, null);
        return out;
    }

    /** Enqueue up to 1024 receipts in one commit, each judged on its own (created, existing, conflict, invalid). */
    public List<JsonNode> enqueueBatch(List<Types.ReceiptIn> receipts) {
        JsonNode out = send(new Call("POST", "/v1/receipts/batch", Map.of("receipts", receipts), true, 0));
        return results(out, receipts.size(), JsonNode.class, "POST /v1/receipts/batch");
    }

    // ---------------------------------------------------------------------------------------
    // Workers

    /** Claim up to {@code limit} due receipts, waiting up to wait_ms for work. Never retried. */
    public Types.ClaimsOut claim(Types.ClaimsIn params) {
        return claimsOut(send(claimCall(params)));
    }

    /**
     * The claim, started: cancelling the future before its answer arrives ends a long poll on the
     * server too, before it leases anything.
     */
    public CompletableFuture<Types.ClaimsOut> claimAsync(Types.ClaimsIn params) {
        CompletableFuture<JsonNode> sent = claimCall(params).start();
        return cancelsToo(sent.thenApply(Client::claimsOut), sent);
    }

    /** {@code future}, whose cancellation cancels {@code source} too. */
    static <T> CompletableFuture<T> cancelsToo(CompletableFuture<T> future, CompletableFuture<?> source) {
        future.whenComplete((value, e) -> {
            if (future.isCancelled()) source.cancel(true);
        });
        return future;
    }

    private Call claimCall(Types.ClaimsIn params) {
        return new Call("POST", "/v1/claims", params, false, params.waitMs() == null ? 0 : params.waitMs());
    }

    private static Types.ClaimsOut claimsOut(JsonNode out) {
        if (out == null || !out.path("claims").isArray()) throw new InvalidAnswerException("POST /v1/claims: the answer has no claims", 200, null);
        return as(out, Types.ClaimsOut.class, "POST /v1/claims");
    }

    /** Claim one receipt by id; answers the claim. */
    public JsonNode claimReceipt(String receiptId, String workerId, long leaseMs) {
        return send(new Call("POST", "/v1/receipts/" + encode(receiptId) + "/claim", new Types.ClaimOneIn(workerId, leaseMs), false, 0));
    }

    /** Extend one lease to now + extendMs; answers the claim to send from now on. */
    public JsonNode extend(JsonNode claim, long extendMs) {
        return send(new Call("POST", "/v1/receipts/" + encode(claim.path("receipt_id").asText()) + "/lease",
                new Types.LeaseExtendIn(claim, extendMs), false, 0));
    }

    /** Extend up to 1024 leases in one request, each judged on its own. */
    public List<Types.LeaseExtendResult> extendMany(List<JsonNode> claims, long extendMs) {
        List<Types.LeaseExtendIn> leases = new ArrayList<>();
        for (JsonNode c : claims) leases.add(new Types.LeaseExtendIn(c, extendMs));
        JsonNode out = send(new Call("POST", "/v1/leases/extend", Map.of("leases", leases), false, 0));
        return results(out, claims.size(), Types.LeaseExtendResult.class, "POST /v1/leases/extend");
    }

    /** Give a lease back: due again at once, no attempt used. */
    public void release(JsonNode claim) {
        send(new Call("DELETE", "/v1/receipts/" + encode(claim.path("receipt_id").asText()) + "/lease", new Types.LeaseReleaseIn(claim), false, 0));
    }

    /** Record the outcome of a claimed receipt; answers its route. */
    public JsonNode outcome(JsonNode claim, Outcome outcome) {
        return send(new Call("POST", "/v1/receipts/" + encode(claim.path("receipt_id").asText()) + "/outcome",
                new Types.OutcomeRequest(claim, outcome), false, 0));
    }

    /** Record up to 1024 outcomes in one commit, each judged on its own. */
    public List<Types.OutcomeResult> outcomes(List<Types.OutcomeRequest> items) {
        JsonNode out = send(new Call("POST", "/v1/outcomes", Map.of("outcomes", items), false, 0));
        return results(out, items.size(), Types.OutcomeResult.class, "POST /v1/outcomes");
    }

    // ---------------------------------------------------------------------------------------
    // Readers and operators

    /** A receipt's state, lease (never its token) and history. */
    public JsonNode get(String receiptId) {
        return send(new Call("GET", "/v1/receipts/" + encode(receiptId), null, true, 0));
    }

    /** Find receipts (state, code, owner, prefix, group, ranges, limit, cursor, …). */
    public JsonNode search(Map<String, ?> query) {
        return send(new Call("GET", "/v1/receipts" + query(query), null, true, 0));
    }

    /** Counts per state, oldest due age, samples, groups. */
    public JsonNode status() {
        return send(new Call("GET", "/v1/status", null, true, 0));
    }

    public JsonNode info() {
        return send(new Call("GET", "/v1/info", null, true, 0));
    }

    public JsonNode deadLetters(Map<String, ?> query) {
        return send(new Call("GET", "/v1/dead-letters" + query(query), null, true, 0));
    }

    /** Put a dead letter back to work (attempts restart at 0). */
    public JsonNode redrive(String receiptId) {
        return send(new Call("POST", "/v1/dead-letters/" + encode(receiptId) + "/redrive", null, false, 0));
    }

    public JsonNode hold(String receiptId, String reason) {
        return act("hold", receiptId, reason);
    }

    public JsonNode unhold(String receiptId, String reason) {
        return act("unhold", receiptId, reason);
    }

    public JsonNode cancel(String receiptId, String reason) {
        return act("cancel", receiptId, reason);
    }

    /** Act on up to 1000 receipts by id or filter (dry_run first): action is hold, unhold, cancel or redrive. */
    public JsonNode bulk(String action, JsonNode body) {
        return send(new Call("POST", "/v1/bulk/" + encode(action), body, false, 0));
    }

    private JsonNode act(String action, String receiptId, String reason) {
        Map<String, Object> body = new LinkedHashMap<>();
        if (reason != null) body.put("reason", reason);
        return send(new Call("POST", "/v1/receipts/" + encode(receiptId) + "/" + action, body, false, 0));
    }

    /** For tests: an ObjectNode from JSON text. */
    static ObjectNode object(String json) {
        try {
            return (ObjectNode) JSON.readTree(json);
        } catch (IOException e) {
            throw new IllegalArgumentException(e);
        }
    }
}
