#!/usr/bin/env node
// A complete settled worker for Node.js 20+, with no dependencies (built-in fetch).
//
// It claims due receipts with a long poll, settles each one on a simulated payment
// rail, heartbeats the leases while the rail is slow, reports the outcomes as one
// batch, backs off with jitter when the service is unavailable, and stops cleanly
// on SIGTERM or Ctrl-C by releasing the leases of the work it has not started.
//
//     SETTLED_URL=http://127.0.0.1:8080 node examples/node/worker.mjs --worker-id node-1
//
// Every flag can also be set through the environment variable shown by --help.
// Logs go to stderr; on exit one JSON line with the worker's counters goes to
// stdout. Exit status: 0 after a clean stop, 2 for a configuration error that
// retrying cannot fix (bad token, refused parameters).
//
// The rules a worker must follow are in docs/worker-loop.md.

import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { parseArgs } from 'node:util';

// ---------------------------------------------------------------------------
// Configuration

const OPTIONS = {
  url: ['SETTLED_URL', 'http://127.0.0.1:8080', 'base URL of settled'],
  token: ['SETTLED_TOKEN', '', 'Bearer token with the worker role'],
  'worker-id': ['SETTLED_WORKER_ID', `node-${hostname()}-${process.pid}`, 'lease owner name, 1..=128 bytes'],
  'batch-size': ['SETTLED_BATCH_SIZE', '16', 'receipts claimed per poll, 1..=1024'],
  'lease-ms': ['SETTLED_LEASE_MS', '30000', 'lease length asked for and extended to'],
  'wait-ms': ['SETTLED_WAIT_MS', '5000', 'long-poll wait when nothing is due, 0..=20000'],
  'exit-when-idle': ['SETTLED_EXIT_WHEN_IDLE', '0', 'exit after N consecutive empty polls; 0 = never'],
  'timeout-rate': ['RAIL_TIMEOUT_RATE', '0.05', 'probability the rail times out (retryable, code rpc)'],
  'decline-rate': ['RAIL_DECLINE_RATE', '0.02', 'probability the rail declines (permanent, code verification)'],
  'slow-rate': ['RAIL_SLOW_RATE', '0', 'probability a settlement is slow and needs heartbeats'],
  'slow-ms': ['RAIL_SLOW_MS', '0', 'duration of a slow settlement; 0 = 1.5 x lease-ms'],
  'latency-ms': ['RAIL_LATENCY_MS', '5', "upper bound of a normal settlement's duration"],
};

function usage() {
  const lines = ['usage: node worker.mjs [--flag value]... [--verbose]', ''];
  for (const [name, [envName, def, help]] of Object.entries(OPTIONS)) {
    lines.push(`  --${name.padEnd(15)} ${help} [env ${envName}] (default: ${def || 'none'})`);
  }
  lines.push(`  --${'verbose'.padEnd(15)} log every outcome`);
  return lines.join('\n');
}

function config(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      ...Object.fromEntries(Object.keys(OPTIONS).map((k) => [k, { type: 'string' }])),
      verbose: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    console.log(usage());
    process.exit(0);
  }
  const get = (name) => values[name] ?? (process.env[OPTIONS[name][0]] || OPTIONS[name][1]);
  const int = (name, lo, hi) => {
    const v = Number(get(name));
    if (!Number.isInteger(v) || v < lo || v > hi) fail(`--${name} must be an integer in ${lo}..=${hi}`);
    return v;
  };
  const rate = (name) => {
    const v = Number(get(name));
    if (!(v >= 0 && v <= 1)) fail(`--${name} must be a probability in 0..=1`);
    return v;
  };
  const cfg = {
    url: get('url').replace(/\/+$/, ''),
    token: get('token'),
    workerId: get('worker-id'),
    batchSize: int('batch-size', 1, 1024),
    leaseMs: int('lease-ms', 1, 86_400_000),
    waitMs: int('wait-ms', 0, 20_000),
    exitWhenIdle: int('exit-when-idle', 0, Number.MAX_SAFE_INTEGER),
    timeoutRate: rate('timeout-rate'),
    declineRate: rate('decline-rate'),
    slowRate: rate('slow-rate'),
    slowMs: int('slow-ms', 0, 86_400_000),
    latencyMs: int('latency-ms', 0, 86_400_000),
    verbose: values.verbose,
  };
  const idBytes = Buffer.byteLength(cfg.workerId);
  if (idBytes < 1 || idBytes > 128) fail('--worker-id must be 1..=128 bytes');
  if (cfg.slowMs === 0) cfg.slowMs = Math.floor((cfg.leaseMs * 3) / 2);
  return cfg;
}

function fail(message) {
  console.error(`worker.mjs: ${message}\n\n${usage()}`);
  process.exit(2);
}

// ---------------------------------------------------------------------------
// Small tools

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Serializes async sections: every request that uses a claim goes through it. */
class Mutex {
  #tail = Promise.resolve();
  run(fn) {
    const result = this.#tail.then(fn);
    this.#tail = result.catch(() => {});
    return result;
  }
}

/** Exponential backoff with full jitter, reset by making a new one. */
class Backoff {
  #n = 0;
  constructor(baseMs = 100, capMs = 5000) {
    this.baseMs = baseMs;
    this.capMs = capMs;
  }
  next() {
    const ms = Math.random() * Math.min(this.capMs, this.baseMs * 2 ** this.#n);
    this.#n = Math.min(this.#n + 1, 16);
    return ms;
  }
}

// ---------------------------------------------------------------------------
// HTTP

/** 503, a timeout or a connection failure: back off and try again. */
class Unavailable extends Error {}

/** A 4xx/5xx answer that retrying will not change. */
class Refused extends Error {
  constructor(status, problem) {
    super(`${status} ${problem.code}: ${problem.detail}`);
    this.status = status;
    this.problem = problem;
  }
}

class Api {
  constructor(base, token) {
    this.base = base;
    this.token = token;
  }

  async request(method, path, body, timeoutMs = 30_000) {
    const headers = { accept: 'application/json' };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let response;
    let text;
    try {
      response = await fetch(this.base + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      text = await response.text();
    } catch (e) {
      const cause = e.cause?.code ?? e.cause?.errors?.[0]?.code ?? e.cause?.message ?? e.message;
      throw new Unavailable(`${e.name}: ${cause}`);
    }
    if (response.ok) return text ? JSON.parse(text) : null;
    let problem;
    try {
      problem = JSON.parse(text);
    } catch {
      problem = { code: `http_${response.status}`, detail: text.slice(0, 200) };
    }
    if (response.status === 503) throw new Unavailable(`503 ${problem.code}`);
    throw new Refused(response.status, problem);
  }
}

// Receipt ids may hold '/', '?', '#', '%', spaces, any Unicode: encode them all.
const receiptPath = (id, suffix = '') => `/v1/receipts/${encodeURIComponent(id)}${suffix}`;

// ---------------------------------------------------------------------------
// The simulated payment rail

/**
 * Stands in for a payment rail. Calls are idempotent, keyed by receipt id: asking
 * again for a receipt the rail already accepted returns the same transcript instead
 * of charging twice. A real rail must offer the same (an idempotency key), because a
 * worker can lose its lease after the rail accepted and before the outcome was recorded.
 */
class SimulatedRail {
  constructor(cfg) {
    this.cfg = cfg;
    this.accepted = new Map();
  }

  async settle(receiptId, observation) {
    if (this.accepted.has(receiptId)) {
      return { kind: 'accepted', transcript_id: this.accepted.get(receiptId) };
    }
    const amount = observation?.amount_cents;
    if (!Number.isInteger(amount) || amount < 0) {
      return {
        kind: 'permanent',
        code: 'invalid_observation',
        detail: 'observation.amount_cents must be a non-negative integer',
      };
    }
    if (amount === 0) return { kind: 'skipped', reason: 'zero_charge' };
    const c = this.cfg;
    if (Math.random() < c.slowRate) await sleep(c.slowMs);
    else if (c.latencyMs > 0) await sleep(Math.random() * c.latencyMs);
    const roll = Math.random();
    if (roll < c.timeoutRate) return { kind: 'retryable', code: 'rpc', detail: 'rail timed out' };
    if (roll < c.timeoutRate + c.declineRate) {
      return { kind: 'permanent', code: 'verification', detail: 'rail declined the charge' };
    }
    const transcript = `tx-${createHash('sha256').update(receiptId).digest('hex').slice(0, 24)}`;
    this.accepted.set(receiptId, transcript);
    return { kind: 'accepted', transcript_id: transcript };
  }
}

// ---------------------------------------------------------------------------
// The worker

/**
 * A claim this worker holds, with a conservative local deadline. The server's lease
 * ends at lease_until_ms on *its* clock; we never compare clocks. The lease was
 * granted no earlier than the moment we sent the request, so `sent + leaseMs` on our
 * monotonic clock is never later than the real deadline.
 */
class Held {
  constructor(claim, sent, leaseMs) {
    this.claim = claim;
    this.granted = sent;
    this.deadline = sent + leaseMs;
  }
}

const now = () => performance.now();

class Worker {
  constructor(cfg) {
    this.cfg = cfg;
    this.api = new Api(cfg.url, cfg.token);
    this.rail = new SimulatedRail(cfg);
    this.stopping = false; // set by SIGTERM/SIGINT: finish up, take no new work
    this.stopReason = null;
    this.wakeStop = () => {};
    this.stopped = new Promise((resolve) => {
      this.wakeStop = resolve;
    });
    this.lock = new Mutex();
    this.held = new Map(); // receipt_id -> Held: claimed and not yet reported
    this.stats = {
      claimed: 0, accepted: 0, skipped: 0, retryable: 0, permanent: 0,
      lost: 0, released: 0, heartbeats: 0, polls: 0, empty_polls: 0,
    };
    // Commit only while comfortably inside the lease.
    this.marginMs = Math.min(cfg.leaseMs * 0.2, 2000);
  }

  log(message, fields = {}) {
    const extra = Object.entries(fields).map(([k, v]) => ` ${k}=${v}`).join('');
    process.stderr.write(`[${this.cfg.workerId}] ${message}${extra}\n`);
  }

  stop(reason) {
    this.stopping = true;
    this.stopReason = reason;
    this.wakeStop();
  }

  /** Sleep, but wake up early when asked to stop. */
  pause(ms) {
    return Promise.race([sleep(ms), this.stopped]);
  }

  // -- claiming ---------------------------------------------------------------

  async claimBatch() {
    const backoff = new Backoff();
    const body = {
      worker_id: this.cfg.workerId,
      lease_ms: this.cfg.leaseMs,
      limit: this.cfg.batchSize,
      wait_ms: this.cfg.waitMs,
    };
    while (!this.stopping) {
      const sent = now();
      let out;
      try {
        // Not aborted on SIGTERM: the server may already have claimed work for
        // us, and we could not give it back if we dropped the answer.
        out = await this.api.request('POST', '/v1/claims', body, this.cfg.waitMs + 30_000);
      } catch (e) {
        if (!(e instanceof Unavailable)) throw e;
        const delay = backoff.next();
        this.log('claim failed; backing off', { error: e.message, delay_ms: delay.toFixed(0) });
        await this.pause(delay);
        continue;
      }
      this.stats.polls += 1;
      for (const c of out.claims) this.held.set(c.receipt_id, new Held(c, sent, this.cfg.leaseMs));
      this.stats.claimed += out.claims.length;
      return out.claims;
    }
    return [];
  }

  // -- heartbeats -------------------------------------------------------------

  startHeartbeats() {
    const tick = Math.max(20, Math.min(1000, this.cfg.leaseMs / 6));
    let busy = false;
    const timer = setInterval(async () => {
      if (busy) return;
      busy = true;
      try {
        for (const receiptId of [...this.held.keys()]) {
          await this.lock.run(async () => {
            const h = this.held.get(receiptId);
            // Renew once a third of the lease is used: two heartbeats may fail
            // before the lease is at risk.
            if (h && now() - h.granted >= this.cfg.leaseMs / 3) await this.extend(receiptId, h);
          });
        }
      } finally {
        busy = false;
      }
    }, tick);
    return () => clearInterval(timer);
  }

  /** Extend one lease (caller holds the lock). */
  async extend(receiptId, h) {
    const sent = now();
    if (sent >= h.deadline - this.marginMs / 2) {
      this.drop(receiptId, 'lease about to expire before the heartbeat');
      return;
    }
    try {
      const claim = await this.api.request('POST', receiptPath(receiptId, '/lease'), {
        claim: h.claim,
        extend_ms: this.cfg.leaseMs,
      });
      h.claim = claim; // same token and version, new lease_until_ms
      h.granted = sent;
      h.deadline = sent + this.cfg.leaseMs;
      this.stats.heartbeats += 1;
    } catch (e) {
      if (e instanceof Unavailable) {
        this.log('heartbeat failed; will try again', { receipt_id: receiptId, error: e.message });
      } else {
        this.drop(receiptId, `heartbeat refused: ${e.message}`);
      }
    }
  }

  /** Forget work whose lease is lost: someone else will (or did) do it. */
  drop(receiptId, why) {
    this.held.delete(receiptId);
    this.stats.lost += 1;
    this.log('lease lost; dropping the work', { receipt_id: receiptId, why });
  }

  // -- reporting --------------------------------------------------------------

  /** Record [[receiptId, outcome]] in one request, each item judged on its own. */
  async report(done) {
    const backoff = new Backoff();
    let pending = done;
    while (pending.length > 0) {
      const error = await this.lock.run(async () => {
        const items = [];
        for (const [receiptId, outcome] of pending) {
          const h = this.held.get(receiptId);
          if (!h) continue; // lost meanwhile
          if (now() >= h.deadline - this.marginMs) {
            // Never commit after the lease ends: it would be refused, and another
            // worker may already hold the receipt.
            this.drop(receiptId, 'lease ended before the outcome could be sent');
            continue;
          }
          items.push([receiptId, { claim: h.claim, outcome }]);
        }
        if (items.length === 0) return null;
        let out;
        try {
          out = await this.api.request('POST', '/v1/outcomes', { outcomes: items.map(([, b]) => b) });
        } catch (e) {
          if (e instanceof Unavailable) return e;
          // The whole batch was refused (malformed): nothing was recorded.
          this.log('outcome batch refused', { error: e.message });
          for (const [receiptId] of items) this.held.delete(receiptId);
          return null;
        }
        items.forEach(([receiptId, b], i) => {
          this.held.delete(receiptId);
          this.recorded(receiptId, b.outcome, out.results[i]);
        });
        return null;
      });
      if (error === null) return;
      const delay = backoff.next();
      this.log('reporting failed; backing off', { error: error.message, delay_ms: delay.toFixed(0) });
      await sleep(delay); // heartbeats keep the leases alive meanwhile
      pending = pending.filter(([receiptId]) => this.held.has(receiptId));
    }
  }

  recorded(receiptId, outcome, result) {
    const error = result.error;
    if (!error) {
      this.stats[outcome.kind] += 1;
      if (this.cfg.verbose) {
        this.log('recorded', { receipt_id: receiptId, outcome: outcome.kind, route: JSON.stringify(result.route) });
      }
    } else if (error.status === 409) {
      // lease_conflict: our lease expired or was taken over, or a retry of this
      // very request already recorded it. Either way: drop the work.
      this.stats.lost += 1;
      this.log('outcome refused: lease lost', { receipt_id: receiptId, code: error.code });
    } else {
      this.log('outcome refused', { receipt_id: receiptId, status: error.status, code: error.code, detail: error.detail });
    }
  }

  // -- releasing --------------------------------------------------------------

  /** Give back leases of work not started, so others can take it at once. */
  async release(receiptIds) {
    await this.lock.run(async () => {
      for (const receiptId of receiptIds) {
        const h = this.held.get(receiptId);
        if (!h) continue;
        this.held.delete(receiptId);
        try {
          await this.api.request('DELETE', receiptPath(receiptId, '/lease'), { claim: h.claim }, 5000);
          this.stats.released += 1;
        } catch (e) {
          // It will come back by itself when the lease expires.
          this.log('release failed; the lease will expire', { receipt_id: receiptId, error: e.message });
        }
      }
    });
  }

  // -- the loop ---------------------------------------------------------------

  async run() {
    const started = now();
    const stopHeartbeats = this.startHeartbeats();
    let status = 0;
    let idle = 0;
    try {
      while (!this.stopping) {
        const claims = await this.claimBatch();
        if (claims.length === 0) {
          if (this.stopping) break;
          this.stats.empty_polls += 1;
          idle += 1;
          if (this.cfg.exitWhenIdle > 0 && idle >= this.cfg.exitWhenIdle) {
            this.log('idle; exiting', { empty_polls: idle });
            break;
          }
          continue;
        }
        idle = 0;
        const done = [];
        for (const claim of claims) {
          if (this.stopping) break; // the rest is not started: released below
          if (!this.held.has(claim.receipt_id)) continue; // lost while we worked on the batch
          done.push([claim.receipt_id, await this.rail.settle(claim.receipt_id, claim.observation)]);
        }
        await this.report(done);
        // Whatever is still held was not started: give it back at once.
        await this.release(claims.map((c) => c.receipt_id));
      }
    } catch (e) {
      if (!(e instanceof Refused)) throw e;
      this.log('refused by the service; giving up', { error: e.message });
      status = 2;
    } finally {
      this.stopping = true;
      await this.release([...this.held.keys()]);
      stopHeartbeats();
      this.stats.elapsed_s = Number(((now() - started) / 1000).toFixed(3));
      process.stdout.write(`${JSON.stringify({ worker_id: this.cfg.workerId, ...this.stats })}\n`);
    }
    if (this.stopReason) this.log('stopped', { signal: this.stopReason });
    return status;
  }
}

const cfg = config(process.argv.slice(2));
const worker = new Worker(cfg);
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => worker.stop(signal));
worker.log('started', { url: cfg.url, batch_size: cfg.batchSize, lease_ms: cfg.leaseMs });
process.exitCode = await worker.run();
