"""Per-key usage for GET /usage: jobs finished per status, seconds of video rendered and GPU-seconds, per UTC day.

Why at the transition: a job is counted in the MULTI of the one `transition` that gives it its terminal status
(core/jobs.py), so usage never disagrees with the records, and retries cannot add to it: a requeue or a re-claim after
a lost worker is no terminal status. The record's `usage_day` field, written in that MULTI and read under its WATCH,
marks a job as counted, so even a record that somehow reached a terminal status twice adds once.

What a job adds, under the status it ends in (`completed`, `failed` or `cancelled`; `expired` follows `completed`
and adds nothing):
- one job;
- video_seconds: the clip length (`seconds`) of a completed job;
- gpu_seconds: the render time its worker measured for a completed job (the sum of its `timings`, what the job
  shows as `inference_time_s`). A failed or cancelled render, and an attempt lost with its worker, have no measured
  time and add none.

Stored per key (its owner id; `-` with auth off, one anonymous bucket) and per UTC day of the transition, in the hash
`h3b:usage:{owner}:{YYYY-MM-DD}` (kept USAGE_KEEP_DAYS after its last count); a window sums its days.
"""
from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone
from typing import Any

import redis

from h3batch.core import defaults, keys

COUNTED = ("completed", "failed", "cancelled")
"""Terminal statuses a job is counted under."""
MARKER = "usage_day"
"""Record field set (to the day counted) when a job's usage is counted."""
_KEEP_S = defaults.USAGE_KEEP_DAYS * 86_400


def day_of(ts: float) -> str:
    """The UTC day of a Unix time, `YYYY-MM-DD` (a usage hash's name)."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d")


def render_seconds(timings: Any) -> float:
    """The worker's measured render time: the sum of a record's `timings` (finite numbers only), else 0."""
    if not isinstance(timings, dict):
        return 0.0
    return sum(float(v) for v in timings.values() if isinstance(v, (int, float)) and math.isfinite(v) and v > 0)


def count(pipe: redis.client.Pipeline, owner: str, status: str, *, seconds: float, timings: Any, now: float) -> None:
    """Queue one job's usage on `pipe` (inside core/jobs.py::transition's MULTI, which also sets MARKER)."""
    key = keys.usage(owner, day_of(now))
    pipe.hincrby(key, status, 1)
    if status == "completed":
        pipe.hincrbyfloat(key, "video_seconds", seconds)
        pipe.hincrbyfloat(key, "gpu_seconds", render_seconds(timings))
    pipe.expire(key, _KEEP_S)


def _figures(raw: dict[str, Any]) -> dict[str, Any]:
    jobs = {status: int(float(raw.get(status) or 0)) for status in COUNTED}
    return {"jobs": {**jobs, "total": sum(jobs.values())},
            "video_seconds": round(float(raw.get("video_seconds") or 0), 6),
            "gpu_seconds": round(float(raw.get("gpu_seconds") or 0), 6)}


def read(r: redis.Redis, owner: str, first: date, last: date) -> dict[str, Any]:
    """One key's usage over the UTC days `first`..`last` (inclusive): the totals, and `days`, one entry per day with
    any count, oldest first (one pipeline of HGETALLs; the caller bounds the window)."""
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    with r.pipeline(transaction=False) as pipe:
        for day in days:
            pipe.hgetall(keys.usage(owner, day.isoformat()))
        raws = pipe.execute()
    total: dict[str, float] = {}
    per_day = []
    for day, raw in zip(days, raws):
        if not raw:
            continue
        per_day.append({"date": day.isoformat(), **_figures(raw)})
        for name, value in raw.items():
            total[name] = total.get(name, 0.0) + float(value)
    return {**_figures(total), "days": per_day}
