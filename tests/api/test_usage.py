"""GET /usage: on the live stack (gunicorn API, real worker), each key sees exactly the jobs it finished, once each,
with their video and render seconds, and never another key's; in process on a real Redis, a window sums the UTC days
it covers, auth off is one anonymous bucket, and bad windows are 400 with the error body."""
from __future__ import annotations

import time
from datetime import date, datetime, timedelta, timezone

import pytest
import requests

from h3batch.api import create_app
from h3batch.core import jobs
from h3batch.core.jobs import JobSpec, JobStatus
from tests.api.conftest import KEY_A, KEY_B, auth, key_id, wait_job
from tests.conftest import SCRATCH_DB

CANVAS = {"seconds": 4, "width": 256, "height": 128}
TIMINGS = {"denoise": 1.5, "decode": 0.5}


def _usage(base: str, key: str, **params) -> dict:
    reply = requests.get(f"{base}/usage", params=params, headers=auth(key), timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _today() -> set[str]:
    """Today's UTC date (and tomorrow's, for a test that crosses midnight)."""
    now = datetime.now(timezone.utc)
    return {now.date().isoformat(), (now + timedelta(minutes=10)).date().isoformat()}


def _idle(base: str, key: str) -> None:
    """Until none of the key's jobs is queued or running (an earlier test's job finishing mid-test would count)."""
    deadline = time.monotonic() + 600  # hang guard only
    while any(requests.get(f"{base}/jobs", params={"status": s, "limit": 1}, headers=auth(key), timeout=60)
              .json()["data"] for s in ("queued", "in_progress")):
        assert time.monotonic() < deadline, "jobs of an earlier test never finished"
        time.sleep(0.2)


def test_each_key_sees_only_its_own_finished_jobs(stack):
    """Key A completes a job and key B has one fail: A's usage grows by one completed job with its 4 s of video and
    its measured render time (inference_time_s), B's by one failed job and no seconds; neither sees the other's."""
    for key in (KEY_A, KEY_B):
        _idle(stack.base, key)
    before = {key: _usage(stack.base, key) for key in (KEY_A, KEY_B)}
    done = requests.post(f"{stack.base}/jobs", json={"prompt": "a bell", **CANVAS}, headers=auth(KEY_A), timeout=60)
    failed = requests.post(f"{stack.base}/jobs", json={"prompt": "a bell", "release": "no-such-release", **CANVAS},
                           headers=auth(KEY_B), timeout=60)
    done = wait_job(stack.base, done.json()["id"], key=KEY_A)
    failed = wait_job(stack.base, failed.json()["id"], key=KEY_B)
    assert (done["status"], failed["status"]) == ("completed", "failed")
    after = {key: _usage(stack.base, key) for key in (KEY_A, KEY_B)}

    a0, a1, b0, b1 = before[KEY_A], after[KEY_A], before[KEY_B], after[KEY_B]
    assert {k: a1["jobs"][k] - a0["jobs"][k] for k in a1["jobs"]} == {
        "completed": 1, "failed": 0, "cancelled": 0, "total": 1}
    assert a1["video_seconds"] - a0["video_seconds"] == pytest.approx(4.0)
    assert a1["gpu_seconds"] - a0["gpu_seconds"] == pytest.approx(done["inference_time_s"], abs=1e-5)
    assert done["inference_time_s"] > 0
    assert {k: b1["jobs"][k] - b0["jobs"][k] for k in b1["jobs"]} == {
        "completed": 0, "failed": 1, "cancelled": 0, "total": 1}
    assert (b1["video_seconds"], b1["gpu_seconds"]) == (b0["video_seconds"], b0["gpu_seconds"])
    assert a1["object"] == "usage" and a1["to"] in _today()


@pytest.mark.parametrize("params, message", [
    ({"from": "yesterday"}, "from: expected an ISO-8601 date or time"),
    ({"to": "2026-13-01"}, "to: expected an ISO-8601 date or time"),
    ({"to": "1e400"}, "to: expected"),
    ({"from": "99999999999999999999"}, "from: expected"),
    ({"from": "2026-12-05", "to": "2026-12-04"}, "from: expected a time at or before to (2026-12-04)"),
    ({"from": "2024-01-01", "to": "2026-01-01"}, "from: expected a window of at most 366 days"),
])
def test_a_bad_window_is_400_with_the_error_body(compat_api, params, message):
    """An unreadable time, `from` after `to`, or a window over 366 days: 400 invalid_request naming the parameter."""
    reply = requests.get(f"{compat_api.base}/usage", params=params, headers=auth(), timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_request" and error["message"].startswith(message), error
    assert error["retryable"] is False and error["request_id"]


@pytest.fixture
def scratch_app(scratch_redis):
    """The API in process on the scratch database, with key A only (key B's jobs are written straight to Redis)."""
    url = f"redis://127.0.0.1:{scratch_redis.connection_pool.connection_kwargs['port']}/{SCRATCH_DB}"
    return lambda keys: create_app({"REDIS_URL": url, "API_KEYS": keys}).test_client()


def _finish(r, owner: str, at: str, to: JobStatus = JobStatus.COMPLETED) -> None:
    """A job of `owner` claimed and finished at the ISO time `at` (what a worker's transitions write)."""
    job = jobs.create_job(r, JobSpec(prompt="rain", seconds=5.0, width=256, height=128, seed=1, owner=owner))
    jobs.transition(r, job["id"], JobStatus.IN_PROGRESS, expect={JobStatus.QUEUED})
    fields = {"timings": TIMINGS} if to is JobStatus.COMPLETED else {"error": {"code": "render_error"}}
    jobs.transition(r, job["id"], to, fields=fields, now=datetime.fromisoformat(at).timestamp())


def test_a_window_sums_the_utc_days_it_covers(scratch_redis, scratch_app):
    """Jobs finished on 30 Nov, 1 Dec (twice: at 00:30 and at 23:30 UTC, the latter 00:30 on 2 Dec in UTC+1) and
    3 Dec: `from`/`to` as dates, ISO times with offsets and Unix seconds select whole UTC days; only days with usage
    are listed; another key's jobs on the same days are not shown."""
    for at in ("2026-11-30T12:00:00+00:00", "2026-12-01T00:30:00+00:00", "2026-12-01T23:30:00+00:00",
               "2026-12-03T08:00:00+00:00"):
        _finish(scratch_redis, key_id(KEY_A), at)
    _finish(scratch_redis, key_id(KEY_A), "2026-12-03T09:00:00+00:00", JobStatus.FAILED)
    _finish(scratch_redis, key_id(KEY_B), "2026-12-01T10:00:00+00:00")
    client = scratch_app([KEY_A])

    def usage(**params):
        reply = client.get("/usage", query_string=params, headers=auth(KEY_A))
        assert reply.status_code == 200, reply.json
        return reply.json

    december = usage(**{"from": "2026-12-01", "to": "2026-12-31"})
    assert (december["from"], december["to"]) == ("2026-12-01", "2026-12-31")
    assert [(d["date"], d["jobs"]["completed"], d["jobs"]["failed"]) for d in december["days"]] == [
        ("2026-12-01", 2, 0), ("2026-12-03", 1, 1)]
    assert december["jobs"] == {"completed": 3, "failed": 1, "cancelled": 0, "total": 4}
    assert december["video_seconds"] == 15.0 and december["gpu_seconds"] == 6.0
    one_day = usage(**{"from": "2026-12-01T22:00:00Z", "to": "2026-12-02T00:15:00+01:00"})  # both in UTC 1 Dec
    assert (one_day["from"], one_day["to"], one_day["jobs"]["completed"]) == ("2026-12-01", "2026-12-01", 2)
    unix = usage(**{"from": str(int(datetime.fromisoformat("2026-11-30T23:59:59+00:00").timestamp())),
                    "to": "1796169600"})  # 2026-12-02T00:00:00Z
    assert [d["date"] for d in unix["days"]] == ["2026-11-30", "2026-12-01"]
    assert usage(**{"from": "2026-12-04", "to": "2026-12-31"})["days"] == []
    default = usage()  # the last 30 days up to now
    assert default["to"] in _today() and date.fromisoformat(default["to"]) - date.fromisoformat(default["from"]) == \
        timedelta(days=30)


def test_with_auth_off_everyone_shares_one_anonymous_bucket(scratch_redis, scratch_app):
    """With no API keys, jobs without an owner are one bucket, read by any caller; keyed jobs are not in it."""
    _finish(scratch_redis, "", "2026-12-01T12:00:00+00:00")
    _finish(scratch_redis, key_id(KEY_A), "2026-12-01T12:00:00+00:00")
    reply = scratch_app([]).get("/usage", query_string={"from": "2026-12-01", "to": "2026-12-01"})
    assert reply.status_code == 200 and reply.json["jobs"]["completed"] == 1
