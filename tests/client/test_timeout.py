"""A per-job `timeout_s` (seconds from creation, queue time included), capped by H3BATCH_MAX_JOB_TIMEOUT_S: a job
past it fails with error code `timeout` (the client's JobTimeout), one within it completes and shows it; asking for
more than the cap, or for nothing at all, is refused at the door."""
from __future__ import annotations

import time

import pytest

from h3batch.client import Client, InvalidRequest, JobTimeout
from h3batch.worker.deadline import DeadlineConfig, RunDeadline, _Held
from tests.api.conftest import KEY_A

CANVAS = {"seconds": 4, "width": 256, "height": 128}


def test_a_job_past_its_timeout_fails_timeout_and_one_within_it_completes(stack):
    """Queued behind a render (which lasts longer than 0.05 s: the worker sleeps at each of its 11 progress reports),
    the job is past its timeout_s when the worker takes it: it fails `timeout`, not retryable, without rendering;
    a job with room to spare completes and shows its timeout_s."""
    with Client(stack.base, KEY_A) as client:
        blocker = client.create("a long hum", **CANVAS)
        late = client.create("too late", timeout_s=0.05, **CANVAS)
        roomy = client.create("in time", timeout_s=600, **CANVAS)
        with pytest.raises(JobTimeout) as timed_out:
            client.wait(late)
        assert client.wait(blocker).status.value == "completed"
        done = client.wait(roomy)
    job = timed_out.value.job
    assert job.status.value == "failed" and job.error.code == "timeout" and job.error.retryable is False
    assert "timeout_s" in job.error.message and job.timeout_s == 0.05 and job.progress < 1.0
    assert done.status.value == "completed" and done.timeout_s == 600


def test_timeout_over_the_cap_or_not_positive_is_refused(stack):
    """Over H3BATCH_MAX_JOB_TIMEOUT_S (3600 by default) is 400 naming the setting; 0 is 400 too; nothing queued."""
    with Client(stack.base, KEY_A) as client:
        before = client.list(limit=1).first_id
        with pytest.raises(InvalidRequest, match="H3BATCH_MAX_JOB_TIMEOUT_S") as over:
            client.create("x", timeout_s=3601, **CANVAS)
        with pytest.raises(InvalidRequest, match="timeout_s"):
            client.create("x", timeout_s=0, **CANVAS)
        assert client.list(limit=1).first_id == before
    assert over.value.status == 400 and "at most 3600 s" in over.value.message


def test_the_run_deadline_fires_timeout_before_its_own_limits():
    """A held job past its timeout_at is a `timeout` (not retryable) even while the run and stall limits are far."""
    deadline = RunDeadline(None, "w", DeadlineConfig(max_run_s=600, stall_s=300), record_ttl_s=60)
    now = time.monotonic()
    held = _Held("job_x", "w:1", 1, claimed=now, last_progress=now, timeout_at=time.time() - 1)
    message, retryable, code = deadline._reason(held, now)
    assert code == "timeout" and retryable is False and "timeout_s" in message
    assert deadline._reason(_Held("job_y", "w:1", 1, claimed=now, last_progress=now, timeout_at=time.time() + 60),
                            now) is None


def test_batch_lines_carry_their_timeout_and_the_cap(stack):
    """A batch line over the cap is refused by line and field; a line within it keeps its timeout_s on its job."""
    with Client(stack.base, KEY_A) as client:
        from h3batch.client import InvalidBatch

        with pytest.raises(InvalidBatch) as refused:
            client.create_batch([{"prompt": "a", **CANVAS}, {"prompt": "b", "timeout_s": 99999, **CANVAS}])
        assert [(d["line"], d["field"]) for d in refused.value.details] == [(2, "timeout_s")]
        batch = client.wait_batch(client.create_batch([{"prompt": "c", "timeout_s": 900, **CANVAS}]), poll_s=0.2)
        job = client.get(client.batch_results(batch)[0].job_id)
    assert job.timeout_s == 900 and job.status.value == "completed"
