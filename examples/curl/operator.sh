#!/usr/bin/env bash
# An operator's walkthrough of settled with curl and jq:
#
#   1. enqueue a few receipts and look at /v1/status;
#   2. make one fail for good (claim it, report a permanent failure): it is dead-lettered;
#   3. list the dead letters, inspect one, redrive it;
#   4. claim and settle everything this walkthrough enqueued, and show the history.
#
# Usage:
#   SETTLED_URL=http://127.0.0.1:8080 examples/curl/operator.sh
#
# Environment:
#   SETTLED_URL    base URL of the service (default http://127.0.0.1:8080)
#   SETTLED_TOKEN  Bearer token, if the service has tokens (the operator role may do every step)
#   RUN            suffix of the receipt ids (default: the current time), so the walkthrough
#                  can run again against the same database
#
# Needs bash, curl (7.76 or later, for --fail-with-body) and jq. Every failed request stops
# the script and prints the service's problem+json answer.
set -euo pipefail

S="${SETTLED_URL:-http://127.0.0.1:8080}"
S="${S%/}"
RUN="${RUN:-$(date +%s)}"
WORKER="operator-walkthrough"

for tool in curl jq; do
  command -v "$tool" >/dev/null || { echo "operator.sh: $tool is required" >&2; exit 127; }
done

AUTH=()
if [[ -n "${SETTLED_TOKEN:-}" ]]; then
  AUTH=(-H "Authorization: Bearer ${SETTLED_TOKEN}")
fi

# api METHOD PATH [JSON-BODY] — prints the response body; fails on any 4xx/5xx.
api() {
  local method=$1 path=$2 body=${3:-}
  local args=(-sS --fail-with-body -X "$method" ${AUTH[@]+"${AUTH[@]}"} -H 'accept: application/json')
  if [[ -n "$body" ]]; then
    args+=(-H 'content-type: application/json' --data-binary "$body")
  elif [[ "$method" != GET ]]; then
    # settled refuses any state-changing request not marked as JSON, even one
    # without a body (a redrive): a web page's form cannot send that header.
    args+=(-H 'content-type: application/json')
  fi
  curl "${args[@]}" "$S$path"
}

# Receipt ids can hold any character: percent-encode them for URL paths.
enc() { jq -rn --arg v "$1" '$v | @uri'; }

if [[ -t 1 ]]; then
  step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  step() { printf '\n== %s\n' "$*"; }
fi

SCRATCH=$(mktemp)
trap 'rm -f "$SCRATCH"' EXIT

GOOD="op-$RUN-coffee"     # will be settled
ZERO="op-$RUN-refund"     # amount 0: a worker skips it
BAD="op-$RUN/tea #1"      # fails for good once, is redriven, then settled (note the / # space)

step "The service: version, backend, retry policy"
api GET /v1/info | jq '{version, backend, store_binding, retry_policy}'

step "Enqueue three receipts in one batch"
api POST /v1/receipts/batch "$(jq -cn --arg a "$GOOD" --arg b "$ZERO" --arg c "$BAD" '{receipts: [
  {receipt_id: $a, finalized_at: 1764460800, observation: {amount_cents: 1250}},
  {receipt_id: $b, finalized_at: 1764460801, observation: {amount_cents: 0}},
  {receipt_id: $c, finalized_at: 1764460802, observation: {amount_cents: 480}}]}')" | jq -c '.results[]'

step "Enqueueing the same receipt again changes nothing (200, not 201)"
api POST /v1/receipts "$(jq -cn --arg a "$GOOD" \
  '{receipt_id: $a, finalized_at: 1764460800, observation: {amount_cents: 1250}}')" | jq -c '{receipt_id, state}'

step "Status: counts per state and the age of the oldest due receipt"
api GET '/v1/status?limit=5' | jq '{counts, oldest_due_age_ms}'

step "A worker claims '$BAD' by id under a 30 s lease"
CLAIM=$(api POST "/v1/receipts/$(enc "$BAD")/claim" "{\"worker_id\":\"$WORKER\",\"lease_ms\":30000}")
echo "$CLAIM" | jq 'del(.lease_token) + {lease_token: "(secret, send it back as is)"}'

step "The rail declines it for good: report a permanent failure"
api POST "/v1/receipts/$(enc "$BAD")/outcome" "$(jq -cn --argjson claim "$CLAIM" \
  '{claim: $claim, outcome: {kind: "permanent", code: "verification", detail: "card issuer declined"}}')" | jq -c .

step "The spent claim is refused if sent again (409 lease_conflict)"
STATUS=$(curl -sS -o "$SCRATCH" -w '%{http_code}' -X POST ${AUTH[@]+"${AUTH[@]}"} \
  -H 'content-type: application/json' "$S/v1/receipts/$(enc "$BAD")/outcome" \
  --data-binary "$(jq -cn --argjson claim "$CLAIM" '{claim: $claim, outcome: {kind: "accepted", transcript_id: "tx-forged"}}')")
echo "HTTP $STATUS"
jq -c '{code, class, detail}' "$SCRATCH"
[[ "$STATUS" == 409 ]]

step "Dead letters (first page)"
api GET '/v1/dead-letters?limit=10' | jq -c '.dead_letters[] | {receipt_id, attempts, code}'

step "Inspect the dead letter of '$BAD'"
api GET "/v1/dead-letters/$(enc "$BAD")" | jq .

step "The cause is fixed: redrive it (pending again, attempts 0, history kept)"
api POST "/v1/dead-letters/$(enc "$BAD")/redrive" | jq '{receipt_id, state, attempts, last_failure}'

step "Status after the redrive"
api GET '/v1/status?limit=1' | jq -c .counts

step "A worker claims the three receipts by id and reports all outcomes in one batch"
ITEMS='[]'
for id in "$GOOD" "$ZERO" "$BAD"; do
  claim=$(api POST "/v1/receipts/$(enc "$id")/claim" "{\"worker_id\":\"$WORKER\",\"lease_ms\":30000}")
  amount=$(echo "$claim" | jq '.observation.amount_cents')
  if [[ "$amount" == 0 ]]; then
    outcome='{"kind":"skipped","reason":"zero_charge"}'
  else
    outcome=$(jq -cn --arg id "$id" '{kind: "accepted", transcript_id: ("tx-" + ($id | @base64))}')
  fi
  ITEMS=$(jq -c --argjson claim "$claim" --argjson outcome "$outcome" '. + [{claim: $claim, outcome: $outcome}]' <<<"$ITEMS")
done
RESULTS=$(api POST /v1/outcomes "{\"outcomes\":$ITEMS}")
echo "$RESULTS" | jq -c '.results[]'
# Each item is judged on its own: check that none was refused.
jq -e 'all(.results[]; .error == null)' <<<"$RESULTS" >/dev/null

step "The history of '$BAD': the permanent failure, the redrive, the settlement"
api GET "/v1/receipts/$(enc "$BAD")" | jq '{receipt_id, state, attempts, transcript_id, history}'

step "Final status"
api GET '/v1/status?limit=1' | jq -c .counts
