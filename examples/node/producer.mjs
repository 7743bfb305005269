#!/usr/bin/env node
// A settled producer on the TypeScript SDK (`npm install` in this folder installs it from
// ../../clients/typescript): enqueues finalized receipts, one request each or in batches.
//
//     SETTLED_URL=http://127.0.0.1:8080 node examples/node/producer.mjs --count 1000 --batch-size 500
//
// Enqueueing is idempotent: the receipts are made from their number alone (id, finalized_at,
// observation), so running it again with the same flags changes nothing: a batch reports
// them `existing` (one at a time, `stored`: a single enqueue answers the same either way).
// The same id with other content is refused (`conflict`). Every flag can also be set through
// the environment variable shown by --help. One JSON line with the counts goes to stdout.
// Exit status: 0 when every receipt is stored, 1 when some were refused, 2 for a bad flag.

import { parseArgs } from 'node:util';

import { Client, ProblemError } from 'settled';

const OPTIONS = {
  url: ['SETTLED_URL', 'http://127.0.0.1:8080', 'base URL of settled'],
  token: ['SETTLED_TOKEN', '', 'Bearer token with the producer role'],
  count: ['PRODUCER_COUNT', '100', 'receipts to enqueue'],
  'batch-size': ['PRODUCER_BATCH_SIZE', '100', 'receipts per request, 1..=1024 (1: POST /v1/receipts each)'],
  prefix: ['PRODUCER_PREFIX', 'r', 'receipt ids are <prefix>-<number>'],
  group: ['PRODUCER_GROUP', '', 'group of every receipt (default: the default group)'],
  'finalized-at': ['PRODUCER_FINALIZED_AT', '1764460800', "the receipts' finalized_at (Unix seconds)"],
  traceparent: ['TRACEPARENT', '', 'W3C traceparent handed to the workers (default: the active span, with OpenTelemetry)'],
};

function usage() {
  const lines = ['usage: node producer.mjs [--flag value]...', ''];
  for (const [name, [envName, def, help]] of Object.entries(OPTIONS)) {
    lines.push(`  --${name.padEnd(13)} ${help} [env ${envName}] (default: ${def || 'none'})`);
  }
  return lines.join('\n');
}

function fail(message) {
  console.error(`producer.mjs: ${message}\n\n${usage()}`);
  process.exit(2);
}

const { values } = parseArgs({
  options: {
    ...Object.fromEntries(Object.keys(OPTIONS).map((k) => [k, { type: 'string' }])),
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
const count = int('count', 0, 10_000_000);
const batchSize = int('batch-size', 1, 1024);
const finalizedAt = int('finalized-at', 0, Number.MAX_SAFE_INTEGER);
const group = get('group') || undefined;
const traceparent = get('traceparent') || undefined;

/** Receipt number `i`: the same every run, so that a second run is a no-op. */
const receipt = (i) => ({
  receipt_id: `${get('prefix')}-${String(i).padStart(6, '0')}`,
  finalized_at: finalizedAt,
  observation: { amount_cents: 100 + (i % 900), currency: 'EUR' },
  ...(group ? { group } : {}),
  ...(traceparent ? { traceparent } : {}),
});

// Enqueues and reads are retried by the client on 503, 504, 429, 500 internal_error and lost
// connections (`retries` times), then thrown.
const client = new Client(get('url'), { token: get('token') || undefined });
const counts = {};
const add = (key) => (counts[key] = (counts[key] ?? 0) + 1);

for (let start = 0; start < count; start += batchSize) {
  const items = Array.from({ length: Math.min(batchSize, count - start) }, (_, k) => receipt(start + k));
  if (batchSize === 1) {
    // One receipt: 201 when stored, 200 when it was there already (both answer its view).
    try {
      await client.enqueue(items[0]);
      add('stored');
    } catch (e) {
      if (!(e instanceof ProblemError) || e.status >= 500) throw e;
      add(e.code === 'receipt_conflict' ? 'conflict' : 'invalid');
      console.error(`${items[0].receipt_id}: ${e.message}`);
    }
    continue;
  }
  // A batch: one result per receipt, in order, each judged on its own.
  const results = await client.enqueueBatch(items);
  results.forEach((result, k) => {
    add(result.status);
    if (result.error) console.error(`${items[k].receipt_id}: ${result.status}: ${result.error.code}: ${result.error.detail}`);
  });
}

console.log(JSON.stringify(counts));
process.exitCode = counts.conflict || counts.invalid ? 1 : 0;
