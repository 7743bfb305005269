#!/usr/bin/env bash
# An operator's walkthrough of settled with curl and jq (docs/operators.md has each call):
#
#   1. enqueue a few receipts (in a group of their own) and look at /v1/status;
#   2. hold one and unhold it; cancel another;
#   3. make one fail for good (claim it, report a permanent failure with the rail's own code):
#      it is dead-lettered;
#   4. list the dead letters, inspect one, redrive it;
#   5. hold the walkthrough's receipts all at once (a dry run first, then with the count seen);
#   6. pause the group, limit it, lift its limits;
#   7. claim and settle everything still active, show one history and the feed of it all.
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
GROUP="operator-walkthrough"   # pausing and limiting it touches no one else's work

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

# refused WANT METHOD PATH JSON-BODY — a request that must be refused with HTTP WANT: prints
# the status and the problem's code and detail.
refused() {
  local want=$1 method=$2 path=$3 body=$4 status
  status=$(curl -sS -o "$SCRATCH" -w '%{http_code}' -X "$method" ${AUTH[@]+"${AUTH[@]}"} \
    -H 'content-type: application/json' --data-binary "$body" "$S$path")
  echo "HTTP $status"
  jq -c '{code, detail}' "$SCRATCH"
  [[ "$status" == "$want" ]]
}

if [[ -t 1 ]]; then
  step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
else
  step() { printf '\n== %s\n' "$*"; }
fi

SCRATCH=$(mktemp)
trap 'rm -f "$SCRATCH" "$SCRATCH.limits"' EXIT

GOOD="op-$RUN-coffee"     # held and unheld, then settled
ZERO="op-$RUN-refund"     # amount 0: a worker skips it
BAD="op-$RUN/tea #1"      # fails for good once, is redriven, then settled (note the / # space)
DUP="op-$RUN-coffee-again" # a duplicate: canceled

step "The service: version, backend, retry policy"
api GET /v1/info | jq '{version, backend, store_binding, retry_policy}'

# The feed's newest entry now: everything after it is this walkthrough's (or anyone's meanwhile).
TIP=$(api GET '/v1/history?after=latest&limit=1' | jq -r .next_cursor)

step "Enqueue four receipts in one batch, in the group '$GROUP'"
api POST /v1/receipts/batch "$(jq -cn --arg a "$GOOD" --arg b "$ZERO" --arg c "$BAD" --arg d "$DUP" --arg g "$GROUP" '{receipts: [
  {receipt_id: $a, finalized_at: 1764460800, group: $g, observation: {amount_cents: 1250}},
  {receipt_id: $b, finalized_at: 1764460801, group: $g, observation: {amount_cents: 0}},
  {receipt_id: $c, finalized_at: 1764460802, group: $g, observation: {amount_cents: 480}},
  {receipt_id: $d, finalized_at: 1764460803, group: $g, observation: {amount_cents: 1250}}]}')" | jq -c '.results[]'

step "Enqueueing the same receipt again changes nothing (200, not 201)"
api POST /v1/receipts "$(jq -cn --arg a "$GOOD" --arg g "$GROUP" \
  '{receipt_id: $a, finalized_at: 1764460800, group: $g, observation: {amount_cents: 1250}}')" | jq -c '{receipt_id, state}'

step "Status: counts per state and the age of the oldest due receipt"
api GET '/v1/status?limit=5' | jq '{counts, oldest_due_age_ms}'

step "Hold '$GOOD': no claim takes it until it is unheld (the reason is kept in its history)"
api POST "/v1/receipts/$(enc "$GOOD")/hold" '{"reason":"checking with the merchant"}' | jq -c '{receipt_id, state, held_at_ms}'
api GET '/v1/status?limit=1' | jq -c '{held: .counts.held}'
refused 409 POST "/v1/receipts/$(enc "$GOOD")/claim" "{\"worker_id\":\"$WORKER\",\"lease_ms\":30000}"

step "Unhold it: claimable again (no body needed)"
api POST "/v1/receipts/$(enc "$GOOD")/unhold" | jq -c '{receipt_id, state, held_at_ms}'

step "Cancel '$DUP': finished for good, never settled (a cancel needs a reason)"
api POST "/v1/receipts/$(enc "$DUP")/cancel" '{"reason":"duplicate of the coffee receipt"}' | jq -c '{receipt_id, state, cancel_reason}'

step "A worker claims '$BAD' by id under a 30 s lease"
CLAIM=$(api POST "/v1/receipts/$(enc "$BAD")/claim" "{\"worker_id\":\"$WORKER\",\"lease_ms\":30000}")
echo "$CLAIM" | jq 'del(.lease_token) + {lease_token: "(secret, send it back as is)"}'

step "The rail declines it for good: report a permanent failure, with the rail's own code"
api POST "/v1/receipts/$(enc "$BAD")/outcome" "$(jq -cn --argjson claim "$CLAIM" \
  '{claim: $claim, outcome: {kind: "permanent", code: "verification", rail_code: "card_declined", detail: "card issuer declined"}}')" | jq -c .

step "The spent claim is refused if sent again (409)"
refused 409 POST "/v1/receipts/$(enc "$BAD")/outcome" \
  "$(jq -cn --argjson claim "$CLAIM" '{claim: $claim, outcome: {kind: "accepted", transcript_id: "tx-forged"}}')"

step "Dead letters (first page; pass next_cursor as cursor for the next)"
api GET '/v1/dead-letters?limit=10' \
  | jq -c '(.dead_letters[] | {receipt_id, attempts, code: .last_failure.code, rail_code: .last_failure.rail_code}), {next_cursor}'

step "Inspect the dead letter of '$BAD'"
api GET "/v1/dead-letters/$(enc "$BAD")" | jq .

step "The cause is fixed: redrive it (pending again, attempts 0, history kept)"
api POST "/v1/dead-letters/$(enc "$BAD")/redrive" | jq '{receipt_id, state, attempts, last_failure}'

step "Status after the redrive"
api GET '/v1/status?limit=1' | jq -c .counts

step "Hold this walkthrough's pending receipts at once: a dry run first"
SELECTION=$(jq -cn --arg p "op-$RUN" '{filter: {prefix: $p, state: "pending"}, reason: "walkthrough: bulk hold"}')
DRY=$(api POST /v1/bulk/hold "$(jq -c '. + {dry_run: true}' <<<"$SELECTION")")
jq -c '{matched, done, unchanged, refused, sample}' <<<"$DRY"
COUNT=$(jq .matched <<<"$DRY")

step "Then for real, with the count the dry run matched ($COUNT): a selection of another size is refused"
api POST /v1/bulk/hold "$(jq -c --argjson n "$COUNT" '. + {expect_count: $n}' <<<"$SELECTION")" \
  | jq -c '{complete, done, unchanged, refused}'
api GET '/v1/status?limit=1' | jq -c '{held: .counts.held}'

step "Unhold them by id"
api POST /v1/bulk/unhold "$(jq -cn --arg a "$GOOD" --arg b "$ZERO" --arg c "$BAD" '{receipt_ids: [$a, $b, $c]}')" \
  | jq -c '{complete, done, unchanged, refused}'

step "Pause the group '$GROUP' (PUT sets paused, max_leased and rate together: send them all)"
api GET "/v1/groups/$(enc "$GROUP")" | jq -c '{paused: true, max_leased, rate}' > "$SCRATCH.limits"
api PUT "/v1/groups/$(enc "$GROUP")" "$(cat "$SCRATCH.limits")" | jq -c '{group, paused, max_leased, rate}'
refused 409 POST "/v1/receipts/$(enc "$GOOD")/claim" "{\"worker_id\":\"$WORKER\",\"lease_ms\":30000}"

step "Resume it with limits: at most 10 live leases, 5 claims a second (bursts of 10)"
api PUT "/v1/groups/$(enc "$GROUP")" '{"max_leased":10,"rate":{"per_second":5,"burst":10}}' \
  | jq -c '{group, paused, max_leased, rate}'

step "Lift every limit (a limit left out of PUT is lifted)"
api PUT "/v1/groups/$(enc "$GROUP")" '{}' | jq -c '{group, paused, max_leased, rate}'

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

step "The history of '$BAD': the permanent failure, the redrive, the holds, the settlement"
api GET "/v1/receipts/$(enc "$BAD")" | jq '{receipt_id, state, attempts, transcript_id, last_failure, history}'

step "The feed since this walkthrough began: every history entry, in commit order"
api GET "/v1/history?after=$(enc "$TIP")&limit=1000" \
  | jq -r '.entries[] | [.cursor, .receipt_id, .outcome, .route // "-", .code // "-", .rail_code // "-"] | @tsv'

step "Final status"
api GET '/v1/status?limit=1' | jq -c .counts
