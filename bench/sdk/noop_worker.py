"""A Python SDK worker with a no-op handler, for bench/sdk/run.py: settles what it claims,
stops after 3 empty polls, prints its counters."""

import json
import sys

import settled


def main(url: str, worker_id: str, concurrency: int, batch: int) -> None:
    idle = 0

    async def handler(job: settled.Job) -> None:
        return None

    def on_event(event: str, job: object, info: dict) -> None:
        nonlocal idle
        if event == "poll":
            idle = 0 if info["claimed"] else idle + 1
            if idle >= 3:
                worker.stop()

    worker = settled.Worker(settled.AsyncClient(url), worker_id=worker_id, handler=handler,
                            concurrency=concurrency, batch_size=batch or None, lease_ms=60_000,
                            wait_ms=200, on_event=on_event)
    worker.run()
    print(json.dumps(worker.stats.snapshot()))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
