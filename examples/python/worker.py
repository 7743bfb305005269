#!/usr/bin/env python3
"""A complete settled worker using only the Python standard library.

It claims due receipts with a long poll, settles each one on a simulated payment
rail, heartbeats the leases while the rail is slow, reports the outcomes as one
batch, backs off with jitter when the service is unavailable, and stops cleanly
on SIGTERM or Ctrl-C by releasing the leases of the work it has not started.

    SETTLED_URL=http://127.0.0.1:8080 python3 examples/python/worker.py --worker-id py-1

Every flag can also be set through the environment variable shown by --help.
Logs go to stderr; on exit one JSON line with the worker's counters goes to
stdout. Exit status: 0 after a clean stop, 2 for a configuration error that
retrying cannot fix (bad token, refused parameters).

The rules a worker must follow are in docs/worker-loop.md.
"""

import argparse
import hashlib
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request


# --------------------------------------------------------------------------
# Configuration


def env(name, default):
    value = os.environ.get(name)
    return default if value in (None, "") else value


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="settled worker (Python, standard library only)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default=env("SETTLED_URL", "http://127.0.0.1:8080"),
                   help="base URL of settled [env SETTLED_URL]")
    # Read after parsing, so that --help never prints the token.
    p.add_argument("--token", default=None,
                   help="Bearer token with the worker role [env SETTLED_TOKEN]")
    p.add_argument("--worker-id",
                   default=env("SETTLED_WORKER_ID", f"py-{socket.gethostname()}-{os.getpid()}"),
                   help="lease owner name, 1..=128 bytes [env SETTLED_WORKER_ID]")
    p.add_argument("--batch-size", type=int, default=int(env("SETTLED_BATCH_SIZE", 16)),
                   help="receipts claimed per poll, 1..=1024 [env SETTLED_BATCH_SIZE]")
    p.add_argument("--lease-ms", type=int, default=int(env("SETTLED_LEASE_MS", 30000)),
                   help="lease length asked for and extended to [env SETTLED_LEASE_MS]")
    p.add_argument("--wait-ms", type=int, default=int(env("SETTLED_WAIT_MS", 5000)),
                   help="long-poll wait when nothing is due, 0..=20000 [env SETTLED_WAIT_MS]")
    p.add_argument("--exit-when-idle", type=int, default=int(env("SETTLED_EXIT_WHEN_IDLE", 0)),
                   metavar="N",
                   help="exit after N consecutive empty polls; 0 = never [env SETTLED_EXIT_WHEN_IDLE]")
    p.add_argument("--timeout-rate", type=float, default=float(env("RAIL_TIMEOUT_RATE", 0.05)),
                   help="probability the rail times out (retryable, code rpc) [env RAIL_TIMEOUT_RATE]")
    p.add_argument("--decline-rate", type=float, default=float(env("RAIL_DECLINE_RATE", 0.02)),
                   help="probability the rail declines (permanent, code verification) [env RAIL_DECLINE_RATE]")
    p.add_argument("--slow-rate", type=float, default=float(env("RAIL_SLOW_RATE", 0.0)),
                   help="probability a settlement is slow and needs heartbeats [env RAIL_SLOW_RATE]")
    p.add_argument("--slow-ms", type=int, default=int(env("RAIL_SLOW_MS", 0)),
                   help="duration of a slow settlement; 0 = 1.5 x lease-ms [env RAIL_SLOW_MS]")
    p.add_argument("--latency-ms", type=int, default=int(env("RAIL_LATENCY_MS", 5)),
                   help="upper bound of a normal settlement's duration [env RAIL_LATENCY_MS]")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the simulated rail's randomness [env RAIL_SEED]")
    p.add_argument("--verbose", action="store_true", help="log every outcome")
    args = p.parse_args(argv)
    if args.token is None:
        args.token = env("SETTLED_TOKEN", None)
    if args.seed is None and env("RAIL_SEED", None) is not None:
        args.seed = int(env("RAIL_SEED", None))
    if args.slow_ms <= 0:
        args.slow_ms = args.lease_ms * 3 // 2
    if not 1 <= len(args.worker_id.encode()) <= 128:
        p.error("--worker-id must be 1..=128 bytes")
    if not 1 <= args.batch_size <= 1024:
        p.error("--batch-size must be 1..=1024")
    if not 1 <= args.lease_ms <= 86_400_000:
        p.error("--lease-ms must be 1..=86400000")
    if not 0 <= args.wait_ms <= 20_000:
        p.error("--wait-ms must be 0..=20000")
    for name in ("timeout_rate", "decline_rate", "slow_rate"):
        if not 0 <= getattr(args, name) <= 1:
            p.error(f"--{name.replace('_', '-')} must be a probability in 0..=1")
    args.url = args.url.rstrip("/")
    return args


def log(worker_id, message, **fields):
    extra = "".join(f" {k}={v}" for k, v in fields.items())
    print(f"[{worker_id}] {message}{extra}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# HTTP


class Unavailable(Exception):
    """503, a timeout or a connection failure: back off and try again."""


class Refused(Exception):
    """A 4xx/5xx answer that retrying will not change."""

    def __init__(self, status, problem):
        super().__init__(f"{status} {problem.get('code')}: {problem.get('detail')}")
        self.status = status
        self.problem = problem

    @property
    def code(self):
        return self.problem.get("code")


class Api:
    def __init__(self, base, token):
        self.base = base
        self.token = token

    def request(self, method, path, body=None, timeout=30.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                problem = json.loads(raw)
            except ValueError:
                problem = {"code": "http_" + str(e.code), "detail": raw[:200].decode("utf-8", "replace")}
            if e.code == 503:
                raise Unavailable(f"503 {problem.get('code')}") from None
            raise Refused(e.code, problem) from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            raise Unavailable(str(e)) from None


def receipt_path(receipt_id, suffix=""):
    # Receipt ids may hold '/', '?', '#', '%', spaces, any Unicode: encode them all.
    return "/v1/receipts/" + urllib.parse.quote(receipt_id, safe="") + suffix


class Backoff:
    """Exponential backoff with full jitter, reset on success."""

    def __init__(self, base=0.1, cap=5.0):
        self.base, self.cap, self.n = base, cap, 0

    def next_delay(self):
        delay = random.uniform(0, min(self.cap, self.base * (2 ** self.n)))
        self.n = min(self.n + 1, 16)
        return delay

    def reset(self):
        self.n = 0


# --------------------------------------------------------------------------
# The simulated payment rail


class SimulatedRail:
    """Stands in for a payment rail. Calls are idempotent, keyed by receipt id:
    asking again for a receipt the rail already accepted returns the same
    transcript instead of charging twice. A real rail must offer the same
    (an idempotency key), because a worker can lose its lease after the rail
    accepted and before the outcome was recorded."""

    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.accepted = {}

    def settle(self, receipt_id, observation):
        """Return the outcome object to report."""
        if receipt_id in self.accepted:
            return {"kind": "accepted", "transcript_id": self.accepted[receipt_id]}
        amount = (observation or {}).get("amount_cents")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            return {"kind": "permanent", "code": "invalid_observation",
                    "detail": "observation.amount_cents must be a non-negative integer"}
        if amount == 0:
            return {"kind": "skipped", "reason": "zero_charge"}
        a = self.args
        if self.rng.random() < a.slow_rate:
            time.sleep(a.slow_ms / 1000)
        elif a.latency_ms > 0:
            time.sleep(self.rng.uniform(0, a.latency_ms) / 1000)
        roll = self.rng.random()
        if roll < a.timeout_rate:
            return {"kind": "retryable", "code": "rpc", "detail": "rail timed out"}
        if roll < a.timeout_rate + a.decline_rate:
            return {"kind": "permanent", "code": "verification", "detail": "rail declined the charge"}
        transcript = "tx-" + hashlib.sha256(receipt_id.encode()).hexdigest()[:24]
        self.accepted[receipt_id] = transcript
        return {"kind": "accepted", "transcript_id": transcript}


# --------------------------------------------------------------------------
# The worker


class Held:
    """A claim this worker holds, with a conservative local deadline.

    The server's lease ends at lease_until_ms on *its* clock. We never compare
    clocks: the lease was granted no earlier than the moment we sent the
    request, so `sent + lease_ms` on our monotonic clock is never later than
    the real deadline."""

    def __init__(self, claim, sent, lease_ms):
        self.claim = claim
        self.granted = sent
        self.deadline = sent + lease_ms / 1000


class Worker:
    def __init__(self, args):
        self.args = args
        self.api = Api(args.url, args.token)
        self.rail = SimulatedRail(args)
        self.stop = threading.Event()  # set by SIGTERM/SIGINT: finish up, take no new work
        self.finished = threading.Event()  # set when run() returns
        # Serializes every request that uses a claim (heartbeat, report,
        # release): a heartbeat changes lease_until_ms, and the claim sent
        # back must be the latest one.
        self.lock = threading.Lock()
        self.stop_reason = None
        self.held = {}  # receipt_id -> Held, work claimed and not yet reported
        self.stats = dict(claimed=0, accepted=0, skipped=0, retryable=0, permanent=0,
                          lost=0, released=0, heartbeats=0, polls=0, empty_polls=0)
        # Commit only while comfortably inside the lease.
        self.margin = min(args.lease_ms * 0.2, 2000) / 1000

    def log(self, message, **fields):
        log(self.args.worker_id, message, **fields)

    # -- claiming ------------------------------------------------------

    def claim_batch(self):
        """Long-poll for work; [] when none came (or we are stopping)."""
        backoff = Backoff()
        body = {"worker_id": self.args.worker_id, "lease_ms": self.args.lease_ms,
                "limit": self.args.batch_size, "wait_ms": self.args.wait_ms}
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                _, out = self.api.request("POST", "/v1/claims", body,
                                          timeout=self.args.wait_ms / 1000 + 30)
            except Unavailable as e:
                delay = backoff.next_delay()
                self.log("claim failed; backing off", error=e, delay_s=f"{delay:.2f}")
                self.stop.wait(delay)
                continue
            self.stats["polls"] += 1
            claims = out["claims"]
            with self.lock:
                for c in claims:
                    self.held[c["receipt_id"]] = Held(c, sent, self.args.lease_ms)
            self.stats["claimed"] += len(claims)
            return claims
        return []

    # -- heartbeats ----------------------------------------------------

    def heartbeat_loop(self):
        lease_s = self.args.lease_ms / 1000
        tick = max(0.02, min(1.0, lease_s / 6))
        # Runs until the worker is finished (not merely stopping): work being
        # settled or reported during shutdown still needs its leases.
        while not self.finished.wait(tick):
            with self.lock:
                held = list(self.held)
            for receipt_id in held:
                with self.lock:
                    h = self.held.get(receipt_id)
                    # Renew once a third of the lease is used: two heartbeats
                    # may fail before the lease is at risk.
                    if h is None or time.monotonic() - h.granted < lease_s / 3:
                        continue
                    self.extend(receipt_id, h)

    def extend(self, receipt_id, h):
        """Extend one lease (caller holds self.lock)."""
        sent = time.monotonic()
        if sent >= h.deadline - self.margin / 2:
            self.drop(receipt_id, "lease about to expire before the heartbeat")
            return
        try:
            _, claim = self.api.request("POST", receipt_path(receipt_id, "/lease"),
                                        {"claim": h.claim, "extend_ms": self.args.lease_ms})
        except Unavailable as e:
            self.log("heartbeat failed; will try again", receipt_id=receipt_id, error=e)
            return
        except Refused as e:
            self.drop(receipt_id, f"heartbeat refused: {e}")
            return
        h.claim = claim  # same token and version, new lease_until_ms
        h.granted = sent
        h.deadline = sent + self.args.lease_ms / 1000
        self.stats["heartbeats"] += 1

    def drop(self, receipt_id, why):
        """Forget work whose lease is lost: someone else will (or did) do it."""
        self.held.pop(receipt_id, None)
        self.stats["lost"] += 1
        self.log("lease lost; dropping the work", receipt_id=receipt_id, why=why)

    # -- reporting -----------------------------------------------------

    def report(self, done):
        """Record [(receipt_id, outcome)] in one request, each judged on its own."""
        backoff = Backoff()
        pending = list(done)
        while pending:
            with self.lock:
                items, now = [], time.monotonic()
                for receipt_id, outcome in pending:
                    h = self.held.get(receipt_id)
                    if h is None:
                        continue  # lost meanwhile
                    if now >= h.deadline - self.margin:
                        # Never commit after the lease ends: it would be refused,
                        # and another worker may already hold the receipt.
                        self.drop(receipt_id, "lease ended before the outcome could be sent")
                        continue
                    items.append((receipt_id, {"claim": h.claim, "outcome": outcome}))
                if not items:
                    return
                try:
                    _, out = self.api.request("POST", "/v1/outcomes",
                                              {"outcomes": [body for _, body in items]})
                except Unavailable as e:
                    out = None
                    error = e
                except Refused as e:
                    # The whole batch was refused (malformed): nothing was recorded.
                    self.log("outcome batch refused", error=e)
                    for receipt_id, _ in items:
                        self.held.pop(receipt_id, None)
                    return
                if out is not None:
                    for (receipt_id, body), result in zip(items, out["results"]):
                        self.held.pop(receipt_id, None)
                        self.recorded(receipt_id, body["outcome"], result)
                    return
            delay = backoff.next_delay()
            self.log("reporting failed; backing off", error=error, delay_s=f"{delay:.2f}")
            time.sleep(delay)  # heartbeats keep the leases alive meanwhile
            pending = [(r, o) for r, o in pending if r in self.held]

    def recorded(self, receipt_id, outcome, result):
        error = result.get("error")
        if error is None:
            self.stats[outcome["kind"]] += 1
            if self.args.verbose:
                self.log("recorded", receipt_id=receipt_id, outcome=outcome["kind"],
                         route=json.dumps(result["route"]))
        elif error.get("status") == 409:
            # lease_conflict: our lease expired or was taken over, or a retry of
            # this very request already recorded it. Either way: drop the work.
            self.stats["lost"] += 1
            self.log("outcome refused: lease lost", receipt_id=receipt_id, code=error.get("code"))
        else:
            self.log("outcome refused", receipt_id=receipt_id, status=error.get("status"),
                     code=error.get("code"), detail=error.get("detail"))

    # -- releasing -----------------------------------------------------

    def release(self, receipt_ids):
        """Give back leases of work not started, so others can take it at once."""
        with self.lock:
            for receipt_id in receipt_ids:
                h = self.held.pop(receipt_id, None)
                if h is None:
                    continue
                try:
                    self.api.request("DELETE", receipt_path(receipt_id, "/lease"), {"claim": h.claim},
                                     timeout=5)
                    self.stats["released"] += 1
                except (Unavailable, Refused) as e:
                    # It will come back by itself when the lease expires.
                    self.log("release failed; the lease will expire", receipt_id=receipt_id, error=e)

    # -- the loop ------------------------------------------------------

    def run(self):
        started = time.monotonic()
        heart = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        heart.start()
        status = 0
        idle = 0
        try:
            while not self.stop.is_set():
                claims = self.claim_batch()
                if not claims:
                    if self.stop.is_set():
                        break
                    self.stats["empty_polls"] += 1
                    idle += 1
                    if 0 < self.args.exit_when_idle <= idle:
                        self.log("idle; exiting", empty_polls=idle)
                        break
                    continue
                idle = 0
                done = []
                for claim in claims:
                    if self.stop.is_set():
                        break  # the rest is not started: released below
                    receipt_id = claim["receipt_id"]
                    if receipt_id not in self.held:
                        continue  # lost while we worked on the batch
                    done.append((receipt_id, self.rail.settle(receipt_id, claim.get("observation"))))
                self.report(done)
                # Whatever is still held was not started: give it back at once.
                self.release([c["receipt_id"] for c in claims])
        except Refused as e:
            self.log("refused by the service; giving up", error=e)
            status = 2
        finally:
            self.stop.set()
            self.release(list(self.held))
            self.finished.set()
            self.stats["elapsed_s"] = round(time.monotonic() - started, 3)
            print(json.dumps({"worker_id": self.args.worker_id, **self.stats}), flush=True)
        if self.stop_reason:
            self.log("stopped", signal=self.stop_reason)
        return status


def main(argv=None):
    args = parse_args(argv)
    worker = Worker(args)

    def on_signal(signum, _frame):
        # No I/O in a signal handler: just ask the loop to finish.
        worker.stop_reason = signal.Signals(signum).name
        worker.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker.log("started", url=args.url, batch_size=args.batch_size, lease_ms=args.lease_ms)
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
