"""An OTLP/HTTP sink for benchmarks: answers every POST /v1/traces with 200
and counts requests and bytes (printed on SIGTERM as one JSON line). Never the
bottleneck: it does not decode what it receives."""

import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {"requests": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        self.rfile.read(length)
        counts["requests"] += 1
        counts["bytes"] += length
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink)


def stop(*_: object) -> None:
    print(json.dumps(counts), flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
server.serve_forever()
