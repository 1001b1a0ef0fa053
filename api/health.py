"""Liveness and readiness: /healthz (this process answers) and /readyz (Redis answers and a GPU worker is alive)."""
from __future__ import annotations

import json
import time

import redis
from flask import Blueprint, jsonify

from h3batch.api.redis_client import get_redis
from h3batch.core import defaults, keys

bp = Blueprint("health", __name__)

LIVE_WORKER_STATES = ("READY", "BUSY")
STALLED_STATE = "STALLED"
"""A worker whose render hit its run deadline and has not stopped yet (worker/deadline.py): not counted, reported."""
DISK_FULL_STATE = "DISK_FULL"
"""A worker that takes no jobs for want of disk space (worker/disk.py): not counted, reported with its reason."""


@bp.get("/healthz")
def healthz():
    """200 while the process serves requests."""
    return jsonify({"status": "ok"})


def live_workers(r: redis.Redis, states: tuple[str, ...] = LIVE_WORKER_STATES) -> list[dict]:
    """Heartbeats younger than HEARTBEAT_TTL_S in one of `states` (keys expire on their own; the age check is a
    guard)."""
    now = time.time()
    workers = []
    for key in r.scan_iter(match=keys.WORKER_PATTERN, count=100):
        raw = r.get(key)
        if not raw:
            continue
        beat = json.loads(raw)
        if beat.get("state") in states and now - float(beat.get("ts", 0)) < defaults.HEARTBEAT_TTL_S:
            workers.append(beat)
    return workers


@bp.get("/readyz")
def readyz():
    """200 when Redis answers and >= 1 worker heartbeat is fresh; else 503 with per-check detail. Workers whose
    render hit its run deadline are listed under `checks.workers.stalled`, workers out of disk space under
    `checks.workers.not_ready` with their reason; neither is counted. `checks.workers.max_rows` is the largest request
    a counted worker serves (core/capacity.py)."""
    checks: dict[str, dict] = {}
    try:
        get_redis().ping()
        checks["redis"] = {"ok": True}
        beats = live_workers(get_redis(), LIVE_WORKER_STATES + (STALLED_STATE, DISK_FULL_STATE))
        workers = [w for w in beats if w.get("state") in LIVE_WORKER_STATES]
        checks["workers"] = {"ok": bool(workers), "count": len(workers),
                             "releases": sorted({w.get("release_id", "") for w in workers}),
                             "max_rows": max((w["max_rows"] for w in workers if w.get("max_rows")), default=None),
                             "stalled": sorted(w.get("name", "") for w in beats if w.get("state") == STALLED_STATE),
                             "not_ready": sorted(({"name": w.get("name", ""), "state": w["state"],
                                                   "reason": w.get("reason")}
                                                  for w in beats if w.get("state") == DISK_FULL_STATE),
                                                 key=lambda w: w["name"])}
        if not workers and checks["workers"]["not_ready"]:
            checks["workers"]["detail"] = "; ".join(f"{w['name']}: {w['reason']}"
                                                    for w in checks["workers"]["not_ready"])
    except redis.exceptions.RedisError as exc:
        checks["redis"] = {"ok": False, "detail": type(exc).__name__}
        checks["workers"] = {"ok": False, "count": 0, "detail": "unknown while Redis is unreachable"}
    ready = all(c["ok"] for c in checks.values())
    body = {"status": "ready" if ready else "not_ready", "checks": checks}
    if not ready:
        failing = ", ".join(name + (f" ({c['detail']})" if c.get("detail") else "")
                            for name, c in checks.items() if not c["ok"])
        body["error"] = {"code": "not_ready", "message": f"failing checks: {failing}", "retryable": True}
    response = jsonify(body)
    response.status_code = 200 if ready else 503
    return response
