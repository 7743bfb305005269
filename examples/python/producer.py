#!/usr/bin/env python3
"""A settled producer on the Python SDK (`pip install ./clients/python`).

Enqueues one receipt, then a batch, sends the batch again to show that enqueueing
is idempotent (nothing changes: every receipt is `existing`), and reads one back.

    SETTLED_URL=http://127.0.0.1:8080 python3 examples/python/producer.py --count 20

With tokens on, pass a `producer` token in SETTLED_TOKEN. Exit status: 0 when
every receipt was enqueued, 1 when one was refused.
"""

import argparse
import asyncio
import os
import random
import sys
import time

import settled


def parse_args(argv):
    p = argparse.ArgumentParser(description="settled producer (Python SDK)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--url", default=os.environ.get("SETTLED_URL") or "http://127.0.0.1:8080",
                   help="base URL [env SETTLED_URL]")
    p.add_argument("--count", type=int, default=10, help="receipts in the batch, 1..=1024")
    p.add_argument("--prefix", default=f"demo-{int(time.time())}", help="receipt id prefix")
    p.add_argument("--group", default=None, help="the receipts' group (a rail, a merchant)")
    args = p.parse_args(argv)
    args.token = os.environ.get("SETTLED_TOKEN") or None  # not a flag: --help never shows it
    return args


async def produce(args) -> int:
    finalized_at = int(time.time())  # when the receipts were finalized, Unix seconds
    async with settled.AsyncClient(args.url, token=args.token) as client:
        # One receipt (retried by the client on 503 or a lost connection: enqueueing is idempotent).
        one = await client.enqueue(f"{args.prefix}-first", finalized_at, {"amount_cents": 1250}, group=args.group)
        print(f"enqueued {one['receipt_id']}")

        batch: list[settled.ReceiptIn] = [
            {"receipt_id": f"{args.prefix}-{i:04}", "finalized_at": finalized_at,
             "observation": {"amount_cents": random.choice([0, 500, 1250, 9900])}}
            for i in range(args.count)
        ]
        if args.group is not None:
            for receipt in batch:
                receipt["group"] = args.group
        refused = 0
        for attempt in ("first", "again"):
            results = await client.enqueue_batch(batch)
            statuses = {}
            for result in results:
                statuses[result["status"]] = statuses.get(result["status"], 0) + 1
                if result["status"] in ("conflict", "invalid"):
                    refused += 1
                    print(f"  {result.get('receipt_id')}: {result['status']} {result.get('error')}", file=sys.stderr)
            print(f"batch of {len(batch)}, {attempt}: {statuses}")

        view = await client.get(batch[0]["receipt_id"])
        print(f"{view['receipt_id']}: {view['state']}, attempts {view['attempts']}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(produce(parse_args(sys.argv[1:]))))
