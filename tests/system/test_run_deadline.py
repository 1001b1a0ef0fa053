"""Run deadline (worker/deadline.py): a hung render fails `run_deadline`, releases its lease, reports itself on
/readyz, and the worker is recycled when the render cannot be stopped; a render past H3BATCH_MAX_RUN_S stops at its
next step and the same worker takes the next job."""
from __future__ import annotations

import time

import requests

from h3batch.worker.deadline import EXIT_RECYCLE
from tests.system.conftest import post_job, wait_all_finished


def test_a_render_hung_in_text_encode_fails_and_its_worker_is_recycled(stack_factory):
    """A render stuck in text_encode (the step-delay knob sleeps 120 s there) with H3BATCH_RENDER_STALL_S=2: the job
    fails `run_deadline` (retryable) within a few seconds, its lease is gone, /readyz reports the worker stalled
    (503, no other worker), the worker exits 75, and a replacement renders the job queued behind it."""
    stack = stack_factory()
    api = stack.start_api()
    r = stack.redis.client()
    hung = stack.start_worker("hung", H3BATCH_RENDER_STALL_S="2", H3BATCH_DEBUG_STEP_DELAY_S="120")
    first = post_job(api.base)["id"]
    behind = post_job(api.base, seed=2)["id"]
    posted = time.monotonic()
    assert wait_all_finished(r, [first], timeout_s=30) == {first: "failed"}
    failed_after = time.monotonic() - posted
    record = requests.get(f"{api.base}/jobs/{first}", timeout=60).json()
    assert record["error"]["code"] == "run_deadline" and record["error"]["retryable"] is True, record
    assert record["error"]["stage"] == "text_encode", record
    assert failed_after < 15, failed_after
    assert not r.exists(f"h3b:lease:{first}")
    ready = requests.get(f"{api.base}/readyz", timeout=60)
    assert ready.status_code == 503, ready.text
    assert ready.json()["checks"]["workers"]["stalled"] == ["hung"], ready.text
    assert hung.proc.wait(timeout=30) == EXIT_RECYCLE, hung.log_text()[-2000:]
    assert "did not stop" in hung.log_text()
    assert r.hget(f"h3b:job:{behind}", "status") == "queued"
    stack.start_worker("fresh")
    assert wait_all_finished(r, [behind], timeout_s=120) == {behind: "completed"}
    assert r.hget(f"h3b:job:{first}", "status") == "failed"  # the redelivered message did nothing
    deadline = time.monotonic() + 10  # the dead worker left its job directory; the reaper's garbage pass takes it
    while time.monotonic() < deadline and (stack.artifacts / first).exists():
        time.sleep(0.2)
    assert not (stack.artifacts / first).exists()


def test_a_render_past_max_run_s_stops_and_the_same_worker_takes_the_next_job(stack_factory):
    """H3BATCH_MAX_RUN_S=2 with 0.5 s per progress report (a render of ~7 s that keeps progressing): the job fails
    `run_deadline`, not retryable, the render stops at its next step (files removed), and the same process, still
    alive, claims the next job."""
    stack = stack_factory()
    api = stack.start_api()
    r = stack.redis.client()
    worker = stack.start_worker("slow", H3BATCH_MAX_RUN_S="2", H3BATCH_DEBUG_STEP_DELAY_S="0.5")
    first = post_job(api.base)["id"]
    second = post_job(api.base, seed=2)["id"]
    statuses = wait_all_finished(r, [first, second], timeout_s=60)
    assert statuses == {first: "failed", second: "failed"}, statuses
    for job_id in (first, second):
        error = requests.get(f"{api.base}/jobs/{job_id}", timeout=60).json()["error"]
        assert error["code"] == "run_deadline" and error["retryable"] is False, error
        assert r.hget(f"h3b:job:{job_id}", "worker") == "slow"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and worker.log_text().count("render stopped after its run deadline") < 2:
        time.sleep(0.2)
    assert worker.log_text().count("render stopped after its run deadline") == 2, worker.log_text()[-2000:]
    assert worker.proc.poll() is None  # stopped cooperatively: no recycle
    assert not (stack.artifacts / first).exists() and not (stack.artifacts / second).exists()
    assert requests.get(f"{api.base}/readyz", timeout=60).status_code == 200
