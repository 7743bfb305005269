"""Requests through the nginx example (deploy/proxy/nginx.conf) to a real settled.

Run by tests/deploy/validate.sh with nginx listening on loopback:
    proxy_smoke.py HTTPS_BASE HTTP_BASE CA_FILE OPERATOR_TOKEN

Checks what a proxy most often gets wrong: TLS, the redirect from plain HTTP, the body
limit, a long poll held open, /metrics kept private, and an event stream that delivers
each event as it is sent (not when a buffer fills).
"""

import http.client
import json
import ssl
import sys
import threading
import time
import urllib.parse

HTTPS_BASE, HTTP_BASE, CA_FILE, TOKEN = sys.argv[1:5]
TLS = ssl.create_default_context(cafile=CA_FILE)


def connect(base, timeout=10):
    url = urllib.parse.urlsplit(base)
    if url.scheme == "https":
        return http.client.HTTPSConnection(url.hostname, url.port, context=TLS, timeout=timeout)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)


def call(method, path, body=None, base=HTTPS_BASE, raw=None, timeout=10):
    conn = connect(base, timeout)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
    if data is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, resp.headers, payload


def expect(what, got, want):
    if got != want:
        sys.exit(f"proxy smoke: {what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


status, _, body = call("GET", "/readyz")
expect("GET /readyz over TLS", (status, json.loads(body)), (200, {"status": "ready"}))

status, headers, _ = call("GET", "/readyz", base=HTTP_BASE)
expect("plain HTTP redirected to HTTPS", (status, headers["Location"].startswith("https://")), (308, True))

status, _, _ = call("GET", "/metrics")
expect("/metrics not served through the proxy", status, 404)

status, _, _ = call("POST", "/v1/receipts", raw=b"{" + b" " * (2 * 1024 * 1024) + b"}")
expect("a 2 MiB body refused", status, 413)

started = time.monotonic()
status, _, body = call("POST", "/v1/claims", {"worker_id": "proxy", "lease_ms": 30000, "limit": 1, "wait_ms": 2000})
waited = time.monotonic() - started
expect("a long poll held open through the proxy", (status, json.loads(body)["claims"], waited >= 1.8), (200, [], True))

# The event stream: open it, then make one history entry; it must arrive at once.
stream = connect(HTTPS_BASE, timeout=10)
stream.request("GET", "/v1/history", headers={"Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"})
resp = stream.getresponse()
expect("stream answered", (resp.status, resp.headers["Content-Type"].split(";")[0]), (200, "text/event-stream"))
received = []


def read_stream():
    try:
        while True:
            line = resp.readline()
            if not line:
                return
            if line.startswith(b"data:"):
                received.append((time.monotonic(), json.loads(line[5:])))
                return
    except OSError:
        return


reader = threading.Thread(target=read_stream, daemon=True)
reader.start()
receipt = f"proxy-{int(time.time() * 1000)}"
status, _, _ = call("POST", "/v1/receipts", {"receipt_id": receipt, "finalized_at": 1764460800, "observation": {"amount_cents": 1}})
expect("enqueued", status, 201)
status, _, body = call("POST", "/v1/claims", {"worker_id": "proxy", "lease_ms": 30000, "limit": 1})
claim = json.loads(body)["claims"][0]
committed = time.monotonic()
status, _, _ = call("POST", f"/v1/receipts/{receipt}/outcome", {"claim": claim, "outcome": {"kind": "accepted", "transcript_id": "tx-proxy"}})
expect("outcome recorded", status, 200)
reader.join(timeout=5)
stream.close()
if not received:
    sys.exit("proxy smoke: the history event did not come through the proxy within 5 s (buffered?)")
at, entry = received[0]
expect("history event streamed through the proxy", entry["receipt_id"], receipt)
print(f"ok: the event arrived {max(0.0, at - committed) * 1000:.0f} ms after the outcome")
