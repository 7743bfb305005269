// settled: the client and worker runtime for the settled service.
export { Backoff, Client } from "./client.js";
export type { Claim, ClientOptions, OutcomeIn, Problem, ReceiptIn, ReceiptView, Route } from "./client.js";
export { ConnectionFailed, Permanent, ProblemError, Retryable, SettledError, Skip, WorkerStopped } from "./errors.js";
export { Job, Worker, defaultErrorOutcome } from "./worker.js";
export type { ErrorPolicy, Handler, Logger, WorkerEvent, WorkerOptions, WorkerStats } from "./worker.js";
export type { components, paths } from "./schema.js";
