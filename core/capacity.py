"""Fleet capacity in Redis: what each worker says it can serve, and the limit the API refuses requests by.

Failure handled: a request too large for every node. Without a check the API accepts it, a worker claims it and the
render dies deep in the pipeline (CUDA out of memory) after the job waited its turn. Each worker's heartbeat writes
the largest request it serves (`max_rows`, in the rows of `RequestGeometry.capacity_rows`) into one hash,
`h3b:capacity` (worker name → {max_rows, ts}), and POST /jobs and /v1/videos refuse a larger request with 422
`exceeds_worker_capacity` before anything is written.

One hash rather than the heartbeat keys themselves: the API reads it on every create, and finding heartbeat keys
takes a SCAN over the whole keyspace (/readyz does that; it is rarely called). Entries outlive their worker on
purpose, so the last known capacity survives a restart of the whole fleet (rule in `fleet_limit`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from h3batch.core import defaults, keys


@dataclass(frozen=True)
class FleetLimit:
    """The largest request the fleet serves, and where the figure comes from."""

    max_rows: int
    live: bool  # True: from a worker whose heartbeat is fresh; False: last known (no worker live now)
    age_s: float  # seconds since the heartbeat the figure comes from

    def describe(self) -> str:
        """How an error message names the limit."""
        if self.live:
            return f"the largest request a live worker serves is {self.max_rows} rows"
        return (f"no worker is live; the largest request a worker served {self.age_s:.0f} s ago is "
                f"{self.max_rows} rows")


def record(r: redis.Redis | redis.client.Pipeline, worker_name: str, max_rows: int, now: float | None = None) -> None:
    """Write one worker's capacity (every heartbeat). The hash expires CAPACITY_MEMORY_S after the last write."""
    entry = json.dumps({"max_rows": int(max_rows), "ts": time.time() if now is None else now})
    r.hset(keys.CAPACITY, worker_name, entry)
    r.expire(keys.CAPACITY, defaults.CAPACITY_MEMORY_S)


def fleet_limit(r: redis.Redis, now: float | None = None) -> FleetLimit | None:
    """The limit POST /jobs refuses by, None when nothing limits (accept).

    Rule: the largest `max_rows` among live workers (entry younger than HEARTBEAT_TTL_S, as /readyz counts them).
    When no worker is live, the largest one advertised within CAPACITY_MEMORY_S (a fleet restarting keeps refusing
    what it could not serve; a job accepted now would wait for a worker that cannot run it either). With no entry
    that recent, None: the API accepts, as it accepts any job while no worker runs, and the worker that claims it
    refuses it by its own limit (worker/attempt.py). Entries older than CAPACITY_MEMORY_S are removed here.
    """
    now = time.time() if now is None else now
    live: list[tuple[int, float]] = []
    remembered: list[tuple[int, float]] = []
    stale: list[str] = []
    for name, raw in r.hgetall(keys.CAPACITY).items():
        try:
            entry = json.loads(raw)
            rows, age = int(entry["max_rows"]), now - float(entry["ts"])
        except (ValueError, KeyError, TypeError):
            stale.append(name)  # not written by `record`: drop it rather than fail every create
            continue
        if age < defaults.HEARTBEAT_TTL_S:
            live.append((rows, age))
        elif age < defaults.CAPACITY_MEMORY_S:
            remembered.append((rows, age))
        else:
            stale.append(name)
    if stale:
        r.hdel(keys.CAPACITY, *stale)
    for entries, is_live in ((live, True), (remembered, False)):
        if entries:
            rows, age = max(entries, key=lambda e: (e[0], -e[1]))
            return FleetLimit(max_rows=rows, live=is_live, age_s=max(0.0, age))
    return None
