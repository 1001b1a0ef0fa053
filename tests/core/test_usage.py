"""core/usage.py through core/jobs.py's transitions on real Redis: a job counts once, under its terminal status, in the
UTC day it finished, for its own key only; retries, re-claims and a second terminal transition add nothing."""
from __future__ import annotations

from datetime import date, datetime

import pytest

from h3batch.core import jobs, keys, usage
from h3batch.core.jobs import JobSpec, JobStatus

TTL = 3600
TIMINGS = {"text_encode": 0.25, "denoise": 1.5, "decode": 0.5, "mux": 0.125, "finalize": 0.125}
"""A completed job's measured stage times: 2.5 s of render."""


@pytest.fixture
def r(scratch_redis):
    return scratch_redis


def _spec(owner: str, seconds: float = 4.0) -> JobSpec:
    return JobSpec(prompt="rain", seconds=seconds, width=256, height=128, seed=1, owner=owner)


def _at(day: str, hour: int = 12) -> float:
    return datetime.fromisoformat(f"{day}T{hour:02d}:00:00+00:00").timestamp()


def _complete(r, job_id: str, attempt: int, now: float | None = None):
    return jobs.transition(r, job_id, JobStatus.COMPLETED, expect={JobStatus.IN_PROGRESS}, expect_attempt=attempt,
                           fields={"timings": TIMINGS}, record_ttl_s=TTL, now=now)


def _all_time(r, owner: str) -> dict:
    return usage.read(r, owner, date(2020, 1, 1), date(2030, 12, 31))


def test_a_job_retried_after_a_lost_worker_and_a_requeue_counts_once(r):
    """Claimed, its worker lost (lease lapsed: re-claimed as attempt 2), requeued (attempt 3 claims it), then
    completed: one completed job, its 4 s of video and only the final attempt's 2.5 s of measured render time."""
    job = jobs.create_job(r, _spec("key-a"))
    jobs.claim_job(r, job["id"], "w1", release_id="tiny", record_ttl_s=TTL)
    r.delete(keys.lease(job["id"]))  # the worker died: its lease lapsed
    jobs.claim_job(r, job["id"], "w2", release_id="tiny", record_ttl_s=TTL)
    assert jobs.transition(r, job["id"], JobStatus.QUEUED, expect={JobStatus.IN_PROGRESS}) is not None  # reaper
    r.delete(keys.lease(job["id"]))
    claimed, _ = jobs.claim_job(r, job["id"], "w3", release_id="tiny", record_ttl_s=TTL)
    assert claimed["attempt"] == 3 and _all_time(r, "key-a")["jobs"]["total"] == 0  # nothing terminal yet
    done = _complete(r, job["id"], 3)
    assert done["usage_day"] == usage.day_of(done["finished_at"])
    figures = _all_time(r, "key-a")
    assert figures["jobs"] == {"completed": 1, "failed": 0, "cancelled": 0, "total": 1}
    assert figures["video_seconds"] == 4.0 and figures["gpu_seconds"] == 2.5


def test_a_second_terminal_transition_or_expiry_adds_nothing(r):
    """The record's usage marker keeps a job counted once: a repeated completion is refused, expiry adds nothing,
    and a record forced back to in_progress and failed again is not counted a second time."""
    job = jobs.create_job(r, _spec("key-a"))
    jobs.claim_job(r, job["id"], "w1", release_id="tiny", record_ttl_s=TTL)
    _complete(r, job["id"], 1)
    assert _complete(r, job["id"], 1) is None
    assert jobs.transition(r, job["id"], JobStatus.EXPIRED, expect={JobStatus.COMPLETED}) is not None
    r.hset(keys.job(job["id"]), "status", JobStatus.IN_PROGRESS.value)  # a record rewritten behind the lifecycle
    assert jobs.transition(r, job["id"], JobStatus.FAILED, fields={"error": {"code": "x"}}) is not None
    assert _all_time(r, "key-a")["jobs"] == {"completed": 1, "failed": 0, "cancelled": 0, "total": 1}


def test_each_job_counts_under_its_terminal_status(r):
    """A failed and a cancelled job count one each and add no seconds (no measured render, no video)."""
    failed, cancelled = jobs.create_job(r, _spec("key-a")), jobs.create_job(r, _spec("key-a"))
    jobs.claim_job(r, failed["id"], "w1", release_id="tiny", record_ttl_s=TTL)
    jobs.transition(r, failed["id"], JobStatus.FAILED, fields={"error": {"code": "render_error"}}, record_ttl_s=TTL)
    jobs.request_cancel(r, cancelled["id"], record_ttl_s=TTL)
    figures = _all_time(r, "key-a")
    assert figures["jobs"] == {"completed": 0, "failed": 1, "cancelled": 1, "total": 2}
    assert figures["video_seconds"] == 0 and figures["gpu_seconds"] == 0


def test_keys_are_counted_apart_and_auth_off_is_one_bucket(r):
    """Each owner has its own buckets; jobs with no owner (no API keys) share the anonymous one (`-`)."""
    for owner, seconds in (("key-a", 4.0), ("key-b", 6.0), ("key-b", 6.0), ("", 5.0)):
        job = jobs.create_job(r, _spec(owner, seconds))
        jobs.claim_job(r, job["id"], "w1", release_id="tiny", record_ttl_s=TTL)
        _complete(r, job["id"], 1)
    a, b, anonymous = _all_time(r, "key-a"), _all_time(r, "key-b"), _all_time(r, "")
    assert (a["jobs"]["completed"], a["video_seconds"]) == (1, 4.0)
    assert (b["jobs"]["completed"], b["video_seconds"], b["gpu_seconds"]) == (2, 12.0, 5.0)
    assert (anonymous["jobs"]["completed"], anonymous["video_seconds"]) == (1, 5.0)
    assert r.exists(f"h3b:usage:-:{anonymous['days'][0]['date']}")


def test_usage_lands_in_the_utc_day_it_finished_and_a_window_sums_days(r):
    """Jobs finished on 1, 2 and 4 December (UTC, one just before midnight) land in those days' hashes; a window
    sums only its days, and lists only days with usage, oldest first."""
    for day, hour in (("2026-12-01", 23), ("2026-12-02", 0), ("2026-12-02", 10), ("2026-12-04", 8)):
        job = jobs.create_job(r, _spec("key-a"))
        jobs.claim_job(r, job["id"], "w1", release_id="tiny", record_ttl_s=TTL)
        _complete(r, job["id"], 1, now=_at(day, hour) + 59 * 60)
    assert r.hget(keys.usage("key-a", "2026-12-01"), "completed") == "1"
    assert 0 < r.ttl(keys.usage("key-a", "2026-12-01")) <= usage._KEEP_S
    whole = usage.read(r, "key-a", date(2026, 12, 1), date(2026, 12, 4))
    assert [(d["date"], d["jobs"]["completed"]) for d in whole["days"]] == [
        ("2026-12-01", 1), ("2026-12-02", 2), ("2026-12-04", 1)]
    assert whole["jobs"]["total"] == 4 and whole["video_seconds"] == 16.0 and whole["gpu_seconds"] == 10.0
    middle = usage.read(r, "key-a", date(2026, 12, 2), date(2026, 12, 3))
    assert middle["jobs"]["completed"] == 2 and [d["date"] for d in middle["days"]] == ["2026-12-02"]
    assert usage.read(r, "key-a", date(2026, 12, 5), date(2026, 12, 31))["jobs"]["total"] == 0
    assert usage.day_of(_at("2026-12-01", 23) + 59 * 60) == "2026-12-01"
