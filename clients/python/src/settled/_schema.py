"""The wire types of settled's HTTP API and its operations.

Generated from openapi.yaml by clients/python/generate.py: do not edit.
"""

from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired, TypeAlias


AcceptedOutcome = TypedDict(
    'AcceptedOutcome',
    {
        'kind': Literal['accepted'],
        'transcript_id': str,
    },
)

BackendKind: TypeAlias = Literal['sqlite', 'postgres']

BatchItemStatus: TypeAlias = Literal['created', 'existing', 'conflict', 'invalid']

BulkAction: TypeAlias = Literal['redrive', 'hold', 'unhold', 'cancel']

SettlementFailureCode: TypeAlias = Literal['invalid_receipt_signature', 'invalid_action_hash', 'untrusted_receipt_signer', 'malformed_financial_metadata', 'invalid_observation', 'rpc', 'invalid_input', 'invalid_dispatch', 'invalid_binding', 'unsupported', 'serialization', 'signature', 'verification', 'backend']

StateFilter: TypeAlias = Literal['pending', 'scheduled', 'leased', 'retry_scheduled', 'settled', 'skipped', 'dead_lettered', 'canceled']

FilterIn = TypedDict(
    'FilterIn',
    {
        'code': NotRequired[SettlementFailureCode | None],
        'finalized_from': NotRequired[int | None],
        'finalized_to': NotRequired[int | None],
        'finished_from_ms': NotRequired[int | None],
        'finished_to_ms': NotRequired[int | None],
        'group': NotRequired[str | None],
        'held': NotRequired[bool | None],
        'owner': NotRequired[str | None],
        'prefix': NotRequired[str | None],
        'priority': NotRequired[int | None],
        'rail_code': NotRequired[str | None],
        'state': NotRequired[StateFilter | None],
    },
)

BulkIn = TypedDict(
    'BulkIn',
    {
        'dry_run': NotRequired[bool],
        'expect_count': NotRequired[int | None],
        'filter': NotRequired[FilterIn | None],
        'reason': NotRequired[str | None],
        'receipt_ids': NotRequired[list[str] | None],
    },
)

BulkItemStatus: TypeAlias = Literal['done', 'unchanged', 'refused']

ProblemClass: TypeAlias = Literal['validation', 'conflict', 'invalid_record', 'backend', 'not_found', 'auth', 'capacity', 'internal']

ProblemCode: TypeAlias = Literal['malformed_json', 'unsupported_media_type', 'body_too_large', 'request_timeout', 'invalid_body', 'invalid_query', 'invalid_path', 'method_not_allowed', 'batch_size', 'invalid_receipt_id', 'invalid_finalized_at', 'invalid_visible_at_ms', 'invalid_observation', 'observation_too_large', 'invalid_transcript_id', 'invalid_retry_after', 'invalid_group', 'invalid_priority', 'invalid_trace_context', 'invalid_group_limits', 'worker_id_length', 'invalid_worker_id', 'lease_duration', 'claim_batch', 'invalid_wait_ms', 'invalid_claim', 'receipt_id_mismatch', 'invalid_limit', 'invalid_cursor', 'unauthorized', 'forbidden', 'cross_site_request', 'host_not_allowed', 'misdirected_request', 'lease_conflict', 'lease_expired', 'receipt_not_leased', 'receipt_unknown', 'receipt_conflict', 'receipt_leased', 'receipt_not_visible', 'group_paused', 'group_at_limit', 'not_found', 'receipt_not_found', 'no_active_work', 'dead_letter_not_found', 'group_not_found', 'receipt_held', 'receipt_not_active', 'receipt_finished', 'count_mismatch', 'selection_too_large', 'bulk_incomplete', 'invalid_reason', 'history_cursor_expired', 'too_many_streams', 'invalid_record', 'backend_unavailable', 'time_limit_exceeded', 'internal_error', 'invalid_rail_code']

Problem = TypedDict(
    'Problem',
    {
        'class': ProblemClass,
        'code': ProblemCode,
        'detail': str,
        'status': int,
        'title': str,
        'type': str,
    },
)

BulkItem = TypedDict(
    'BulkItem',
    {
        'error': NotRequired[Problem | None],
        'receipt_id': str,
        'status': BulkItemStatus,
    },
)

BulkOut = TypedDict(
    'BulkOut',
    {
        'action': BulkAction,
        'complete': bool,
        'done': int,
        'dry_run': bool,
        'matched': int,
        'refused': int,
        'remaining_receipt_ids': NotRequired[list[str] | None],
        'results': list[BulkItem],
        'sample': NotRequired[list[str] | None],
        'stopped': NotRequired[Problem | None],
        'unchanged': int,
    },
)

Role: TypeAlias = Literal['producer', 'worker', 'reader', 'operator']

CallerOut = TypedDict(
    'CallerOut',
    {
        'name': NotRequired[str | None],
        'role': Role,
    },
)

Observation: TypeAlias = dict[str, Any]

Claim = TypedDict(
    'Claim',
    {
        'attempts': int,
        'finalized_at': int,
        'group': NotRequired[str],
        'lease_owner': str,
        'lease_token': str,
        'lease_until_ms': int,
        'observation': NotRequired[Observation | None],
        'priority': NotRequired[int],
        'receipt_id': str,
        'row_version': int,
        'traceparent': NotRequired[str | None],
        'tracestate': NotRequired[str | None],
    },
)

ClaimOneIn = TypedDict(
    'ClaimOneIn',
    {
        'lease_ms': int,
        'worker_id': str,
    },
)

PermanentOutcome = TypedDict(
    'PermanentOutcome',
    {
        'code': SettlementFailureCode,
        'detail': NotRequired[str],
        'kind': Literal['permanent'],
        'rail_code': NotRequired[str | None],
    },
)

RetryableOutcome = TypedDict(
    'RetryableOutcome',
    {
        'code': SettlementFailureCode,
        'detail': NotRequired[str],
        'kind': Literal['retryable'],
        'rail_code': NotRequired[str | None],
        'retry_after_ms': NotRequired[int | None],
    },
)

SettlementSkipReason: TypeAlias = Literal['denied', 'no_economic_intent', 'zero_charge']

SkippedOutcome = TypedDict(
    'SkippedOutcome',
    {
        'kind': Literal['skipped'],
        'reason': SettlementSkipReason,
    },
)

OutcomeIn: TypeAlias = AcceptedOutcome | SkippedOutcome | RetryableOutcome | PermanentOutcome

OutcomeRequest = TypedDict(
    'OutcomeRequest',
    {
        'claim': Claim,
        'outcome': OutcomeIn,
    },
)

ClaimsIn = TypedDict(
    'ClaimsIn',
    {
        'groups': NotRequired[list[str] | None],
        'lease_ms': int,
        'limit': int,
        'outcomes': NotRequired[list[OutcomeRequest] | None],
        'wait_ms': NotRequired[int | None],
        'worker_id': str,
    },
)

DeadLetteredRoute = TypedDict(
    'DeadLetteredRoute',
    {
        'attempts': int,
        'kind': Literal['dead_lettered'],
    },
)

NoActionRoute = TypedDict(
    'NoActionRoute',
    {
        'kind': Literal['no_action'],
    },
)

RetryScheduledRoute = TypedDict(
    'RetryScheduledRoute',
    {
        'attempt': int,
        'kind': Literal['retry_scheduled'],
        'next_visible_at_ms': int,
    },
)

Route: TypeAlias = NoActionRoute | RetryScheduledRoute | DeadLetteredRoute

OutcomeResult = TypedDict(
    'OutcomeResult',
    {
        'error': NotRequired[Problem | None],
        'receipt_id': NotRequired[str | None],
        'route': NotRequired[Route | None],
    },
)

ClaimsOut = TypedDict(
    'ClaimsOut',
    {
        'claim_error': NotRequired[Problem | None],
        'claims': list[Claim],
        'look_again_ms': NotRequired[int | None],
        'results': NotRequired[list[OutcomeResult] | None],
    },
)

DatabaseOut = TypedDict(
    'DatabaseOut',
    {
        'failovers': int,
        'hosts': list[str],
        'primary': str,
        'writable': bool,
    },
)

FailureView = TypedDict(
    'FailureView',
    {
        'code': SettlementFailureCode,
        'detail_sha256': str,
        'rail_code': NotRequired[str | None],
    },
)

DeadLetter = TypedDict(
    'DeadLetter',
    {
        'attempts': int,
        'code': SettlementFailureCode,
        'dead_lettered_at_ms': int,
        'detail_sha256': str,
        'finalized_at': int,
        'group': str,
        'last_failure': FailureView,
        'receipt_id': str,
    },
)

DeadLettersOut = TypedDict(
    'DeadLettersOut',
    {
        'dead_letters': list[DeadLetter],
        'next': NotRequired[str | None],
        'next_cursor': str | None,
    },
)

HistoryOutcome: TypeAlias = Literal['accepted', 'skipped', 'retryable', 'permanent', 'released', 'redrive', 'hold', 'unhold', 'cancel']

RouteKind: TypeAlias = Literal['no_action', 'retry_scheduled', 'dead_lettered']

HistoryEntry = TypedDict(
    'HistoryEntry',
    {
        'actor': NotRequired[str | None],
        'attempt': int,
        'code': NotRequired[SettlementFailureCode | None],
        'detail_sha256': NotRequired[str | None],
        'note': NotRequired[str | None],
        'observed_at_ms': int,
        'outcome': HistoryOutcome,
        'rail_code': NotRequired[str | None],
        'reason': NotRequired[SettlementSkipReason | None],
        'retry_after_ms': NotRequired[int | None],
        'route': NotRequired[RouteKind | None],
        'transcript_id': NotRequired[str | None],
        'worker_id': str,
    },
)

FeedEntry: TypeAlias = dict[str, Any]

FeedPage = TypedDict(
    'FeedPage',
    {
        'entries': list[FeedEntry],
        'next_cursor': str,
    },
)

LeaseView = TypedDict(
    'LeaseView',
    {
        'owner': str,
        'until_ms': int,
    },
)

ReceiptState: TypeAlias = Literal['pending', 'leased', 'retry_scheduled', 'settled', 'skipped', 'dead_lettered', 'canceled']

FoundReceipt = TypedDict(
    'FoundReceipt',
    {
        'attempts': int,
        'finalized_at': int,
        'finished_at_ms': NotRequired[int | None],
        'group': str,
        'held_at_ms': NotRequired[int | None],
        'last_failure': NotRequired[FailureView | None],
        'lease': NotRequired[LeaseView | None],
        'next_visible_at_ms': NotRequired[int | None],
        'priority': int,
        'receipt_id': str,
        'state': ReceiptState,
    },
)

FoundReceipts = TypedDict(
    'FoundReceipts',
    {
        'next_cursor': str | None,
        'receipts': list[FoundReceipt],
    },
)

Rate = TypedDict(
    'Rate',
    {
        'burst': int,
        'per_second': float,
    },
)

GroupLimitsIn = TypedDict(
    'GroupLimitsIn',
    {
        'max_leased': NotRequired[int | None],
        'paused': NotRequired[bool],
        'rate': NotRequired[Rate | None],
    },
)

GroupView = TypedDict(
    'GroupView',
    {
        'depth': NotRequired[int | None],
        'group': str,
        'leased': int,
        'max_leased': NotRequired[int | None],
        'oldest_due_age_ms': int,
        'paused': bool,
        'rate': NotRequired[Rate | None],
    },
)

GroupsOut = TypedDict(
    'GroupsOut',
    {
        'groups': list[GroupView],
        'next': NotRequired[str | None],
    },
)

HealthStatus: TypeAlias = Literal['ok', 'ready']

HealthOut = TypedDict(
    'HealthOut',
    {
        'status': HealthStatus,
    },
)

Limits = TypedDict(
    'Limits',
    {
        'max_batch_items': int,
        'max_body_bytes': int,
        'max_claim_batch': int,
        'max_lease_ms': int,
        'max_observation_bytes': int,
        'max_receipt_id_bytes': int,
        'max_wait_ms': int,
        'max_worker_id_bytes': int,
    },
)

RetryPolicy = TypedDict(
    'RetryPolicy',
    {
        'backoff_cap_ms': int,
        'backoff_multiplier': int,
        'initial_backoff_ms': int,
        'max_retries': int,
    },
)

InfoOut = TypedDict(
    'InfoOut',
    {
        'backend': BackendKind,
        'caller': NotRequired[CallerOut | None],
        'database': NotRequired[DatabaseOut | None],
        'limits': Limits,
        'retry_policy': RetryPolicy,
        'store_binding': str,
        'version': str,
    },
)

LeaseExtendIn = TypedDict(
    'LeaseExtendIn',
    {
        'claim': Claim,
        'extend_ms': int,
    },
)

LeaseExtendBatchIn = TypedDict(
    'LeaseExtendBatchIn',
    {
        'leases': list[LeaseExtendIn],
    },
)

LeaseExtendResult = TypedDict(
    'LeaseExtendResult',
    {
        'claim': NotRequired[Claim | None],
        'error': NotRequired[Problem | None],
        'receipt_id': NotRequired[str | None],
    },
)

LeaseExtendBatchOut = TypedDict(
    'LeaseExtendBatchOut',
    {
        'results': list[LeaseExtendResult],
    },
)

LeaseReleaseIn = TypedDict(
    'LeaseReleaseIn',
    {
        'claim': Claim,
    },
)

OutcomeBatchIn = TypedDict(
    'OutcomeBatchIn',
    {
        'outcomes': list[OutcomeRequest],
    },
)

OutcomeBatchOut = TypedDict(
    'OutcomeBatchOut',
    {
        'results': list[OutcomeResult],
    },
)

ReasonIn = TypedDict(
    'ReasonIn',
    {
        'reason': NotRequired[str | None],
    },
)

ReceiptIn = TypedDict(
    'ReceiptIn',
    {
        'finalized_at': int,
        'group': NotRequired[str | None],
        'observation': NotRequired[Observation | None],
        'priority': NotRequired[int | None],
        'receipt_id': str,
        'traceparent': NotRequired[str | None],
        'tracestate': NotRequired[str | None],
        'visible_at_ms': NotRequired[int | None],
    },
)

ReceiptBatchIn = TypedDict(
    'ReceiptBatchIn',
    {
        'receipts': list[ReceiptIn],
    },
)

ReceiptBatchResult = TypedDict(
    'ReceiptBatchResult',
    {
        'error': NotRequired[Problem | None],
        'receipt_id': NotRequired[str | None],
        'status': BatchItemStatus,
    },
)

ReceiptBatchOut = TypedDict(
    'ReceiptBatchOut',
    {
        'results': list[ReceiptBatchResult],
    },
)

ReceiptSummary = TypedDict(
    'ReceiptSummary',
    {
        'attempts': int,
        'finalized_at': int,
        'receipt_id': str,
    },
)

ReceiptView = TypedDict(
    'ReceiptView',
    {
        'attempts': int,
        'cancel_reason': NotRequired[str | None],
        'dead_letter': NotRequired[DeadLetter | None],
        'finalized_at': int,
        'group': str,
        'held_at_ms': NotRequired[int | None],
        'history': list[HistoryEntry],
        'last_failure': NotRequired[FailureView | None],
        'lease': NotRequired[LeaseView | None],
        'next_visible_at_ms': NotRequired[int | None],
        'observation': NotRequired[Observation | None],
        'priority': int,
        'receipt_id': str,
        'row_version': int,
        'skip_reason': NotRequired[SettlementSkipReason | None],
        'state': ReceiptState,
        'transcript_id': NotRequired[str | None],
    },
)

RedriveIn: TypeAlias = dict[str, Any]

SearchOrder: TypeAlias = Literal['newest', 'oldest']

StateCounts = TypedDict(
    'StateCounts',
    {
        'canceled': int,
        'dead_lettered': int,
        'held': int,
        'leased': int,
        'pending': int,
        'retry_scheduled': int,
        'scheduled': int,
        'settled': int,
        'skipped': int,
    },
)

StateSample = TypedDict(
    'StateSample',
    {
        'receipts': list[ReceiptSummary],
        'returned': int,
        'total': int,
        'truncated': bool,
    },
)

StatsCounts = TypedDict(
    'StatsCounts',
    {
        'conflicts': int,
        'dead_lettered': int,
        'enqueued': int,
        'retried': int,
        'settled': int,
        'skipped': int,
    },
)

StatsMinuteOut: TypeAlias = dict[str, Any]

StatsOut = TypedDict(
    'StatsOut',
    {
        'minute_ms': int,
        'minutes': list[StatsMinuteOut],
        'now_ms': int,
    },
)

StatusView = TypedDict(
    'StatusView',
    {
        'counts': StateCounts,
        'groups': list[GroupView],
        'oldest_due_age_ms': int,
        'samples': dict[str, Any],
    },
)


# operation id -> (method, path template)
OPERATIONS: dict[str, tuple[str, str]] = {
    'health.alive': ('GET', '/healthz'),
    'health.ready': ('GET', '/readyz'),
    'v1.bulk.act': ('POST', '/v1/bulk/{action}'),
    'v1.claims.create': ('POST', '/v1/claims'),
    'v1.dead_letters.list': ('GET', '/v1/dead-letters'),
    'v1.dead_letters.get': ('GET', '/v1/dead-letters/{id}'),
    'v1.dead_letters.redrive': ('POST', '/v1/dead-letters/{id}/redrive'),
    'v1.groups.list': ('GET', '/v1/groups'),
    'v1.groups.get': ('GET', '/v1/groups/{group}'),
    'v1.groups.put': ('PUT', '/v1/groups/{group}'),
    'v1.history.list': ('GET', '/v1/history'),
    'v1.info.get': ('GET', '/v1/info'),
    'v1.leases.extend': ('POST', '/v1/leases/extend'),
    'v1.outcomes.batch': ('POST', '/v1/outcomes'),
    'v1.receipts.find': ('GET', '/v1/receipts'),
    'v1.receipts.create': ('POST', '/v1/receipts'),
    'v1.receipts.batch': ('POST', '/v1/receipts/batch'),
    'v1.receipts.get': ('GET', '/v1/receipts/{id}'),
    'v1.receipts.claim': ('POST', '/v1/receipts/{id}/claim'),
    'v1.receipts.lease.extend': ('POST', '/v1/receipts/{id}/lease'),
    'v1.receipts.lease.release': ('DELETE', '/v1/receipts/{id}/lease'),
    'v1.receipts.outcome': ('POST', '/v1/receipts/{id}/outcome'),
    'v1.receipts.cancel': ('POST', '/v1/receipts/{receipt_id}/cancel'),
    'v1.receipts.hold': ('POST', '/v1/receipts/{receipt_id}/hold'),
    'v1.receipts.unhold': ('POST', '/v1/receipts/{receipt_id}/unhold'),
    'v1.stats.get': ('GET', '/v1/stats'),
    'v1.status.get': ('GET', '/v1/status'),
}
