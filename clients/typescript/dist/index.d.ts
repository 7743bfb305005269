export { Backoff, Client } from "./client.js";
export type { AcceptedOutcome, Claim, ClaimsIn, ClaimsOut, ClientOptions, LeaseExtendResult, OutcomeIn, OutcomeResult, PermanentOutcome, Problem, ReceiptBatchResult, ReceiptIn, ReceiptView, RetryableOutcome, Route, SkippedOutcome, } from "./client.js";
export { ConnectionFailed, FAILURE_CODES, InvalidAnswer, InvalidOutcome, OutcomeRefused, Permanent, ProblemError, RAIL_CODE_PATTERN, Retryable, SKIP_REASONS, SettledError, Skip, WorkerStopped, checkOutcome, isFailureCode, isSkipReason, } from "./errors.js";
export type { FailureCode, FailureOptions, RetryableOptions, SkipReason } from "./errors.js";
export { Job, Worker, defaultErrorOutcome } from "./worker.js";
export type { ErrorPolicy, Handler, Logger, WorkerEvent, WorkerOptions, WorkerStats } from "./worker.js";
export type { components, paths } from "./schema.js";
