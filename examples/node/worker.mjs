#!/usr/bin/env node
// A settled worker on the TypeScript SDK (`npm install` in this folder installs it
// from ../../clients/typescript).
//
// It claims due receipts with a long poll, settles each one on a simulated payment
// rail (timeouts, declines, zero charges, slow settlements), and lets the SDK do the
// rest: heartbeats, batched outcomes, backoff, and a clean stop on SIGTERM or Ctrl-C
// that releases the work not started.
//
//     SETTLED_URL=http://127.0.0.1:8080 node examples/node/worker.mjs --worker-id node-1
//
// Every flag can also be set through the environment variable shown by --help.
// Logs go to stderr (stopping, warnings and errors, every outcome with --verbose);
// on exit one JSON line with the worker's counters goes to stdout. Exit status: 0 after a clean stop, 2 for a configuration error that
// retrying cannot fix (bad token, refused parameters).

import { createHash } from 'node:crypto';
import { hostname } from 'node:os';
import { parseArgs } from 'node:util';

import { Client, Permanent, Retryable, Skip, Worker, WorkerStopped } from 'settled';

// ---------------------------------------------------------------------------
// Configuration

const OPTIONS = {
  url: ['SETTLED_URL', 'http://127.0.0.1:8080', 'base URL of settled'],
  token: ['SETTLED_TOKEN', '', 'Bearer token with the worker role'],
  'worker-id': ['SETTLED_WORKER_ID', `node-${hostname()}-${process.pid}`, 'lease owner name, 1..=128 bytes'],
  concurrency: ['SETTLED_CONCURRENCY', '8', 'receipts settled at once'],
  'batch-size': ['SETTLED_BATCH_SIZE', '16', 'receipts claimed per poll, 1..=1024'],
  'lease-ms': ['SETTLED_LEASE_MS', '30000', 'lease length asked for and extended to'],
  'wait-ms': ['SETTLED_WAIT_MS', '5000', 'long-poll wait when nothing is due, 0..=20000'],
  'exit-when-idle': ['SETTLED_EXIT_WHEN_IDLE', '0', 'exit after N consecutive empty polls with no job in hand; 0 = never'],
  'timeout-rate': ['RAIL_TIMEOUT_RATE', '0.05', 'probability the rail times out (retryable, code rpc)'],
  'decline-rate': ['RAIL_DECLINE_RATE', '0.02', 'probability the rail declines (permanent, code verification)'],
  'slow-rate': ['RAIL_SLOW_RATE', '0', 'probability a settlement is slow and needs heartbeats'],
  'slow-ms': ['RAIL_SLOW_MS', '0', 'duration of a slow settlement; 0 = 1.5 x lease-ms'],
  'latency-ms': ['RAIL_LATENCY_MS', '5', "upper bound of a normal settlement's duration"],
  seed: ['RAIL_SEED', '', "seed of the simulated rail's randomness"],
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
    // Ranges are the server's to judge: a refused one stops the worker naming it.
    concurrency: int('concurrency', 1, 100_000),
    batchSize: int('batch-size', 0, Number.MAX_SAFE_INTEGER),
    leaseMs: int('lease-ms', 0, Number.MAX_SAFE_INTEGER),
    waitMs: int('wait-ms', 0, Number.MAX_SAFE_INTEGER),
    exitWhenIdle: int('exit-when-idle', 0, Number.MAX_SAFE_INTEGER),
    timeoutRate: rate('timeout-rate'),
    declineRate: rate('decline-rate'),
    slowRate: rate('slow-rate'),
    slowMs: int('slow-ms', 0, 86_400_000),
    latencyMs: int('latency-ms', 0, 86_400_000),
    seed: get('seed') === '' ? undefined : int('seed', 0, 2 ** 32 - 1),
    verbose: values.verbose,
  };
  if (cfg.slowMs === 0) cfg.slowMs = Math.floor((cfg.leaseMs * 3) / 2);
  return cfg;
}

function fail(message) {
  console.error(`worker.mjs: ${message}\n\n${usage()}`);
  process.exit(2);
}

// ---------------------------------------------------------------------------
// The simulated rail

/** A seeded generator (mulberry32), so that a run can be repeated with --seed. */
function random(seed = Math.floor(Math.random() * 2 ** 32)) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Waits `ms`; rejects when the job's signal fires (the lease is lost: stop, charge nothing). */
const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(timer), reject(signal.reason)), { once: true });
  });

/** Stands in for a payment rail. Idempotent, keyed by receipt id: asking again for
 *  a receipt it accepted returns the same transcript instead of charging twice. */
class SimulatedRail {
  constructor(cfg) {
    this.cfg = cfg;
    this.rng = random(cfg.seed);
    this.accepted = new Map();
  }

  async charge(receiptId, observation, signal) {
    if (this.accepted.has(receiptId)) return this.accepted.get(receiptId);
    const amount = observation?.amount_cents;
    if (!Number.isInteger(amount) || amount < 0) {
      throw new Permanent('invalid_observation', 'amount_cents must be a non-negative integer');
    }
    if (amount === 0) throw new Skip('zero_charge');
    const c = this.cfg;
    const slow = this.rng() < c.slowRate;
    await sleep(slow ? c.slowMs : this.rng() * c.latencyMs, signal);
    const roll = this.rng();
    if (roll < c.timeoutRate) throw new Retryable('rpc', 'rail timed out');
    if (roll < c.timeoutRate + c.declineRate) {
      // `code` is one of the spec's closed set; `railCode` is the rail's own word for it.
      throw new Permanent('verification', { detail: 'rail declined the charge', railCode: 'card_declined' });
    }
    const transcript = 'tx-' + createHash('sha256').update(receiptId).digest('hex').slice(0, 24);
    this.accepted.set(receiptId, transcript);
    return transcript;
  }
}

// ---------------------------------------------------------------------------
// The worker: everything settled-specific is below.

const cfg = config(process.argv.slice(2));
const rail = new SimulatedRail(cfg);
const log = (level, message) => console.error(`${new Date().toISOString()} ${cfg.workerId} ${level} ${message}`);
let idle = 0;
// Receipts claimed and not yet answered (a slow job may still end in a retry), and the events
// that end a claimed job here: its outcome's route, a release, a lost lease, a refused release.
// (A refused outcome does not: the job is reported again with onError's outcome.)
const holding = new Set();
const DONE_EVENTS = new Set(['no_action', 'retry_scheduled', 'dead_lettered', 'released', 'lease_lost']);

const worker = new Worker(new Client(cfg.url, { token: cfg.token || undefined }), {
  workerId: cfg.workerId,
  concurrency: cfg.concurrency,
  batchSize: cfg.batchSize,
  leaseMs: cfg.leaseMs,
  waitMs: cfg.waitMs,
  handleSignals: true, // SIGTERM / Ctrl-C: finish, report, release; a second one stops at once
  logger: { info: (m) => log('INFO', m), warn: (m) => log('WARN', m), error: (m) => log('ERROR', m) },
  // The rail's transcript id settles the receipt; Retryable / Permanent / Skip report the rest.
  handler: (job, signal) => rail.charge(job.receiptId, job.observation, signal),
  onEvent: (event, job, info) => {
    if (event === 'claimed') holding.add(job.receiptId);
    else if (job && (DONE_EVENTS.has(event) || (event === 'error' && info.during === 'release'))) holding.delete(job.receiptId);
    if (event === 'poll') {
      // A poll is idle only with nothing in hand.
      idle = info.claimed || holding.size ? 0 : idle + 1;
      if (cfg.exitWhenIdle && idle >= cfg.exitWhenIdle) worker.stop();
    } else if (cfg.verbose && job) log('INFO', `${event} ${job.receiptId} ${JSON.stringify(info)}`);
  },
});

let status = 0;
try {
  await worker.run();
} catch (e) {
  if (!(e instanceof WorkerStopped)) throw e;
  console.error(`${cfg.workerId}: ${e.message}`);
  status = 2;
}
const s = worker.stats;
const summary = {
  worker_id: cfg.workerId,
  claimed: s.claimed,
  accepted: s.settled,
  skipped: s.skipped,
  retryable: s.retried,
  permanent: s.deadLettered,
  released: s.released,
  lost: s.leasesLost,
  heartbeats: s.heartbeats,
  refused: s.outcomesRefused,
  errors: s.errors,
};
console.log(JSON.stringify(summary));
process.exitCode = status;
