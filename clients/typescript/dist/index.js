// settled: the client and worker runtime for the settled service.
export { Backoff, Client } from "./client.js";
export { ConnectionFailed, Permanent, ProblemError, Retryable, SettledError, Skip, WorkerStopped } from "./errors.js";
export { Job, Worker, defaultErrorOutcome } from "./worker.js";
