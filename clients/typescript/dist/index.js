// settled: the client and worker runtime for the settled service.
export { Backoff, Client } from "./client.js";
export { ConnectionFailed, FAILURE_CODES, InvalidAnswer, InvalidOutcome, OutcomeRefused, Permanent, ProblemError, RAIL_CODE_PATTERN, Retryable, SKIP_REASONS, SettledError, Skip, WorkerStopped, checkOutcome, isFailureCode, isSkipReason, } from "./errors.js";
export { Job, Worker, defaultErrorOutcome } from "./worker.js";
