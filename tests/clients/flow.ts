// A producer, a worker and an operator using the TypeScript client generated from openapi.yaml
// (openapi-typescript types + openapi-fetch) against a real server. Run by tests/dashboard.rs:
// SETTLED_URL and SETTLED_{PRODUCER,WORKER,OPERATOR}_TOKEN come from the environment.
import createClient from "openapi-fetch";
import type { components, paths } from "./generated/ts/settled.js";

type Claim = components["schemas"]["Claim"];

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

function check(condition: unknown, what: string, got?: unknown): asserts condition {
  if (!condition) throw new Error(`${what}; got ${JSON.stringify(got)}`);
}

const api = (token: string) =>
  createClient<paths>({ baseUrl: env("SETTLED_URL"), headers: { Authorization: `Bearer ${token}` } });
const producer = api(env("SETTLED_PRODUCER_TOKEN"));
const worker = api(env("SETTLED_WORKER_TOKEN"));
const operator = api(env("SETTLED_OPERATOR_TOKEN"));

// A producer enqueues receipts with an observation of its own shape.
const created = await producer.POST("/v1/receipts", {
  body: { receipt_id: "ts-1", finalized_at: 1764460800, observation: { amount_cents: 1250, currency: "EUR" } },
});
check(created.response.status === 201, "enqueue answers 201", created.error);
check(created.data?.observation?.amount_cents === 1250, "the receipt keeps its observation", created.data);
const batch = await producer.POST("/v1/receipts/batch", {
  body: { receipts: [{ receipt_id: "ts-2", finalized_at: 1764460801, observation: { amount_cents: 990 } }] },
});
check(batch.data?.results[0]?.status === "created", "the batch item is created", batch.data);

// A worker claims them and reads the observation.
const claimed = await worker.POST("/v1/claims", { body: { worker_id: "ts-worker", lease_ms: 60000, limit: 10 } });
const claims: Claim[] = claimed.data?.claims ?? [];
const first = claims.find((c) => c.receipt_id === "ts-1");
const second = claims.find((c) => c.receipt_id === "ts-2");
check(first && second, "both receipts are claimed", claimed.data);
check(first.observation?.amount_cents === 1250, "the claim carries the observation", first);

// The rail timed out: a retryable failure is scheduled again.
const retried = await worker.POST("/v1/receipts/{id}/outcome", {
  params: { path: { id: "ts-1" } },
  body: { claim: first, outcome: { kind: "retryable", code: "rpc", detail: "timeout talking to rail" } },
});
check(retried.data?.kind === "retry_scheduled" && retried.data.attempt === 1, "retry scheduled", retried);

// The same claim again is stale: 409, a problem a client can branch on.
const stale = await worker.POST("/v1/receipts/{id}/outcome", {
  params: { path: { id: "ts-1" } },
  body: { claim: first, outcome: { kind: "accepted", transcript_id: "tx-ts-1" } },
});
check(stale.response.status === 409, "a stale claim gets 409", stale.response.status);
check(stale.error?.code === "receipt_not_leased" && stale.error.class === "conflict", "a receipt_not_leased problem", stale.error);

// A batch of outcomes, judged item by item.
const outcomes = await worker.POST("/v1/outcomes", {
  body: {
    outcomes: [
      { claim: second, outcome: { kind: "permanent", code: "invalid_receipt_signature", detail: "bad signature" } },
      { claim: first, outcome: { kind: "accepted", transcript_id: "tx-ts-1" } },
    ],
  },
});
const [dead, refused] = outcomes.data?.results ?? [];
check(dead?.route?.kind === "dead_lettered" && dead.route.attempts === 1, "ts-2 is dead-lettered", dead);
check(refused?.error?.code === "receipt_not_leased", "the stale item is refused alone", refused);

// The history numbers invocations from 1; the receipt counts failures.
const receipt = await worker.GET("/v1/receipts/{id}", { params: { path: { id: "ts-1" } } });
const entry = receipt.data?.history[0];
check(receipt.data?.attempts === 1 && entry?.attempt === 1, "one failure, on attempt 1", receipt.data);
check(entry?.outcome === "retryable" && entry.route === "retry_scheduled", "its history entry", entry);

// An operator pages through the dead letters and redrives one (a redrive sends `{}`: openapi-fetch
// sets Content-Type only with a body).
const page = await operator.GET("/v1/dead-letters", { params: { query: { limit: 100 } } });
const letters = page.data?.dead_letters ?? [];
check(letters.length === 1 && letters[0]?.receipt_id === "ts-2", "one dead letter", page.data);
check(letters[0]?.code === "invalid_receipt_signature", "with its failure code", letters[0]);
const redriven = await operator.POST("/v1/dead-letters/{id}/redrive", {
  params: { path: { id: "ts-2" } },
  body: {},
});
check(redriven.data?.state === "pending" && redriven.data.attempts === 0, "redriven to pending", redriven);

// A wrong token is a 401 problem; a worker may not redrive (403).
const unknown = await api("not-a-configured-token-0123456789").GET("/v1/status");
check(unknown.response.status === 401, "a wrong token gets 401", unknown.response.status);
check(unknown.error?.code === "unauthorized" && unknown.error.class === "auth", "an unauthorized problem", unknown.error);
const forbidden = await worker.POST("/v1/dead-letters/{id}/redrive", { params: { path: { id: "ts-2" } }, body: {} });
check(forbidden.response.status === 403 && forbidden.error?.code === "forbidden", "a worker may not redrive", forbidden.error);

console.log("typescript flow: ok");
