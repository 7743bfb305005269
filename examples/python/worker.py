#!/usr/bin/env python3
"""A settled worker on the Python SDK (`pip install ./clients/python`).

It claims due receipts with a long poll, settles each one on a simulated payment
rail (timeouts, declines, zero charges, slow settlements), and lets the SDK do
the rest: heartbeats, batched outcomes, backoff, and a clean stop on SIGTERM or
Ctrl-C that releases the work not started.

    SETTLED_URL=http://127.0.0.1:8080 python3 examples/python/worker.py --worker-id py-1

Every flag can also be set through the environment variable shown by --help.
Logs go to stderr (warnings and errors, every outcome with --verbose); on exit
one JSON line with the worker's counters goes to stdout. Exit status: 0 after a clean stop, 2 for a configuration error that
retrying cannot fix (bad token, refused parameters).
"""

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import os
import random
import socket
import sys

import settled


def env(name, default):
    value = os.environ.get(name)
    return default if value in (None, "") else value


def parse_args(argv):
    p = argparse.ArgumentParser(description="settled worker (Python SDK)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    flag = p.add_argument
    flag("--url", default=env("SETTLED_URL", "http://127.0.0.1:8080"), help="base URL [env SETTLED_URL]")
    flag("--token", default=None, help="Bearer token with the worker role [env SETTLED_TOKEN]")
    flag("--worker-id", default=env("SETTLED_WORKER_ID", f"py-{socket.gethostname()}-{os.getpid()}"),
         help="lease owner name, 1..=128 bytes [env SETTLED_WORKER_ID]")
    flag("--concurrency", type=int, default=int(env("SETTLED_CONCURRENCY", 8)),
         help="receipts settled at once [env SETTLED_CONCURRENCY]")
    flag("--batch-size", type=int, default=int(env("SETTLED_BATCH_SIZE", 16)),
         help="receipts claimed per poll, 1..=1024 [env SETTLED_BATCH_SIZE]")
    flag("--lease-ms", type=int, default=int(env("SETTLED_LEASE_MS", 30000)),
         help="lease length asked for and extended to [env SETTLED_LEASE_MS]")
    flag("--wait-ms", type=int, default=int(env("SETTLED_WAIT_MS", 5000)),
         help="long-poll wait when nothing is due, 0..=20000 [env SETTLED_WAIT_MS]")
    flag("--exit-when-idle", type=int, default=int(env("SETTLED_EXIT_WHEN_IDLE", 0)), metavar="N",
         help="exit after N consecutive empty polls with no job in hand; 0 = never "
              "[env SETTLED_EXIT_WHEN_IDLE]")
    flag("--timeout-rate", type=float, default=float(env("RAIL_TIMEOUT_RATE", 0.05)),
         help="probability the rail times out (retryable, code rpc) [env RAIL_TIMEOUT_RATE]")
    flag("--decline-rate", type=float, default=float(env("RAIL_DECLINE_RATE", 0.02)),
         help="probability the rail declines (permanent, code verification) [env RAIL_DECLINE_RATE]")
    flag("--slow-rate", type=float, default=float(env("RAIL_SLOW_RATE", 0.0)),
         help="probability a settlement is slow and needs heartbeats [env RAIL_SLOW_RATE]")
    flag("--slow-ms", type=int, default=int(env("RAIL_SLOW_MS", 0)),
         help="duration of a slow settlement; 0 = 1.5 x lease-ms [env RAIL_SLOW_MS]")
    flag("--latency-ms", type=int, default=int(env("RAIL_LATENCY_MS", 5)),
         help="upper bound of a normal settlement's duration [env RAIL_LATENCY_MS]")
    flag("--seed", type=int, default=None, help="seed of the simulated rail [env RAIL_SEED]")
    flag("--verbose", action="store_true", help="log every outcome")
    args = p.parse_args(argv)
    args.token = args.token or env("SETTLED_TOKEN", None)  # read after parsing: --help never shows it
    if args.seed is None and env("RAIL_SEED", None) is not None:
        args.seed = int(env("RAIL_SEED", None))
    args.slow_ms = args.slow_ms if args.slow_ms > 0 else args.lease_ms * 3 // 2
    return args


class SimulatedRail:
    """Stands in for a payment rail. Idempotent, keyed by receipt id: asking again for
    a receipt it accepted returns the same transcript instead of charging twice."""

    def __init__(self, args):
        self.args, self.rng, self.accepted = args, random.Random(args.seed), {}

    async def charge(self, receipt_id, observation):
        if receipt_id in self.accepted:
            return self.accepted[receipt_id]
        amount = (observation or {}).get("amount_cents")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise settled.Permanent("invalid_observation", "amount_cents must be a non-negative integer")
        if amount == 0:
            raise settled.Skip("zero_charge")
        a = self.args
        slow = self.rng.random() < a.slow_rate
        await asyncio.sleep(a.slow_ms / 1000 if slow else self.rng.uniform(0, a.latency_ms) / 1000)
        roll = self.rng.random()
        if roll < a.timeout_rate:
            raise settled.Retryable("rpc", "rail timed out")
        if roll < a.timeout_rate + a.decline_rate:
            # `code` is one of the spec's closed set; `rail_code` is the rail's own word for it.
            raise settled.Permanent("verification", "rail declined the charge", rail_code="card_declined")
        self.accepted[receipt_id] = "tx-" + hashlib.sha256(receipt_id.encode()).hexdigest()[:24]
        return self.accepted[receipt_id]


# The worker: everything settled-specific is below.

# Events that end a claimed job here: its outcome's route, a release, a lost lease, a refusal.
DONE_EVENTS = {"no_action", "retry_scheduled", "dead_lettered", "released", "lease_lost", "error"}


def main(argv):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {args.worker_id} %(levelname)s %(message)s")
    rail = SimulatedRail(args)

    async def handler(job: settled.Job) -> str:
        return await rail.charge(job.receipt_id, job.observation)  # the rail's transcript id

    idle = 0
    holding = set()  # receipts claimed and not yet answered: a retry may follow

    def on_event(event, job, info):
        nonlocal idle
        if event == "claimed":
            holding.add(job.receipt_id)
        elif event in DONE_EVENTS and job is not None:
            holding.discard(job.receipt_id)
        if event == "poll":
            # A poll is idle only with nothing in hand: a slow job may still end in a retry.
            idle = 0 if info["claimed"] or holding else idle + 1
            if args.exit_when_idle and idle >= args.exit_when_idle:
                worker.stop()
        elif args.verbose and job is not None:
            logging.info("%s %s %s", event, job.receipt_id, info.get("route", info.get("reason", "")))

    client = settled.AsyncClient(args.url, token=args.token)
    worker = settled.Worker(client, worker_id=args.worker_id, handler=handler,
                            concurrency=args.concurrency, batch_size=args.batch_size,
                            lease_ms=args.lease_ms, wait_ms=args.wait_ms, on_event=on_event)
    status = 0
    try:
        worker.run()  # until SIGTERM / Ctrl-C (a second one stops at once)
    except settled.WorkerStopped as e:
        print(f"{args.worker_id}: {e}", file=sys.stderr)
        status = 2
    s = worker.stats
    print(json.dumps({"worker_id": args.worker_id, "claimed": s.claimed, "accepted": s.settled,
                      "skipped": s.skipped, "retryable": s.retried, "permanent": s.dead_lettered,
                      "released": s.released, "lost": s.leases_lost, "heartbeats": s.heartbeats,
                      "refused": s.outcomes_refused, "errors": dict(s.errors)}), flush=True)
    # The interpreter's last garbage collection walks every object left (aiohttp's modules are
    # many), which on a busy machine takes a good part of a second: skip it, to exit at once.
    gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
