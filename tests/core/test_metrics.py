"""core/metrics.py against real Redis: what one job's life adds to the metrics hashes, in the transitions' MULTI.

Worker loss is the case the stack test cannot show cheaply: a requeue counts `queued` again and a re-claim counts
`in_progress` again, but the queue wait is observed once, at the first claim; a refused transition counts nothing.
"""
from __future__ import annotations

import math

import pytest

from h3batch.core import defaults, jobs, keys, metrics
from h3batch.core.jobs import JobSpec, JobStatus

SPEC = JobSpec(prompt="rain", seconds=4.0, width=256, height=128, seed=1)


@pytest.fixture
def r(scratch_redis):
    return scratch_redis


def _histogram(r, name):
    return metrics.parse_histogram(r.hgetall(keys.metrics_histogram(name)))


def test_a_job_lost_once_then_completed(r):
    job = jobs.create_job(r, SPEC, now=100.0)
    jobs.transition(r, job["id"], JobStatus.IN_PROGRESS, fields={"attempt": 1}, now=102.5)
    jobs.transition(r, job["id"], JobStatus.QUEUED, now=110.0)  # the reaper: lease lapsed
    jobs.transition(r, job["id"], JobStatus.IN_PROGRESS, fields={"attempt": 2}, now=111.0)
    timings = {"text_encode": 0.02, "denoise": 3.0, "decode": 0.7, "mux": 0.3, "finalize": 0.001, "load": 9.0}
    jobs.transition(r, job["id"], JobStatus.COMPLETED, fields={"timings": timings}, now=115.0)
    assert jobs.transition(r, job["id"], JobStatus.CANCELLED) is None  # refused: nothing counted
    assert r.hgetall(keys.METRICS_JOBS) == {"queued": "2", "in_progress": "2", "completed": "1"}
    wait = _histogram(r, metrics.QUEUE_WAIT_HISTOGRAM)[()]
    assert wait["count"] == 1 and math.isclose(wait["sum"], 2.5) and wait["buckets"] == {2.5: 1}  # le is inclusive
    stages = _histogram(r, metrics.STAGE_HISTOGRAM)
    assert set(stages) == {(s,) for s in metrics.STAGES}  # `load` is not a stage label
    assert stages[("denoise",)]["buckets"] == {5.0: 1} and stages[("finalize",)]["buckets"] == {0.01: 1}
    cumulative = metrics.cumulative(stages[("denoise",)]["buckets"], defaults.STAGE_BUCKETS_S)
    assert cumulative[-1] == (math.inf, 1) and dict(cumulative)[2.5] == 0 and dict(cumulative)[5.0] == 1


def test_failures_count_by_error_code(r):
    for code in ("render_error", "render_error", "worker_lost"):
        job = jobs.create_job(r, SPEC)
        jobs.transition(r, job["id"], JobStatus.IN_PROGRESS, fields={"attempt": 1})
        jobs.transition(r, job["id"], JobStatus.FAILED, fields={"error": {"code": code, "message": "x"}})
    queued = jobs.create_job(r, SPEC)
    jobs.transition(r, queued["id"], JobStatus.FAILED, fields={"error": {"code": "enqueue_failed", "message": "x"}})
    assert r.hgetall(keys.METRICS_ERRORS) == {"render_error": "2", "worker_lost": "1", "enqueue_failed": "1"}
    assert r.hget(keys.METRICS_JOBS, "failed") == "4"
    assert _histogram(r, metrics.QUEUE_WAIT_HISTOGRAM)[()]["count"] == 3  # the one never claimed has no queue wait


def test_bucket_bounds_are_inclusive_and_overflow_goes_to_inf():
    assert metrics.bucket_for(0.5, (0.25, 0.5, 1.0)) == "0.5"
    assert metrics.bucket_for(0.51, (0.25, 0.5, 1.0)) == "1"
    assert metrics.bucket_for(7200.0, defaults.STAGE_BUCKETS_S) == "+Inf"
    parsed = metrics.parse_histogram({"a|b|0.5": "2", "a|b|+Inf": "1", "a|b|sum": "9.5", "a|b|count": "3"})
    assert parsed == {("a", "b"): {"buckets": {0.5: 2, math.inf: 1}, "sum": 9.5, "count": 3}}
    assert metrics.cumulative({0.5: 2, math.inf: 1}, (0.25, 0.5)) == [(0.25, 0), (0.5, 2), (math.inf, 3)]
