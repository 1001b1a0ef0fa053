"""Fleet capacity in Redis: what each worker says it can serve (its capability), and what the API refuses requests by.

Failure handled: a request too large for every node. Without a check the API accepts it, a worker claims it and the
render dies deep in the pipeline (CUDA out of memory) after the job waited its turn. Each worker's heartbeat writes
the largest request it serves (`max_rows`, in the rows of `RequestGeometry.capacity_rows`) into one hash,
`h3b:capacity` (worker name → {max_rows, precision, release_kind, tasks, canvas, ts}: core/routing.Capability), and
POST /jobs, /v1/videos and /batches refuse a request no worker serves with 422 `exceeds_worker_capacity` (too large)
or `no_capable_worker` (task or precision not served) before anything is written (core/routing.refusal).

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
from h3batch.core.routing import Capability, Need, Refusal, refusal


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


def record(r: redis.Redis | redis.client.Pipeline, worker_name: str, capability: Capability | int,
           now: float | None = None) -> None:
    """Write one worker's capability (every heartbeat); an int is a `max_rows` with the defaults of everything else.
    The hash expires CAPACITY_MEMORY_S after the last write."""
    cap = capability if isinstance(capability, Capability) else Capability(max_rows=int(capability))
    entry = json.dumps({**cap.as_json(), "ts": time.time() if now is None else now})
    r.hset(keys.CAPACITY, worker_name, entry)
    r.expire(keys.CAPACITY, defaults.CAPACITY_MEMORY_S)


@dataclass(frozen=True)
class Fleet:
    """The capabilities the API checks a request against: the live workers', else the last known ones."""

    capabilities: tuple[Capability, ...]
    live: bool  # True: workers whose heartbeat is fresh; False: last known (no worker live now)
    age_s: float  # seconds since the youngest heartbeat among them

    def refusal(self, need: Need) -> Refusal | None:
        """Why no worker here serves `need` (core/routing.refusal), else None."""
        return refusal(need, self.capabilities, live=self.live, age_s=self.age_s)


def fleet(r: redis.Redis, now: float | None = None) -> Fleet | None:
    """What the fleet serves, None when nothing is known (accept).

    Rule: the live workers' capabilities (entry younger than HEARTBEAT_TTL_S, as /readyz counts them). When no
    worker is live, those advertised within CAPACITY_MEMORY_S (a fleet restarting keeps refusing what it could not
    serve; a job accepted now would wait for a worker that cannot run it either). With no entry that recent, None:
    the API accepts the release's own task (t2va) and leaves the job queued until a worker that consumes its queue
    starts. Entries older than CAPACITY_MEMORY_S are removed here.
    """
    now = time.time() if now is None else now
    live: list[tuple[Capability, float]] = []
    remembered: list[tuple[Capability, float]] = []
    stale: list[str] = []
    for name, raw in r.hgetall(keys.CAPACITY).items():
        try:
            entry = json.loads(raw)
            cap, age = Capability.from_json(entry), now - float(entry["ts"])
        except (ValueError, KeyError, TypeError, AttributeError):
            stale.append(name)  # not written by `record`: drop it rather than fail every create
            continue
        if age < defaults.HEARTBEAT_TTL_S:
            live.append((cap, age))
        elif age < defaults.CAPACITY_MEMORY_S:
            remembered.append((cap, age))
        else:
            stale.append(name)
    if stale:
        r.hdel(keys.CAPACITY, *stale)
    for entries, is_live in ((live, True), (remembered, False)):
        if entries:
            return Fleet(capabilities=tuple(c for c, _ in entries), live=is_live,
                         age_s=max(0.0, min(age for _, age in entries)))
    return None


def fleet_limit(r: redis.Redis, now: float | None = None) -> FleetLimit | None:
    """The largest `max_rows` of `fleet` (live workers, else the last known), None when nothing is known."""
    found = fleet(r, now)
    if found is None:
        return None
    return FleetLimit(max_rows=max(c.max_rows for c in found.capabilities), live=found.live, age_s=found.age_s)
