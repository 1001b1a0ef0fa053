"""Sweep records in Redis (stdlib + redis only, shared by the API and the sweep worker).

Keys, templated here only (`redis-cli` then shows a sweep's life):
  h3batch:sweep:<id>          JSON record {id, status, origin, owner, created_at, started_at, finished_at,
                              request, point_ids, summary, error}; `owner` is the API key id that created it
                              (None for scheduled sweeps, which every key may read)
  h3batch:sweep:<id>:points   hash point id -> JSON point record (§15.1.5)
  h3batch:sweeps              sorted set of sweep ids scored by creation time
  h3batch:beat:lock           the single-beat lock (token of the holder, with expiry)
Records have no expiry: they are the durable index of results; the JSON files in the results directory mirror them.
"""
from __future__ import annotations

import json
import time
from enum import Enum

import redis

SWEEP_KEY = "h3batch:sweep:{sweep_id}"
POINTS_KEY = "h3batch:sweep:{sweep_id}:points"
INDEX_KEY = "h3batch:sweeps"
BEAT_LOCK_KEY = "h3batch:beat:lock"


class SweepStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class PointStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ERROR = "error"


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def create_sweep(r: redis.Redis, sweep_id: str, request: dict, point_ids: list[str], origin: str,
                 owner: str | None = None) -> dict:
    """Write a queued sweep and its pending points in one transaction."""
    record = {"id": sweep_id, "status": SweepStatus.QUEUED.value, "origin": origin, "owner": owner,
              "created_at": utc_now(),
              "started_at": None, "finished_at": None, "request": request, "point_ids": point_ids,
              "summary": None, "error": None}
    pipe = r.pipeline(transaction=True)
    pipe.set(SWEEP_KEY.format(sweep_id=sweep_id), json.dumps(record))
    if point_ids:
        pipe.hset(POINTS_KEY.format(sweep_id=sweep_id),
                  mapping={pid: json.dumps({"id": pid, "status": PointStatus.PENDING.value}) for pid in point_ids})
    pipe.zadd(INDEX_KEY, {sweep_id: time.time()})
    pipe.execute()
    return record


def get_record(r: redis.Redis, sweep_id: str) -> dict | None:
    raw = _text(r.get(SWEEP_KEY.format(sweep_id=sweep_id)))
    return json.loads(raw) if raw else None


def update_record(r: redis.Redis, sweep_id: str, **fields) -> dict:
    """Set top-level fields of a sweep record (optimistic transaction against concurrent writers)."""
    key = SWEEP_KEY.format(sweep_id=sweep_id)
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(key)
                raw = _text(pipe.get(key))
                if raw is None:
                    raise KeyError(f"sweep {sweep_id} has no record")
                record = {**json.loads(raw), **fields}
                pipe.multi()
                pipe.set(key, json.dumps(record))
                pipe.execute()
                return record
            except redis.WatchError:
                continue


def put_point(r: redis.Redis, sweep_id: str, point: dict) -> None:
    r.hset(POINTS_KEY.format(sweep_id=sweep_id), point["id"], json.dumps(point))


def get_points(r: redis.Redis, sweep_id: str) -> dict[str, dict]:
    raw = r.hgetall(POINTS_KEY.format(sweep_id=sweep_id))
    return {_text(k): json.loads(_text(v)) for k, v in raw.items()}


def get_sweep(r: redis.Redis, sweep_id: str) -> dict | None:
    """The record with its points in grid order."""
    record = get_record(r, sweep_id)
    if record is None:
        return None
    stored = get_points(r, sweep_id)
    record["points"] = [stored.get(pid, {"id": pid, "status": PointStatus.PENDING.value})
                        for pid in record["point_ids"]]
    return record


def visible_to(record: dict, owner: str | None) -> bool:
    """Whether `owner` (an API key id; None = no filter) may see a sweep: its own, or a scheduled one."""
    return owner is None or record.get("owner") is None or record.get("owner") == owner


def list_sweeps(r: redis.Redis, limit: int = 50, owner: str | None = None) -> list[dict]:
    """Newest first, records without their points; with `owner`, only the sweeps `visible_to` it."""
    found: list[dict] = []
    start = 0
    while len(found) < limit:
        ids = [_text(i) for i in r.zrevrange(INDEX_KEY, start, start + 4 * limit - 1)]
        if not ids:
            break
        start += len(ids)
        for record in (get_record(r, i) for i in ids):
            if record is not None and visible_to(record, owner) and len(found) < limit:
                found.append(record)
    return found


def last_finished(r: redis.Redis, scan: int = 200) -> dict | None:
    """The newest sweep (by creation) among the `scan` newest that has finished, `done` or `failed`, without its
    points; None when there is none (the metrics' "last sweep")."""
    ids = [_text(i) for i in r.zrevrange(INDEX_KEY, 0, scan - 1)]
    for record in (get_record(r, i) for i in ids):
        if record is not None and record.get("status") in (SweepStatus.DONE.value, SweepStatus.FAILED.value):
            return record
    return None
