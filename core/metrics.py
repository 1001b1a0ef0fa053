"""Service metrics kept in Redis: the counters and histogram buckets every process adds to and /metrics reads.

Why Redis: the figures come from many processes on many hosts (each GPU worker finishes its own jobs, the API runs
several gunicorn processes), and Prometheus scrapes one endpoint. Each writer adds to hashes under `h3b:metrics:*`
(core/keys.py) with HINCRBY / HINCRBYFLOAT, inside the MULTI that makes the change where there is one, so a count can
never disagree with the records; api/metrics.py turns the hashes into Prometheus metric families at scrape time.
The hashes never expire: counters only grow, as Prometheus expects (a Redis flush reads as a counter reset).

A histogram hash stores, per label set, how many observations fell in each bucket (not cumulative: one HINCRBY per
observation), their sum and their count. Fields: `<labels>|<bound>`, `<labels>|sum`, `<labels>|count`, where
`<labels>` is the label values joined by `|` and `<bound>` the bucket's upper bound (`%g`, or `+Inf`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import redis

from h3batch.core import defaults, keys

SEP = "|"
STAGES = ("text_encode", "denoise", "decode", "mux", "finalize")
"""Stages whose durations (the record's `timings`) are observed when a job completes."""
STAGE_HISTOGRAM = "stage"
QUEUE_WAIT_HISTOGRAM = "queue_wait"
HTTP_HISTOGRAM = "http"


def bound_text(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


def bucket_for(seconds: float, bounds: Iterable[float]) -> str:
    """The field suffix of the smallest bucket holding `seconds` (Prometheus buckets are `le`, inclusive)."""
    for bound in bounds:
        if seconds <= bound:
            return bound_text(bound)
    return "+Inf"


def observe(pipe: redis.client.Pipeline, histogram: str, labels: tuple[str, ...], seconds: float,
            bounds: tuple[float, ...], times: int = 1) -> None:
    """Queue one observation (or `times` equal ones) of `seconds` into a histogram hash on `pipe`."""
    key, head = keys.metrics_histogram(histogram), SEP.join(labels)
    pipe.hincrby(key, f"{head}{SEP}{bucket_for(seconds, bounds)}", times)
    pipe.hincrbyfloat(key, f"{head}{SEP}sum", seconds * times)
    pipe.hincrby(key, f"{head}{SEP}count", times)


def _error_code(update: dict[str, Any]) -> str:
    error = update.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return str(code)[:64] if code else "unknown"


def count_transition(pipe: redis.client.Pipeline, old: str, to: str, update: dict[str, Any], *, attempt: int,
                     created_at: float | None, now: float) -> None:
    """Queue the counts of one status change on `pipe` (called by core/jobs.py::transition inside its MULTI):
    the status counter, the error code of a failure, the queue wait of a job's first claim, and the stage
    durations of a completion (the `timings` written with it)."""
    pipe.hincrby(keys.METRICS_JOBS, to, 1)
    if to == "failed":
        pipe.hincrby(keys.METRICS_ERRORS, _error_code(update), 1)
    if to == "in_progress" and old == "queued" and attempt == 0 and created_at is not None:
        observe(pipe, QUEUE_WAIT_HISTOGRAM, (), max(0.0, now - created_at), defaults.STAGE_BUCKETS_S)
    if to == "completed":
        timings = update.get("timings")
        for stage in STAGES:
            value = timings.get(stage) if isinstance(timings, dict) else None
            if isinstance(value, (int, float)) and math.isfinite(value):
                observe(pipe, STAGE_HISTOGRAM, (stage,), max(0.0, float(value)), defaults.STAGE_BUCKETS_S)


# A batch's counts (`created` in h3b:metrics:batches, its items as jobs entering `queued`) are written by the script
# that admits it, and its final status by the one that stamps it finished (core/batches.py: _ADMIT, _FINISH).


def parse_histogram(raw: dict[str, str]) -> dict[tuple[str, ...], dict[str, Any]]:
    """A histogram hash as {labels: {"buckets": {bound: count in that bucket}, "sum": float, "count": int}}."""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for name, value in raw.items():
        head, _, tail = name.rpartition(SEP)
        labels = tuple(head.split(SEP)) if head else ()
        series = out.setdefault(labels, {"buckets": {}, "sum": 0.0, "count": 0})
        if tail == "sum":
            series["sum"] = float(value)
        elif tail == "count":
            series["count"] = int(value)
        else:
            try:
                series["buckets"][float(tail)] = series["buckets"].get(float(tail), 0) + int(value)
            except ValueError:
                continue  # not a field this module writes
    return out


def cumulative(buckets: dict[float, int], bounds: tuple[float, ...]) -> list[tuple[float, int]]:
    """Prometheus' cumulative `le` buckets over `bounds` plus +Inf from per-bucket counts."""
    out, running = [], 0
    pending = sorted(buckets.items())
    for bound in (*bounds, math.inf):
        while pending and pending[0][0] <= bound:
            running += pending.pop(0)[1]
        out.append((bound, running))
    return out
