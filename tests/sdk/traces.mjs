// The TypeScript SDK continues a producer's trace (docs/operators.md, "Traces").
//
// Starts settled (SQLite), enqueues receipts with producers' traceparents, and
// runs a worker with OpenTelemetry's SDK (in-memory exporter, async-hooks
// context manager): each handler must run inside a `settle receipt` span whose
// parent is the producer's span, in the producer's trace, and see it as the
// active span; a receipt enqueued without a context gets a trace of its own.
// Run by tests/sdk/driver.rs.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const root = new URL("../../", import.meta.url).pathname;
const sdkDir = join(root, "clients/typescript");
// The SDK's own node_modules hold OpenTelemetry (its dev dependencies).
const require = createRequire(join(sdkDir, "package.json"));
const api = require("@opentelemetry/api");
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require("@opentelemetry/sdk-trace-base");
const { AsyncLocalStorageContextManager } = require("@opentelemetry/context-async-hooks");
const { Client, Worker } = await import(pathToFileURL(join(sdkDir, "dist/index.js")).href);

const exporter = new InMemorySpanExporter();
api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());

const tmp = mkdtempSync(join(tmpdir(), "settled-traces-"));
const server = spawn(
  process.env.SETTLED_BIN,
  ["--listen", "127.0.0.1:0", "--database-url", `sqlite:${join(tmp, "t.db")}`, "--log-format", "json"],
  { cwd: tmp, stdio: ["ignore", "pipe", "inherit"] },
);
const base = await new Promise((resolve, reject) => {
  const lines = createInterface({ input: server.stdout });
  lines.on("line", (line) => {
    try {
      const address = JSON.parse(line).fields?.address;
      if (address) resolve(`http://${address}`);
    } catch {}
  });
  server.on("exit", (code) => reject(new Error(`settled exited (${code}) before listening`)));
});

try {
  const producers = {
    "t-1": ["4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"],
    "t-2": ["0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"],
  };
  const enqueue = async (receipt_id, headers) => {
    const answer = await fetch(`${base}/v1/receipts`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify({ receipt_id, finalized_at: 1 }),
    });
    assert.equal(answer.status, 201, await answer.text());
  };
  for (const [id, [traceId, spanId]] of Object.entries(producers)) {
    await enqueue(id, { traceparent: `00-${traceId}-${spanId}-01`, tracestate: "vendor=x" });
  }
  await enqueue("plain", {});

  const seen = {};
  const worker = new Worker(new Client(base), {
    workerId: "traced",
    concurrency: 4,
    handler: async (job) => {
      await new Promise((r) => setTimeout(r, 5)); // the span stays active across awaits
      seen[job.receiptId] = api.trace.getActiveSpan()?.spanContext();
      if (Object.keys(seen).length === 3) worker.stop();
      return `tx-${job.receiptId}`;
    },
  });
  await worker.run();

  const spans = Object.fromEntries(
    exporter
      .getFinishedSpans()
      .filter((s) => s.name === "settle receipt")
      .map((s) => [s.attributes["settled.receipt_id"], s]),
  );
  for (const [id, [traceId, spanId]] of Object.entries(producers)) {
    const span = spans[id];
    assert.ok(span, `no span for ${id}`);
    assert.equal(span.spanContext().traceId, traceId, `${id}: not in the producer's trace`);
    assert.equal(span.parentSpanContext?.spanId ?? span.parentSpanId, spanId, `${id}: parent`);
    assert.equal(span.kind, api.SpanKind.CONSUMER);
    assert.equal(span.attributes["settled.outcome.kind"], "accepted");
    assert.equal(span.attributes["settled.worker_id"], "traced");
    assert.equal(seen[id]?.spanId, span.spanContext().spanId, `${id}: the handler runs inside it`);
  }
  const plain = spans["plain"];
  assert.ok(plain && !(plain.parentSpanContext ?? plain.parentSpanId));
  assert.ok(Object.values(producers).every(([t]) => t !== plain.spanContext().traceId));
  console.log("typescript SDK traces: the handler spans continue the producers' traces");
} finally {
  server.kill("SIGTERM");
  rmSync(tmp, { recursive: true, force: true });
}
