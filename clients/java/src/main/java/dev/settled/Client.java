package dev.settled;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.URI;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import javax.net.ssl.SSLSocketFactory;

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
    /** Idle kept-alive connections kept at most. */
    static final int MAX_IDLE = 64;

    private final long connectTimeoutMs;
    // Requests go over plain sockets, HTTP/1.1 kept alive, on the calling thread: no selector
    // thread and no executor hand-offs per request (java.net.http's cost on a busy machine).
    private final String host;
    private final int port;
    private final boolean tls;
    private final String hostHeader;
    private final String basePath;
    private final ArrayDeque<Conn> idle = new ArrayDeque<>();
    private final ExecutorService async = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "settled-client");
        t.setDaemon(true);
        return t;
    });

    private Client(Builder b) {
        this.baseUrl = b.baseUrl.replaceAll("/+$", "");
        this.token = b.token == null || b.token.isEmpty() ? null : b.token;
        this.timeoutMs = b.timeoutMs;
        this.retries = b.retries;
        this.connectTimeoutMs = b.connectTimeoutMs;
        URI uri = URI.create(baseUrl);
        String scheme = uri.getScheme() == null ? "" : uri.getScheme().toLowerCase(java.util.Locale.ROOT);
        if (!scheme.equals("http") && !scheme.equals("https")) throw new IllegalArgumentException("not an http(s) URL: " + baseUrl);
        if (uri.getHost() == null) throw new IllegalArgumentException("no host in " + baseUrl);
        this.tls = scheme.equals("https");
        String h = uri.getHost();
        this.host = h.startsWith("[") && h.endsWith("]") ? h.substring(1, h.length() - 1) : h;
        this.port = uri.getPort() >= 0 ? uri.getPort() : tls ? 443 : 80;
        this.hostHeader = uri.getPort() >= 0 ? h + ":" + uri.getPort() : h;
        String path = uri.getRawPath() == null ? "" : uri.getRawPath();
        this.basePath = path.replaceAll("/+$", "");
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

        /** The request's head and body, as sent. */
        byte[][] encodeRequest() {
            byte[] bytes = null;
            if (!method.equals("GET")) {
                try {
                    bytes = JSON.writeValueAsBytes(body == null ? JSON.createObjectNode() : body);
                } catch (JsonProcessingException e) {
                    throw new IllegalArgumentException("cannot serialize the body of " + method + " " + path, e);
                }
            }
            StringBuilder h = new StringBuilder(256);
            h.append(method).append(' ').append(basePath).append(path).append(" HTTP/1.1\r\n")
                    .append("host: ").append(hostHeader).append("\r\n")
                    .append("accept: application/json\r\n");
            if (token != null) h.append("authorization: Bearer ").append(token).append("\r\n");
            if (bytes != null) h.append("content-type: application/json\r\ncontent-length: ").append(bytes.length).append("\r\n");
            h.append("\r\n");
            return new byte[][] {h.toString().getBytes(StandardCharsets.UTF_8), bytes};
        }

        /** The parsed answer of one try (null for an empty body). */
        JsonNode parse(Answer answer) {
            byte[] text = answer.body;
            int status = answer.status;
            if (status >= 400) throw problem(status, text, answer.retryAfter);
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

        /**
         * Start one try on a thread of its own; the future fails with this SDK's exceptions.
         * Cancelling it closes the request's connection (which ends a long poll on the server).
         */
        CompletableFuture<JsonNode> start() {
            CompletableFuture<JsonNode> future = new CompletableFuture<>();
            Cancel cancel = new Cancel();
            future.whenComplete((value, e) -> {
                if (future.isCancelled()) cancel.cancel();
            });
            try {
                async.execute(() -> {
                    if (future.isDone()) return;
                    try {
                        future.complete(parse(exchange(this, cancel)));
                    } catch (IOException e) {
                        future.completeExceptionally(new ConnectionFailedException(method + " " + path + ": " + e, e));
                    } catch (Throwable e) {
                        future.completeExceptionally(e);
                    }
                });
            } catch (java.util.concurrent.RejectedExecutionException e) {
                future.completeExceptionally(new ConnectionFailedException(method + " " + path + ": " + e, e));
            }
            return future;
        }
    }

    /** A status, its Retry-After and its body. */
    record Answer(int status, String retryAfter, byte[] body) {}

    /** Closes the connection of a request started with {@link Call#start}, once cancelled. */
    static final class Cancel {
        private Socket socket;
        private boolean cancelled;

        synchronized void cancel() {
            cancelled = true;
            if (socket != null) closeQuietly(socket);
        }

        /** The request now uses this socket; false when cancelled already. */
        synchronized boolean using(Socket s) {
            if (cancelled) return false;
            socket = s;
            return true;
        }

        /** The request is over: true when its connection may be used again. */
        synchronized boolean release() {
            socket = null;
            return !cancelled;
        }
    }

    /** A kept-alive HTTP/1.1 connection. */
    static final class Conn {
        final Socket socket;
        final BufferedInputStream in;
        final OutputStream out;

        Conn(Socket socket) throws IOException {
            this.socket = socket;
            this.in = new BufferedInputStream(socket.getInputStream(), 16 * 1024);
            this.out = new BufferedOutputStream(socket.getOutputStream(), 16 * 1024);
        }
    }

    static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException ignored) {
            // Closing anyway.
        }
    }

    private Conn connect() throws IOException {
        Socket s = tls ? SSLSocketFactory.getDefault().createSocket() : new Socket();
        try {
            s.setTcpNoDelay(true);
            s.connect(new InetSocketAddress(host, port), (int) Math.min(Integer.MAX_VALUE, Math.max(1, connectTimeoutMs)));
            return new Conn(s);
        } catch (IOException | RuntimeException e) {
            closeQuietly(s);
            throw e;
        }
    }

    private Conn idleConn() {
        synchronized (idle) {
            return idle.pollLast();
        }
    }

    private void keep(Conn c) {
        synchronized (idle) {
            if (idle.size() < MAX_IDLE) {
                idle.addLast(c);
                return;
            }
        }
        closeQuietly(c.socket);
    }

    /**
     * One request and its answer, on a kept-alive connection (HTTP/1.1, no thread of its own).
     * A kept connection the server closed meanwhile (nothing of an answer read) is replaced by a
     * new one once; the request had not reached the server.
     */
    Answer exchange(Call call, Cancel cancel) throws IOException {
        byte[][] request = call.encodeRequest();
        int timeout = (int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutMs + call.extraMs));
        for (int attempt = 0; ; attempt++) {
            Conn c = attempt == 0 ? idleConn() : null;
            boolean reused = c != null;
            if (c == null) c = connect();
            if (cancel != null && !cancel.using(c.socket)) {
                closeQuietly(c.socket);
                throw new java.io.InterruptedIOException("cancelled");
            }
            boolean[] started = {false};
            try {
                c.socket.setSoTimeout(timeout);
                c.out.write(request[0]);
                if (request[1] != null) c.out.write(request[1]);
                c.out.flush();
                boolean[] keepAlive = {true};
                Answer a = readAnswer(c.in, started, keepAlive);
                boolean ok = cancel == null || cancel.release();
                if (keepAlive[0] && ok) keep(c);
                else closeQuietly(c.socket);
                return a;
            } catch (IOException | RuntimeException e) {
                closeQuietly(c.socket);
                boolean cancelled = cancel != null && !cancel.release();
                if (reused && !started[0] && !cancelled && !(e instanceof java.net.SocketTimeoutException)) continue;
                throw e;
            }
        }
    }

    private static String line(InputStream in, boolean[] started) throws IOException {
        StringBuilder s = new StringBuilder(64);
        while (true) {
            int b = in.read();
            if (b < 0) {
                if (s.length() == 0 && !started[0]) throw new EOFException("connection closed before an answer");
                throw new EOFException("connection closed in an answer");
            }
            started[0] = true;
            if (b == '\n') break;
            if (s.length() > 64 * 1024) throw new IOException("an answer's header line is too long");
            s.append((char) b);
        }
        int n = s.length();
        if (n > 0 && s.charAt(n - 1) == '\r') s.setLength(n - 1);
        return s.toString();
    }

    private static byte[] readN(InputStream in, long n) throws IOException {
        if (n > Integer.MAX_VALUE - 16) throw new IOException("an answer too large: " + n + " bytes");
        byte[] b = in.readNBytes((int) n);
        if (b.length < n) throw new EOFException("connection closed in an answer's body");
        return b;
    }

    static Answer readAnswer(InputStream in, boolean[] started, boolean[] keepAlive) throws IOException {
        while (true) {
            String status = line(in, started);
            if (!status.startsWith("HTTP/1.") || status.length() < 12) throw new IOException("not an HTTP answer: " + status);
            boolean http10 = status.startsWith("HTTP/1.0");
            int code;
            try {
                code = Integer.parseInt(status.substring(9, 12));
            } catch (NumberFormatException e) {
                throw new IOException("not an HTTP answer: " + status);
            }
            long length = -1;
            boolean chunked = false;
            String retryAfter = null;
            String connection = null;
            while (true) {
                String h = line(in, started);
                if (h.isEmpty()) break;
                int colon = h.indexOf(':');
                if (colon <= 0) continue;
                String name = h.substring(0, colon).trim().toLowerCase(java.util.Locale.ROOT);
                String value = h.substring(colon + 1).trim();
                switch (name) {
                    case "content-length" -> {
                        try {
                            length = Long.parseLong(value);
                        } catch (NumberFormatException e) {
                            throw new IOException("a bad content-length: " + value);
                        }
                    }
                    case "transfer-encoding" -> chunked = value.toLowerCase(java.util.Locale.ROOT).contains("chunked");
                    case "retry-after" -> { if (retryAfter == null) retryAfter = value; }
                    case "connection" -> connection = value.toLowerCase(java.util.Locale.ROOT);
                    default -> { }
                }
            }
            if (code >= 100 && code < 200) continue; // 100 Continue and the like: the answer follows
            keepAlive[0] = connection != null ? !connection.contains("close") : !http10;
            byte[] body;
            if (code == 204 || code == 304) {
                body = new byte[0];
            } else if (chunked) {
                java.io.ByteArrayOutputStream all = new java.io.ByteArrayOutputStream();
                while (true) {
                    String size = line(in, started);
                    int semi = size.indexOf(';');
                    long n;
                    try {
                        n = Long.parseLong((semi >= 0 ? size.substring(0, semi) : size).trim(), 16);
                    } catch (NumberFormatException e) {
                        throw new IOException("a bad chunk size: " + size);
                    }
                    if (n == 0) {
                        while (!line(in, started).isEmpty()) { } // trailers
                        break;
                    }
                    all.write(readN(in, n));
                    line(in, started);
                }
                body = all.toByteArray();
            } else if (length >= 0) {
                body = readN(in, length);
            } else {
                body = in.readAllBytes();
                keepAlive[0] = false;
            }
            return new Answer(code, retryAfter, body);
        }
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
        Answer answer;
        try {
            answer = exchange(call, null);
        } catch (IOException e) {
            throw new ConnectionFailedException(call.method + " " + call.path + ": " + e, e);
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
