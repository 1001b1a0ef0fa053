"""Priority lanes end to end (core/lanes.py): a real API, one real worker, its own Redis. The queue is filled while no
worker is live, then the worker starts and the order of the jobs' `started_at` is read: interactive jobs start
before the batch-lane work that was waiting, and under a longer interactive stream batch work still gets one start
after every H3BATCH_INTERACTIVE_STREAK interactive ones. Orders of events only, never durations."""
from __future__ import annotations

import json

import requests

from h3batch.core import keys
from tests.service_stack import poll_until
from tests.system.conftest import SMALL

JOB = {**SMALL, "seconds": 4}


def _post(stack, path: str, body: dict) -> requests.Response:
    return requests.post(f"{stack.api.base}{path}", json=body, timeout=30)


def _submit(stack, prompt: str, **extra) -> str:
    reply = _post(stack, "/jobs", {"prompt": prompt, **JOB, **extra})
    assert reply.status_code == 202, reply.text
    return reply.json()["id"]


def _batch(stack, n: int) -> list[str]:
    reply = _post(stack, "/batches", {"requests": [{"prompt": f"batch item {i}", **JOB} for i in range(n)]})
    assert reply.status_code == 202, reply.text
    results = requests.get(f"{stack.api.base}/batches/{reply.json()['id']}/results", timeout=30)
    return [json.loads(line)["job_id"] for line in results.text.splitlines()]


def _lanes_in_start_order(stack, job_ids: list[str]) -> list[tuple[str, str]]:
    done = [poll_until(stack.api.base, job_id, lambda j: j["status"] in ("completed", "failed", "cancelled"),
                       timeout_s=600) for job_id in job_ids]
    assert [j["status"] for j in done] == ["completed"] * len(done), done
    return [(j["priority"], j["id"]) for j in sorted(done, key=lambda j: j["started_at"])]


def test_interactive_jobs_start_before_the_batch_work_waiting_and_the_field_is_checked(stack_factory):
    """Held batch-lane work (2 batch items, a /jobs and a /v1/videos job asking for `batch`) waits while 3
    interactive jobs are submitted after it; once the worker is up the 3 interactive jobs start first. The held
    single job shows `priority: batch` and no queue position; a bad value is 400 naming `priority`, a batch line
    asking for `interactive` is 422 naming it."""
    stack = stack_factory()
    stack.start_api()
    r = stack.redis.client()
    batch_lane = _batch(stack, 2)
    batch_lane.append(_submit(stack, "a batch-lane single job", priority="batch"))
    video = _post(stack, "/v1/videos", {"prompt": "a batch-lane video", "size": "128x32", "seconds": "4",
                                        "priority": "batch"})
    assert video.status_code == 202 and video.json()["priority"] == "batch", video.text
    batch_lane.append(video.json()["id"])
    held = requests.get(f"{stack.api.base}/jobs/{batch_lane[2]}", timeout=30).json()
    assert (held["status"], held["priority"], held["queue_position"]) == ("queued", "batch", None), held
    assert r.zscore(keys.LANE_BATCH, batch_lane[2]) is not None and r.zcard(keys.QUEUE) == 0
    interactive = [_submit(stack, f"interactive {i}") for i in range(3)]
    assert requests.get(f"{stack.api.base}/jobs/{interactive[0]}", timeout=30).json()["priority"] == "interactive"

    bad = _post(stack, "/jobs", {"prompt": "x", **JOB, "priority": "urgent"})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("priority:"), bad.text
    bad = _post(stack, "/v1/videos", {"prompt": "x", "priority": "urgent"})
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("priority:"), bad.text
    bad = _post(stack, "/batches", {"requests": [{"prompt": "x", **JOB, "priority": "interactive"}]})
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "priority", bad.text
    doc = requests.get(f"{stack.api.base}/openapi.json", timeout=30).json()
    assert doc["components"]["schemas"]["CreateJob"]["properties"]["priority"]
    assert doc["components"]["schemas"]["Job"]["properties"]["priority"]

    stack.start_worker("lanes-a", H3BATCH_INTERACTIVE_STREAK="4")
    order = _lanes_in_start_order(stack, batch_lane + interactive)
    assert [lane for lane, _ in order] == ["interactive"] * 3 + ["batch"] * 4, order


def test_a_long_interactive_stream_still_lets_batch_work_start(stack_factory):
    """With H3BATCH_INTERACTIVE_STREAK=2, 3 batch-lane jobs waiting and 6 interactive ones queued after them: the
    worker starts two interactive jobs, then one batch job (promoted: it went ahead of the interactive messages
    waiting), and so on: i i b i i b i i b."""
    stack = stack_factory()
    stack.start_api()
    r = stack.redis.client()
    batch_lane = _batch(stack, 2) + [_submit(stack, "a batch-lane single job", priority="batch")]
    interactive = [_submit(stack, f"interactive {i}") for i in range(6)]
    stack.start_worker("lanes-b", H3BATCH_INTERACTIVE_STREAK="2")
    order = _lanes_in_start_order(stack, batch_lane + interactive)
    assert [lane for lane, _ in order] == ["interactive", "interactive", "batch"] * 3, order
    promoted = [job_id for lane, job_id in order if lane == "batch" and r.hget(keys.job(job_id), "promoted_at")]
    assert len(promoted) >= 2, order  # the last may also have gone by idle capacity once the stream ended
