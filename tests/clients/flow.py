"""A producer, a worker and an operator using the Python client generated from openapi.yaml
(openapi-python-client) against a real server. Run by tests/dashboard.rs: SETTLED_URL and
SETTLED_{PRODUCER,WORKER,OPERATOR}_TOKEN come from the environment, the client is generated
into tests/clients/generated/python (on PYTHONPATH)."""

import os

import httpx
from settled_client import AuthenticatedClient
from settled_client.api.claims import v1_claims_create
from settled_client.api.dead_letters import v1_dead_letters_list, v1_dead_letters_redrive
from settled_client.api.operations import v1_status_get
from settled_client.api.outcomes import v1_outcomes_batch, v1_receipts_outcome
from settled_client.api.receipts import v1_receipts_batch, v1_receipts_create, v1_receipts_get
from settled_client.models import (
    AcceptedOutcome,
    BatchItemStatus,
    ClaimsIn,
    DeadLetteredRoute,
    HistoryOutcome,
    Observation,
    OutcomeBatchIn,
    OutcomeRequest,
    PermanentOutcome,
    Problem,
    ProblemClass,
    ProblemCode,
    ReceiptBatchIn,
    ReceiptIn,
    ReceiptState,
    RetryableOutcome,
    RetryScheduledRoute,
    RouteKind,
    SettlementFailureCode,
)

BASE = os.environ["SETTLED_URL"]


def api(token: str) -> AuthenticatedClient:
    return AuthenticatedClient(base_url=BASE, token=token, timeout=httpx.Timeout(60.0))


producer = api(os.environ["SETTLED_PRODUCER_TOKEN"])
worker = api(os.environ["SETTLED_WORKER_TOKEN"])
operator = api(os.environ["SETTLED_OPERATOR_TOKEN"])

# A producer enqueues receipts with an observation of its own shape.
created = v1_receipts_create.sync_detailed(
    client=producer,
    body=ReceiptIn(
        receipt_id="py-1",
        finalized_at=1764460800,
        observation=Observation.from_dict({"amount_cents": 1250, "currency": "EUR"}),
    ),
)
assert created.status_code == 201, created
assert created.parsed.observation["amount_cents"] == 1250, created.parsed
batch = v1_receipts_batch.sync(
    client=producer,
    body=ReceiptBatchIn(
        receipts=[
            ReceiptIn(
                receipt_id="py-2",
                finalized_at=1764460801,
                observation=Observation.from_dict({"amount_cents": 990}),
            )
        ]
    ),
)
assert batch.results[0].status == BatchItemStatus.CREATED, batch

# A worker claims them and reads the observation.
claimed = v1_claims_create.sync(
    client=worker, body=ClaimsIn(worker_id="py-worker", lease_ms=60000, limit=10)
)
claims = {claim.receipt_id: claim for claim in claimed.claims}
first, second = claims["py-1"], claims["py-2"]
assert first.observation["amount_cents"] == 1250, first

# The rail timed out: a retryable failure is scheduled again.
route = v1_receipts_outcome.sync(
    client=worker,
    id="py-1",
    body=OutcomeRequest(
        claim=first,
        outcome=RetryableOutcome(
            kind="retryable", code=SettlementFailureCode.RPC, detail="timeout talking to rail"
        ),
    ),
)
assert isinstance(route, RetryScheduledRoute) and route.attempt == 1, route

# The same claim again is stale: 409, a problem a client can branch on.
stale = v1_receipts_outcome.sync_detailed(
    client=worker,
    id="py-1",
    body=OutcomeRequest(
        claim=first, outcome=AcceptedOutcome(kind="accepted", transcript_id="tx-py-1")
    ),
)
assert stale.status_code == 409 and isinstance(stale.parsed, Problem), stale
assert stale.parsed.code == ProblemCode.RECEIPT_NOT_LEASED, stale.parsed
assert stale.parsed.class_ == ProblemClass.CONFLICT, stale.parsed

# A batch of outcomes, judged item by item.
results = v1_outcomes_batch.sync(
    client=worker,
    body=OutcomeBatchIn(
        outcomes=[
            OutcomeRequest(
                claim=second,
                outcome=PermanentOutcome(
                    kind="permanent",
                    code=SettlementFailureCode.INVALID_RECEIPT_SIGNATURE,
                    detail="bad signature",
                ),
            ),
            OutcomeRequest(
                claim=first, outcome=AcceptedOutcome(kind="accepted", transcript_id="tx-py-1")
            ),
        ]
    ),
).results
assert isinstance(results[0].route, DeadLetteredRoute), results[0]
assert results[0].route.attempts == 1, results[0]
assert results[1].error.code == ProblemCode.RECEIPT_NOT_LEASED, results[1]

# The history numbers invocations from 1; the receipt counts failures.
receipt = v1_receipts_get.sync(client=worker, id="py-1")
entry = receipt.history[0]
assert receipt.attempts == 1 and entry.attempt == 1, receipt
assert entry.outcome == HistoryOutcome.RETRYABLE, entry
assert entry.route == RouteKind.RETRY_SCHEDULED, entry

# An operator pages through the dead letters and redrives one.
page = v1_dead_letters_list.sync(client=operator, limit=100)
assert [letter.receipt_id for letter in page.dead_letters] == ["py-2"], page
assert page.dead_letters[0].code == SettlementFailureCode.INVALID_RECEIPT_SIGNATURE, page
redriven = v1_dead_letters_redrive.sync(client=operator, id="py-2")
assert redriven.state == ReceiptState.PENDING and redriven.attempts == 0, redriven

# A wrong token is a 401 problem; a worker may not redrive (403).
unknown = v1_status_get.sync_detailed(client=api("not-a-configured-token-0123456789"))
assert unknown.status_code == 401 and isinstance(unknown.parsed, Problem), unknown
assert unknown.parsed.code == ProblemCode.UNAUTHORIZED, unknown.parsed
assert unknown.parsed.class_ == ProblemClass.AUTH, unknown.parsed
forbidden = v1_dead_letters_redrive.sync_detailed(client=worker, id="py-2")
assert forbidden.status_code == 403 and forbidden.parsed.code == ProblemCode.FORBIDDEN, forbidden

print("python flow: ok")
