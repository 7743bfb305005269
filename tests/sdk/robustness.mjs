// The TypeScript SDK never strands a receipt and never dies on a fault.
//
// Against the real server (SQLite in a temporary directory) and, for answers the real server
// never gives, a small HTTP server or proxy in this process: failure codes outside the spec
// (a type error, and at run time), transcript ids the server refuses, rail codes, onError
// hooks that throw or give nothing, answers that are not JSON, a stop with a claim in
// flight, a stuck handler, 500 internal_error, Ctrl-C on an idle worker, and a group held
// back by its rate while another has work. Each check prints what it showed; any failure
// (or an unhandled rejection anywhere) exits 1.
//
//     SETTLED_BIN=target/debug/settled node tests/sdk/robustness.mjs [name-substring...]
//
// Run by tests/sdk/driver.rs (from the repository root, SETTLED_BIN set).

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = resolve(fileURLToPath(new URL("../../", import.meta.url)));
const sdkDir = join(root, "clients/typescript");
const sdk = await import(pathToFileURL(join(sdkDir, "dist/index.js")).href);
const { Client, Worker, Permanent, Retryable, Skip, InvalidOutcome, ProblemError, OutcomeRefused } = sdk;

const BIN = process.env.SETTLED_BIN ? resolve(process.env.SETTLED_BIN) : undefined;
if (!BIN) {
  console.error("robustness.mjs: set SETTLED_BIN to the settled binary (cargo build --bin settled)");
  process.exit(2);
}
const tmp = mkdtempSync(join(tmpdir(), "settled-robustness-"));
const only = process.argv.slice(2);

// Anything left to reject unobserved, by the SDK or by this script, fails the run.
const unhandled = [];
process.on("unhandledRejection", (e) => unhandled.push(e));

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

async function waitFor(what, check, timeoutMs = 20_000, everyMs = 25) {
  const end = now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** A promise's value, or an error naming `what` once `ms` have passed. */
function within(ms, what, promise) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took more than ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// ---------------------------------------------------------------------------
// The real server

const servers = new Set();
let serial = 0;

/** A settled server of its own; a short retry policy so that retries and dead letters come fast. */
async function startServer(extra = []) {
  const db = join(tmp, `s${++serial}.db`);
  const args = ["--listen", "127.0.0.1:0", "--database-url", `sqlite:${db}`, "--log-format", "json",
    "--max-retries", "2", "--initial-backoff-ms", "1", "--backoff-cap-ms", "20", ...extra];
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SETTLED_")));
  env.RUST_LOG = "warn,settled::server=info";
  const proc = spawn(BIN, args, { cwd: tmp, env, stdio: ["ignore", "pipe", "inherit"] });
  servers.add(proc);
  const base = await within(60_000, "the server's start", new Promise((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout });
    lines.on("line", (line) => {
      try {
        const address = JSON.parse(line).fields?.address;
        if (address) resolve(`http://${address}`);
      } catch {
        // Not a log line of the server's: ignore.
      }
    });
    proc.on("error", reject);
    proc.on("exit", (code) => reject(new Error(`settled exited (${code}) before listening`)));
  }));
  const call = async (method, path, body) => {
    const answer = await fetch(base + path, {
      method,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await answer.text();
    return { status: answer.status, body: text ? JSON.parse(text) : undefined };
  };
  return {
    base,
    call,
    async enqueue(receipt_id, more = {}) {
      const a = await call("POST", "/v1/receipts", { receipt_id, finalized_at: 1_764_460_800, observation: { amount_cents: 100 }, ...more });
      assert.ok(a.status === 201 || a.status === 200, `enqueue ${receipt_id}: ${JSON.stringify(a.body)}`);
    },
    async enqueueMany(ids, more = {}) {
      const receipts = ids.map((receipt_id) => ({ receipt_id, finalized_at: 1_764_460_800, ...more }));
      const a = await call("POST", "/v1/receipts/batch", { receipts });
      assert.equal(a.status, 200, JSON.stringify(a.body));
    },
    async receipt(id) {
      const a = await call("GET", `/v1/receipts/${encodeURIComponent(id)}`);
      assert.equal(a.status, 200, JSON.stringify(a.body));
      return a.body;
    },
    async leased() {
      const a = await call("GET", "/v1/receipts?state=leased&limit=500");
      assert.equal(a.status, 200, JSON.stringify(a.body));
      return a.body.receipts.map((r) => r.receipt_id);
    },
    async spec() {
      return (await fetch(`${base}/openapi.json`)).text();
    },
    stop() {
      servers.delete(proc);
      proc.kill("SIGTERM");
    },
  };
}

// ---------------------------------------------------------------------------
// Fakes: a server of this process's own, or a proxy in front of the real one

/**
 * An HTTP server whose `answer(req, body, forward)` decides: return `[status, body]` or
 * `forward()`'s result (the real server's `[status, body, headers]`), or null to never answer.
 */
async function fakeServer(answer, upstream) {
  const counts = {};
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const path = req.url.split("?")[0];
      counts[path] = (counts[path] ?? 0) + 1;
      const body = Buffer.concat(chunks).toString();
      const forward = async () => {
        const a = await fetch(upstream + req.url, {
          method: req.method,
          headers: { "content-type": req.headers["content-type"] ?? "application/json" },
          body: req.method === "GET" ? undefined : body,
        });
        return [a.status, await a.text(), a.headers.get("content-type")];
      };
      try {
        const out = await answer(req, body, forward, path);
        if (out === null) return; // never answers
        const [status, text, type] = out;
        res.writeHead(status, { "content-type": type ?? "application/json" });
        res.end(text);
      } catch (e) {
        res.writeHead(599);
        res.end(String(e));
      }
    });
  });
  server.keepAliveTimeout = 1;
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    counts,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

const problem = (status, code, cls, detail = code) =>
  [status, JSON.stringify({ type: "about:blank", title: "x", status, detail, code, class: cls }), "application/problem+json"];

// ---------------------------------------------------------------------------
// A worker, watched

/** A Worker whose logs and events are kept; `run` is its run() promise, watched for rejection. */
function watched(base, options) {
  const logs = [];
  const events = [];
  const logger = {
    info: (m) => logs.push(["info", m]),
    warn: (m) => logs.push(["warn", m]),
    error: (m) => logs.push(["error", m]),
  };
  const worker = new Worker(new Client(base, options.client), {
    concurrency: 4,
    leaseMs: 20_000,
    waitMs: 1_000,
    shutdownTimeoutMs: 5_000,
    logger,
    onEvent: (event, job, info) => events.push({ event, id: job?.receiptId, info }),
    ...options,
  });
  let runError;
  const run = worker.run().catch((e) => {
    runError = e;
  });
  const stop = async () => {
    const t = now();
    await within(worker["o"].shutdownTimeoutMs + 500, "stop()", worker.stop());
    await run;
    return now() - t;
  };
  return { worker, logs, events, run, stop, error: () => runError };
}

const historyOf = (view, outcome) => view.history.filter((h) => h.outcome === outcome);
const failureCode = (view) => view.dead_letter?.code ?? view.last_failure?.code;

// ---------------------------------------------------------------------------
// The checks

const checks = [];
const check = (name, fn) => checks.push([name, fn]);

check("unknown failure codes are a type error under tsc --strict", async () => {
  const dir = mkdtempSync(join(tmp, "tsc-"));
  const index = join(sdkDir, "dist/index.js");
  const config = {
    compilerOptions: {
      strict: true, noEmit: true, target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext",
      lib: ["ES2022", "DOM"], types: [], skipLibCheck: true,
    },
  };
  writeFileSync(join(dir, "tsconfig.json"), JSON.stringify(config));
  writeFileSync(join(dir, "package.json"), JSON.stringify({ type: "module" }));
  const tsc = join(sdkDir, "node_modules/.bin/tsc");
  const compile = (source) => {
    writeFileSync(join(dir, "snippet.ts"), source);
    const out = spawnSync(tsc, ["-p", dir], { encoding: "utf8" });
    return { status: out.status, text: out.stdout + out.stderr };
  };
  const head = `import { Permanent, Retryable, Skip } from ${JSON.stringify(index)};\n`;
  const good = compile(`${head}
new Permanent("verification", { detail: "declined", railCode: "card_declined" });
new Retryable("rpc", "timeout", 500);
new Retryable("backend", { retryAfterMs: 30_000, railCode: "rate_limited" });
new Skip("zero_charge");
`);
  assert.equal(good.status, 0, `the spec's codes must compile:\n${good.text}`);
  const wrong = ['new Permanent("card_declined");', 'new Retryable("timeout");', 'new Skip("not_needed");'];
  const bad = compile(head + wrong.join("\n") + "\n");
  assert.notEqual(bad.status, 0, "tsc accepted codes outside the spec");
  wrong.forEach((line, i) => {
    const value = /"(\w+)"/.exec(line)[1];
    assert.match(bad.text, new RegExp(`snippet\\.ts\\(${i + 2},\\d+\\): error TS2345: Argument of type '"${value}"'`), bad.text);
  });
  return "tsc passes the spec's codes and flags Permanent(\"card_declined\"), Retryable(\"timeout\"), Skip(\"not_needed\") (TS2345)";
});

check("unknown failure codes are refused at once at run time", async () => {
  for (const make of [() => new Permanent("card_declined"), () => new Retryable("timeout"), () => new Skip("nope"),
    () => new Permanent("verification", { railCode: "has space" }), () => new Retryable("rpc", { retryAfterMs: -1 })]) {
    assert.throws(make, (e) => e instanceof InvalidOutcome, String(make));
  }
  let message = "";
  try {
    new Permanent("card_declined");
  } catch (e) {
    message = e.message;
  }
  assert.match(message, /card_declined/);
  assert.match(message, /verification/);
  assert.match(message, /railCode/);
  return `the constructors throw InvalidOutcome naming the allowed codes: ${message.slice(0, 90)}…`;
});

/**
 * A handler that makes an outcome the server would never take, every time: the receipt must
 * use up an attempt each time (never run again at the same attempt), end dead-lettered with a
 * visible code within one lease, and the worker must go on.
 */
async function foreverRefused({ handler, code, label }) {
  const s = await startServer();
  try {
    await s.enqueue("bad");
    const attempts = [];
    const started = now();
    const w = watched(s.base, {
      workerId: "refused",
      leaseMs: 20_000,
      handler: async (job) => {
        attempts.push(job.attempt);
        if (job.receiptId === "bad") return handler(job);
        return `tx-${job.receiptId}`;
      },
    });
    const view = await waitFor("the receipt dead-lettered", async () => {
      const v = await s.receipt("bad");
      return v.state === "dead_lettered" ? v : undefined;
    });
    const took = now() - started;
    assert.ok(took < 20_000, `took ${took} ms: longer than one lease`);
    assert.deepEqual(attempts, [1, 2, 3], "the handler ran again without an attempt counted");
    assert.equal(failureCode(view), "backend", JSON.stringify(view));
    assert.equal(historyOf(view, "retryable").length, 3);
    // The worker goes on: a good receipt after it is settled.
    await s.enqueue("good");
    await waitFor("the next receipt settled", async () => (await s.receipt("good")).state === "settled");
    const refusals = w.events.filter((e) => e.event === "outcome_refused");
    assert.equal(refusals.length, 3, JSON.stringify(w.events));
    assert.ok(refusals.every((e) => e.info.code === code && e.info.fallback === true), JSON.stringify(refusals));
    assert.equal(w.worker.stats.outcomesRefused, 3);
    assert.equal(w.worker.stats.errors[code], 3);
    const logged = w.logs.filter(([, m]) => m.includes("refused") && m.includes(code));
    assert.equal(logged.length, 3, JSON.stringify(w.logs));
    await w.stop();
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `${label}: attempts 1, 2, 3 then dead-lettered with code backend in ${Math.round(took)} ms (lease 20 s), ` +
      `3 refusals counted, logged and sent to onEvent (${code}); the worker settled the next receipt`;
  } finally {
    s.stop();
  }
}

check("a code forced past the constructor", () =>
  foreverRefused({
    code: "invalid_outcome",
    label: "Permanent with its code changed to card_declined after it was made",
    handler: () => {
      const e = new Permanent("verification");
      e.code = "card_declined";
      throw e;
    },
  }),
);

check("a code thrown straight from the handler", () =>
  foreverRefused({
    code: "invalid_outcome",
    label: "new Permanent(\"card_declined\") in the handler",
    handler: () => {
      throw new Permanent("card_declined");
    },
  }),
);

check("a transcript id over 512 bytes", () =>
  foreverRefused({
    code: "invalid_transcript_id",
    label: "a 600-byte transcript id (422 invalid_transcript_id from the server)",
    handler: () => "t".repeat(600),
  }),
);

check("railCode is kept in the receipt's history", async () => {
  const s = await startServer();
  try {
    if (!(await s.spec()).includes("rail_code")) {
      return "SKIPPED: this server does not know rail_code yet";
    }
    await s.enqueue("declined");
    const w = watched(s.base, {
      workerId: "rail",
      handler: () => {
        throw new Permanent("verification", { detail: "declined by the issuer", railCode: "card_declined" });
      },
    });
    const view = await waitFor("the receipt dead-lettered", async () => {
      const v = await s.receipt("declined");
      return v.state === "dead_lettered" ? v : undefined;
    });
    await w.stop();
    assert.equal(historyOf(view, "permanent")[0]?.rail_code, "card_declined", JSON.stringify(view));
    assert.equal(view.last_failure?.rail_code, "card_declined", JSON.stringify(view));
    assert.equal(failureCode(view), "verification");
    const found = await s.call("GET", "/v1/receipts?state=dead_lettered&rail_code=card_declined");
    assert.deepEqual(found.body.receipts.map((r) => r.receipt_id), ["declined"]);
    assert.equal(w.worker.stats.outcomesRefused, 0);
    return "Permanent(\"verification\", { railCode: \"card_declined\" }) shows rail_code in the history, last_failure and ?rail_code=";
  } finally {
    s.stop();
  }
});

check("onError that throws, rejects or returns nothing", async () => {
  const s = await startServer();
  try {
    const hooks = {
      throws: () => {
        throw new Error("hook bug");
      },
      rejects: async () => {
        throw new Error("async hook bug");
      },
      nothing: () => undefined,
    };
    for (const id of Object.keys(hooks)) await s.enqueue(id);
    const w = watched(s.base, {
      workerId: "hooks",
      handler: () => {
        throw new TypeError("handler bug");
      },
      onError: (error, job) => hooks[job.receiptId](error, job),
    });
    for (const id of Object.keys(hooks)) {
      const view = await waitFor(`${id}: an outcome reported`, async () => {
        const v = await s.receipt(id);
        return ["retry_scheduled", "dead_lettered"].includes(v.state) || historyOf(v, "retryable").length ? v : undefined;
      });
      assert.equal(historyOf(view, "retryable")[0]?.code, "rpc", JSON.stringify(view));
    }
    const t = await w.stop();
    assert.ok(t < 5_000, `stop took ${t} ms`);
    assert.deepEqual(await s.leased(), []);
    assert.ok(w.worker.stats.errors.on_error >= 3, JSON.stringify(w.worker.stats.errors));
    assert.ok(w.logs.some(([, m]) => m.includes("onError failed")), JSON.stringify(w.logs));
    assert.equal(w.error(), undefined);
    return "each reported the default outcome (retryable rpc), counted as on_error and logged; " +
      `nothing leased after stop (${Math.round(t)} ms), the process alive`;
  } finally {
    s.stop();
  }
});

check("claim answers that are not JSON, or cut short", async () => {
  const s = await startServer();
  let claims = 0;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (path !== "/v1/claims") return forward();
    claims++;
    if (claims === 1) return [200, "<html>gateway says hello</html>", "text/html"];
    if (claims === 2) {
      // The server leased what it found; the worker never learns of it.
      const [status, text] = await forward();
      return [status, text.slice(0, Math.floor(text.length / 2))];
    }
    return forward();
  }, s.base);
  try {
    await s.enqueue("r1");
    const w = watched(proxy.base, { workerId: "garbled-claims", leaseMs: 2_000, waitMs: 500, handler: (job) => `tx-${job.receiptId}` });
    // Leased by the cut answer, r1 comes back when that lease ends, and is settled then.
    const view = await waitFor("r1 settled", async () => {
      const v = await s.receipt("r1");
      return v.state === "settled" ? v : undefined;
    });
    assert.equal(historyOf(view, "accepted").length, 1);
    assert.ok(w.worker.stats.errors.invalid_answer >= 2, JSON.stringify(w.worker.stats.errors));
    assert.ok(w.logs.some(([, m]) => m.includes("not JSON")), JSON.stringify(w.logs));
    const t = await w.stop();
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return "an HTML page and a cut answer were logged and counted (invalid_answer), the loop went on; " +
      `the receipt leased by the cut answer came back with its lease and was settled once; stop ${Math.round(t)} ms, nothing leased`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("outcome answers that are not JSON", async () => {
  const s = await startServer();
  let sends = 0;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (path !== "/v1/outcomes") return forward();
    sends++;
    if (sends === 1) return [200, '{"results": [{"receipt_id": "o1", "ro', "application/json"];
    if (sends === 2) {
      // Recorded by the server, answered with nonsense: the next send is refused with 409.
      await forward();
      return [200, "not json at all", "text/plain"];
    }
    return forward();
  }, s.base);
  try {
    await s.enqueue("o1");
    const w = watched(proxy.base, { workerId: "garbled-outcomes", handler: (job) => `tx-${job.receiptId}` });
    const view = await waitFor("o1 settled", async () => {
      const v = await s.receipt("o1");
      return v.state === "settled" ? v : undefined;
    });
    await waitFor("a third send", () => sends >= 3);
    await waitFor("the job done", () => w.worker["leases"].size === 0);
    const t = await w.stop();
    assert.equal(historyOf(view, "accepted").length, 1);
    assert.ok(w.worker.stats.errors.invalid_answer >= 2, JSON.stringify(w.worker.stats.errors));
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `two unreadable outcome answers were retried (${sends} sends), the receipt settled once, ` +
      `stop ${Math.round(t)} ms, nothing leased`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("stopping with a claim in flight", async () => {
  const s = await startServer();
  let held;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (path !== "/v1/claims") return forward();
    const answer = await forward();
    if (JSON.parse(answer[1]).claims?.length) {
      // Hold the answer until the worker is told to stop: it arrives while the stop is on.
      await new Promise((release) => (held = release));
    }
    return answer;
  }, s.base);
  try {
    const abort = new AbortController();
    const w = watched(proxy.base, { workerId: "mid-claim", waitMs: 5_000, signal: abort.signal, handler: () => "tx" });
    await sleep(300); // the long poll is waiting
    await s.enqueueMany(["m1", "m2"]);
    await waitFor("the claim answered by the server", () => held);
    abort.abort();
    held();
    const t0 = now();
    await within(5_000, "run() after the abort", w.run);
    const t = now() - t0;
    for (const id of ["m1", "m2"]) {
      const view = await s.receipt(id);
      assert.equal(view.state, "pending", JSON.stringify(view));
      assert.equal(historyOf(view, "released").length, 1, JSON.stringify(view));
    }
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.worker.stats.released, 2);
    assert.equal(w.error(), undefined);
    // An idle one: its long poll is cancelled, and nothing is leased.
    const idle = watched(s.base, { workerId: "idle", waitMs: 10_000, handler: () => "tx" });
    await sleep(500);
    const t1 = now();
    await idle.stop();
    const idleStop = now() - t1;
    assert.ok(idleStop < 1_000, `an idle worker took ${idleStop} ms to stop`);
    assert.deepEqual(await s.leased(), []);
    return `the answer that came in after the abort was released (2 receipts pending again, history "released") ` +
      `in ${Math.round(t)} ms; an idle worker stopped in ${Math.round(idleStop)} ms; nothing leased`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("a handler that never ends", async () => {
  const s = await startServer();
  try {
    await s.enqueue("stuck");
    let started = false;
    const w = watched(s.base, {
      workerId: "stuck",
      shutdownTimeoutMs: 1_500,
      handler: () => {
        started = true;
        return new Promise(() => {}); // ignores its signal
      },
    });
    await waitFor("the handler started", () => started);
    const t = await w.stop();
    assert.ok(t <= 1_500 + 300, `stop() took ${t} ms, shutdownTimeoutMs 1500`);
    const view = await waitFor("the lease released", async () => {
      const v = await s.receipt("stuck");
      return historyOf(v, "released").length === 1 ? v : undefined;
    }, 5_000);
    assert.equal(view.state, "pending", JSON.stringify(view));
    assert.deepEqual(await s.leased(), []);
    return `stop() resolved in ${Math.round(t)} ms (shutdownTimeoutMs 1500), the lease released`;
  } finally {
    s.stop();
  }
});

check("500 internal_error", async () => {
  // Everything answers 500.
  const fake = await fakeServer(async () => problem(500, "internal_error", "internal", "a handler panicked"));
  try {
    const client = new Client(fake.base, { retries: 3 });
    const t0 = now();
    const err = await client.enqueue({ receipt_id: "e1", finalized_at: 1 }).then(() => undefined, (e) => e);
    assert.ok(err instanceof ProblemError && err.code === "internal_error" && err.internal, String(err));
    assert.equal(fake.counts["/v1/receipts"], 4, "enqueue: 1 + retries requests");
    const enqueueMs = now() - t0;

    const w = watched(fake.base, { workerId: "fivehundred", waitMs: 1_000, handler: () => "tx" });
    await sleep(2_500);
    const claims = fake.counts["/v1/claims"] ?? 0;
    const t = await w.stop();
    assert.ok(claims >= 2 && claims <= 8, `${claims} claims in 2.5 s`);
    assert.ok(w.worker.stats.errors.internal_error >= 2);
    assert.equal(w.error(), undefined);
    return `enqueue gave up after 4 requests (retries 3, ${Math.round(enqueueMs)} ms) with ProblemError internal_error; ` +
      `the claim loop stayed alive with ${claims} claims in 2.5 s (no storm), stop ${Math.round(t)} ms`;
  } finally {
    fake.close();
  }
});

check("500 internal_error on outcomes", async () => {
  const s = await startServer();
  let carried = 0;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (path === "/v1/outcomes") return problem(500, "internal_error", "internal");
    if (path === "/v1/claims" && JSON.parse(body).outcomes?.length) {
      // A claim carrying the outcome fails as a whole, as POST /v1/outcomes does.
      carried++;
      return problem(500, "internal_error", "internal");
    }
    return forward();
  }, s.base);
  try {
    await s.enqueue("f1");
    const w = watched(proxy.base, { workerId: "outcomes-500", leaseMs: 3_000, handler: () => "tx" });
    const lost = await waitFor("the lease given up", () => w.events.find((e) => e.event === "lease_lost"), 10_000);
    const sends = (proxy.counts["/v1/outcomes"] ?? 0) + carried;
    const extends_ = w.worker.stats.leasesExtended;
    await w.stop();
    assert.equal(lost.info.reason, "local deadline passed");
    assert.ok(sends >= 2 && sends <= 40, `${sends} outcome sends in one 3 s lease`);
    assert.equal(extends_, 0, "a lease whose outcome the server fails on is not extended");
    assert.equal(w.error(), undefined);
    return `the outcome was sent ${sends} times (${carried} in claims) while its 3 s lease lasted (not extended), then given up`;
  } finally {
    proxy.close();
    s.stop();
  }
});

/** The receipt ids of the outcomes a request body carries. */
const outcomeIds = (body) => {
  try {
    return (JSON.parse(body).outcomes ?? []).map((item) => item.claim.receipt_id);
  } catch {
    return [];
  }
};

check("outcomes ride along with claims", async () => {
  const s = await startServer();
  const carried = { "/v1/claims": 0, "/v1/outcomes": 0 };
  let longInClaims = 0;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (req.method === "POST" && path in carried) {
      carried[path] += outcomeIds(body).length;
      if (path === "/v1/claims" && body.includes("t".repeat(600))) longInClaims++;
    }
    return forward();
  }, s.base);
  try {
    const ids = Array.from({ length: 30 }, (_, i) => `ride-${String(i).padStart(2, "0")}`);
    await s.enqueueMany(ids);
    // One slot: a claim goes out once the job is done, and carries its outcome (one that finds a
    // claim out, a long poll, waits for the next one a short linger at most, then goes alone).
    const w = watched(proxy.base, {
      workerId: "ride",
      concurrency: 1,
      handler: async (job) => {
        await sleep(20);
        return job.receiptId === "long" ? "t".repeat(600) : `tx-${job.receiptId}`;
      },
    });
    await waitFor("30 acknowledged", () => w.worker.stats.settled === 30);
    const busy = { ...carried };
    const requests = { claims: proxy.counts["/v1/claims"], outcomes: proxy.counts["/v1/outcomes"] ?? 0 };
    assert.ok(busy["/v1/claims"] >= 25, `outcomes did not ride in claims: ${JSON.stringify(busy)}`);
    assert.ok(requests.outcomes <= 5, `too many POST /v1/outcomes: ${JSON.stringify(requests)}`);
    assert.equal(busy["/v1/claims"] + busy["/v1/outcomes"], 30, JSON.stringify(busy));
    assert.equal(w.worker.stats.leasesLost, 0);
    // An item refused in a claim's results: onError's outcome instead, counted, an event.
    await s.enqueue("long");
    const view = await waitFor("long dead-lettered", async () => {
      const v = await s.receipt("long");
      return v.state === "dead_lettered" ? v : undefined;
    });
    assert.equal(view.attempts, 3, JSON.stringify(view));
    assert.equal(failureCode(view), "backend", JSON.stringify(view));
    const refusals = w.events.filter((e) => e.event === "outcome_refused");
    assert.equal(refusals.length, 3, JSON.stringify(refusals));
    assert.ok(refusals.every((e) => e.info.code === "invalid_transcript_id" && e.info.status === 422), JSON.stringify(refusals));
    assert.equal(w.worker.stats.outcomesRefused, 3);
    assert.ok(longInClaims >= 1, "the refused outcome never rode in a claim");
    for (const id of ids.slice(0, 5)) assert.equal(historyOf(await s.receipt(id), "accepted").length, 1);
    const t = await w.stop();
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `30 receipts: ${busy["/v1/claims"]} outcomes in ${requests.claims} claims, ${busy["/v1/outcomes"]} in ` +
      `${requests.outcomes} POST /v1/outcomes; a 600-byte transcript refused in a claim's results 3 times ` +
      `(${longInClaims} in claims), dead-lettered with code backend; stop ${Math.round(t)} ms`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("a slow onError after a refusal is reported", async () => {
  // A refused outcome whose onError takes its time while other jobs finish and claims go out:
  // onError's outcome is what is reported, once; the refused one is not sent again meanwhile
  // (refused twice, the lease would be released and onError's outcome lost).
  const s = await startServer();
  try {
    const others = Array.from({ length: 40 }, (_, i) => `o${String(i).padStart(2, "0")}`);
    await s.enqueue("long");
    await s.enqueueMany(others);
    let runs = 0;
    const w = watched(s.base, {
      workerId: "slowerror",
      concurrency: 4,
      handler: async (job) => {
        if (job.receiptId === "long") {
          runs++;
          return "t".repeat(600);
        }
        await sleep(50);
        return `tx-${job.receiptId}`;
      },
      onError: async () => {
        await sleep(1_000);
        return { kind: "permanent", code: "verification", detail: "refused by the server" };
      },
    });
    const view = await waitFor("long dead-lettered", async () => {
      const v = await s.receipt("long");
      return v.state === "dead_lettered" ? v : undefined;
    });
    await waitFor("the others settled", () => w.worker.stats.settled === others.length);
    assert.equal(runs, 1);
    assert.equal(view.attempts, 1, JSON.stringify(view));
    assert.equal(failureCode(view), "verification", JSON.stringify(view));
    const refusals = w.events.filter((e) => e.event === "outcome_refused");
    assert.equal(refusals.length, 1, JSON.stringify(refusals));
    assert.equal(w.worker.stats.leasesLost, 0);
    const t = await w.stop();
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `onError's outcome reported after 1 s, the refused one sent once; ${others.length} others settled; stop ${Math.round(t)} ms`;
  } finally {
    s.stop();
  }
});

check("a server without outcomes in claims", async () => {
  // A server older than `outcomes` in claims refuses every claim carrying some (422, an unknown
  // field): after two such refusals in a row the worker stops carrying them and sends them in
  // POST /v1/outcomes; every receipt settles once, and it says so once.
  const s = await startServer();
  let refused = 0;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (req.method === "POST" && path === "/v1/claims" && outcomeIds(body).length) {
      refused++;
      return problem(422, "invalid_body", "validation");
    }
    return forward();
  }, s.base);
  try {
    const ids = Array.from({ length: 12 }, (_, i) => `old-${String(i).padStart(2, "0")}`);
    await s.enqueueMany(ids);
    const w = watched(proxy.base, {
      workerId: "oldserver",
      concurrency: 1,
      batchSize: 1,
      handler: async (job) => `tx-${job.receiptId}`,
    });
    await waitFor("all settled", () => w.worker.stats.settled === ids.length);
    const t = await w.stop();
    assert.equal(refused, 2);
    assert.equal(w.worker.stats.leasesLost, 0);
    for (const id of ids) assert.equal((await s.receipt(id)).state, "settled");
    assert.equal(w.logs.filter(([, m]) => m.includes("refused twice in a row")).length, 1, JSON.stringify(w.logs));
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `${refused} carrying claims refused, then ${proxy.counts["/v1/outcomes"]} POST /v1/outcomes; ` +
      `${ids.length} settled once; stop ${Math.round(t)} ms`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("a stop waits for a claim carrying outcomes", async () => {
  // A stop while a claim carrying outcomes waits for its answer (recorded, the answer slow): the
  // answer is read within the shutdown timeout; cut off after the claim grace, its outcome was
  // sent again, refused, and counted as a lease lost.
  const s = await startServer();
  let recorded;
  const carriedOnce = new Promise((resolve) => (recorded = resolve));
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (req.method !== "POST" || path !== "/v1/claims" || !outcomeIds(body).length) return forward();
    const out = await forward();
    recorded();
    await sleep(600);
    return out;
  }, s.base);
  try {
    await s.enqueue("carried");
    const w = watched(proxy.base, {
      workerId: "carrystop",
      concurrency: 1,
      batchSize: 1,
      waitMs: 200,
      handler: async (job) => `tx-${job.receiptId}`,
    });
    await within(20_000, "a claim carrying the outcome", carriedOnce);
    const t = await w.stop();
    assert.equal((await s.receipt("carried")).state, "settled");
    assert.equal(w.worker.stats.settled, 1, JSON.stringify(w.worker.stats));
    assert.equal(w.worker.stats.leasesLost, 0, JSON.stringify(w.worker.stats));
    assert.equal(proxy.counts["/v1/outcomes"] ?? 0, 0, JSON.stringify(proxy.counts));
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `the carrying claim's answer read ${Math.round(t)} ms after stop(); settled counted once`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("a claim that fails resends its outcomes", async () => {
  const s = await startServer();
  const plan = ["503", "record-then-html"];
  const failed = {};
  const sends = {};
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (req.method !== "POST" || (path !== "/v1/claims" && path !== "/v1/outcomes")) return forward();
    const ids = outcomeIds(body);
    for (const id of ids) sends[id] = (sends[id] ?? 0) + 1;
    const step = ids.length && path === "/v1/claims" ? plan.shift() : undefined;
    if (step) failed[step] = ids;
    if (step === "503") return problem(503, "backend_unavailable", "backend");
    if (step === "record-then-html") {
      // Recorded as the claim would record them (without leasing more), then the answer is lost.
      const a = await fetch(`${s.base}/v1/outcomes`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ outcomes: JSON.parse(body).outcomes }),
      });
      assert.equal(a.status, 200, await a.text());
      return [200, "<html>502 bad gateway</html>", "text/html"];
    }
    return forward();
  }, s.base);
  try {
    const ids = Array.from({ length: 6 }, (_, i) => `resend-${i}`);
    await s.enqueueMany(ids);
    const w = watched(proxy.base, { workerId: "resend", concurrency: 1, handler: (job) => `tx-${job.receiptId}` });
    await waitFor("all settled", async () => {
      for (const id of ids) if ((await s.receipt(id)).state !== "settled") return false;
      return true;
    });
    await waitFor("nothing held", () => w.worker["leases"].size === 0);
    const t = await w.stop();
    assert.deepEqual(Object.keys(failed).sort(), ["503", "record-then-html"], JSON.stringify(failed));
    for (const [step, names] of Object.entries(failed)) {
      assert.ok(names.length, JSON.stringify(failed));
      for (const id of names) assert.ok(sends[id] >= 2, `${id} (${step}) not sent again: ${JSON.stringify(sends)}`);
    }
    for (const id of ids) assert.equal(historyOf(await s.receipt(id), "accepted").length, 1, id);
    const stats = w.worker.stats;
    assert.equal(stats.errors.backend_unavailable, 1, JSON.stringify(stats.errors));
    assert.equal(stats.errors.invalid_answer, 1, JSON.stringify(stats.errors));
    const twice = failed["record-then-html"].length;
    assert.equal(stats.settled, ids.length - twice, JSON.stringify(stats));
    assert.equal(stats.leasesLost, twice, JSON.stringify(stats));
    assert.deepEqual(await s.leased(), []);
    assert.equal(w.error(), undefined);
    return `a claim refused with 503 (${failed["503"]}) and one answered with HTML after recording ` +
      `(${failed["record-then-html"]}): their outcomes sent again, every receipt settled once ` +
      `(${stats.settled} acknowledged, ${stats.leasesLost} found already finished); stop ${Math.round(t)} ms`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("SIGINT on an idle worker", async () => {
  const s = await startServer();
  let claimAt;
  const proxy = await fakeServer(async (req, body, forward, path) => {
    if (path === "/v1/claims") claimAt ??= now();
    return forward();
  }, s.base);
  try {
    const child = spawn(process.execPath, [join(root, "examples/node/worker.mjs"), "--worker-id", "sigint", "--wait-ms", "10000"], {
      env: { ...process.env, SETTLED_URL: proxy.base },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    let stdout = "";
    child.stderr.on("data", (c) => (stderr += c));
    child.stdout.on("data", (c) => (stdout += c));
    const exited = new Promise((r) => child.on("exit", (code, signal) => r({ code, signal, at: now() })));
    await waitFor("the worker's first claim", () => claimAt, 30_000);
    await sleep(500); // its long poll found nothing and waits
    const sent = now();
    child.kill("SIGINT");
    const { code, signal, at } = await within(5_000, "the worker's exit", exited);
    const took = at - sent;
    assert.equal(code, 0, `exit ${code} ${signal}\n${stderr}`);
    assert.ok(took < 1_000, `exited ${Math.round(took)} ms after SIGINT`);
    assert.match(stderr, /stopping/, stderr);
    assert.equal(JSON.parse(stdout.trim()).worker_id, "sigint");
    assert.deepEqual(await s.leased(), []);
    return `examples/node/worker.mjs exited 0 ${Math.round(took)} ms after SIGINT, logged "stopping", nothing leased`;
  } finally {
    proxy.close();
    s.stop();
  }
});

check("a rate-limited group does not hold back the others", async () => {
  const s = await startServer();
  try {
    const put = await s.call("PUT", "/v1/groups/slow", { rate: { per_second: 1 / 60, burst: 1 } });
    assert.equal(put.status, 200, JSON.stringify(put.body));
    for (const id of ["s1", "s2", "s3"]) await s.enqueue(id, { group: "slow" });
    const handled = {};
    const w = watched(s.base, {
      workerId: "all-groups",
      waitMs: 2_000,
      handler: (job) => {
        handled[job.receiptId] = now();
        return "tx";
      },
    });
    await waitFor("a claim told to look again", () => w.events.some((e) => e.event === "poll" && e.info.look_again_ms > 0));
    assert.deepEqual(Object.keys(handled), ["s1"]);
    const t0 = now();
    await s.enqueue("fast-1", { group: "fast" });
    await waitFor("fast-1 handled", () => handled["fast-1"], 10_000);
    const took = handled["fast-1"] - t0;
    await w.stop();
    assert.ok(took < 2_000, `fast-1 handled ${Math.round(took)} ms after its enqueue (waitMs 2000)`);
    assert.deepEqual(await s.leased(), []);

    // A look_again_ms beyond reason, from a server that answers at once: polled again soon.
    const fake = await fakeServer(async () => [200, JSON.stringify({ claims: [], look_again_ms: 9e15 })]);
    const f = watched(fake.base, { workerId: "look", waitMs: 2_000, groups: ["a", "b"], handler: () => "tx" });
    await sleep(1_500);
    const polls = fake.counts["/v1/claims"];
    await f.stop();
    fake.close();
    assert.ok(polls >= 3 && polls <= 10, `${polls} claims in 1.5 s`);
    return `with group slow at 1 claim a minute, a receipt in group fast was handled ${Math.round(took)} ms after ` +
      `its enqueue (waitMs 2000); a look_again_ms of 9e15 from a server answering at once: ${polls} claims in 1.5 s`;
  } finally {
    s.stop();
  }
});

// ---------------------------------------------------------------------------

let failed = 0;
try {
  for (const [name, fn] of checks) {
    if (only.length && !only.some((o) => name.includes(o))) continue;
    const t = now();
    try {
      const what = await within(120_000, name, fn());
      console.log(`ok   ${name} (${((now() - t) / 1000).toFixed(1)} s): ${what}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e?.stack ?? e}`);
    }
  }
  await sleep(100);
  if (unhandled.length) {
    failed++;
    console.log(`FAIL unhandled rejections: ${unhandled.map((e) => e?.stack ?? String(e)).join("\n")}`);
  }
} finally {
  for (const proc of servers) proc.kill("SIGTERM");
  rmSync(tmp, { recursive: true, force: true });
}
if (failed) {
  console.log(`typescript SDK robustness: ${failed} check(s) failed`);
  process.exit(1);
}
console.log("typescript SDK robustness: every check passed");
process.exit(0);
