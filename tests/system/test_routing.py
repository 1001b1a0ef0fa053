"""Routing by capability, end to end: two real workers of different advertised capacity on one Redis and one API.

`small` advertises H3BATCH_MAX_ROWS=2000 (it serves up to 1,723 rows, its step of the routing ladder); `large`
advertises its CPU memory plan (host RAM). Jobs go only to the queues of what they need (core/routing.py), so a job
too large for `small` waits for `large` instead of landing on `small` and failing `exceeds_worker_capacity`, also
when it is re-sent after `large` dies mid-render. What no live worker serves (a precision, a task, a size) is
refused at submission on /jobs, /v1/videos and per line of /batches.
"""
from __future__ import annotations

import json

import pytest
import requests

from h3batch.core import broker, defaults, keys, routing
from h3batch.core import jobs as store
from h3batch.core.celery_app import make_celery
from h3batch.core.geometry import CONTRACT_MAX_ROWS, TINY_CANVAS, RequestGeometry
from h3batch.core.jobs import JobSpec
from h3batch.worker import reaper
from tests.service_stack import poll_until
from tests.system.conftest import RedisServer, Stack

SMALL_ROWS = 2000
SMALL_JOB = (128, 32, 4.0)  # 1,508 rows: both workers serve it
LARGE_JOB = (256, 128, 4.0)  # 2,404 rows (step 2,436): only `large`
WEB_LARGEST = (1344, 768, 15.0)  # the web page's largest choice: 110,086 rows, more than a CPU's host RAM serves


def rows(size: tuple[int, int, float]) -> int:
    return RequestGeometry(*size).capacity_rows


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_release):
    assert rows(SMALL_JOB) <= routing.served_rows(SMALL_ROWS) < rows(LARGE_JOB)
    root = tmp_path_factory.mktemp("routing")
    server = RedisServer(root / "redis")
    server.start()
    made = Stack(root=root, release=tiny_release, redis=server)
    made.start_api()
    made.start_worker("small", H3BATCH_MAX_ROWS=str(SMALL_ROWS))
    made.start_worker("large", H3BATCH_DEBUG_STEP_DELAY_S="0.3")  # capacity from its memory plan (host RAM)
    yield made
    made.close()


def beat(stack: Stack, name: str) -> dict:
    return json.loads(stack.redis.client().get(keys.worker(name)))


def submit(stack: Stack, size: tuple[int, int, float], **extra) -> requests.Response:
    width, height, seconds = size
    return requests.post(f"{stack.api.base}/jobs", json={"prompt": "a kettle whistles", "width": width,
                                                          "height": height, "seconds": seconds, **extra}, timeout=10)


def finished(stack: Stack, job_id: str) -> dict:
    return poll_until(stack.api.base, job_id, lambda j: j["status"] in ("completed", "failed", "cancelled"),
                      timeout_s=300)


def test_heartbeats_advertise_each_workers_capability_and_it_consumes_their_queues(stack):
    """Each heartbeat and h3b:capacity entry carry precision bf16, release kind v2, tasks [t2va], the release's
    canvas and max_rows; the worker consumes one queue per ladder step it serves, and `large` advertises its CPU
    memory plan's figure, below the contract's largest request."""
    large_rows = beat(stack, "large")["max_rows"]
    assert rows(LARGE_JOB) <= large_rows < CONTRACT_MAX_ROWS, large_rows
    for name, max_rows in (("small", SMALL_ROWS), ("large", large_rows)):
        advertised = beat(stack, name)
        entry = json.loads(stack.redis.client().hget(keys.CAPACITY, name))
        for seen in (advertised, entry):
            assert {k: seen[k] for k in ("max_rows", "precision", "release_kind", "tasks", "canvas")} == {
                "max_rows": max_rows, "precision": "bf16", "release_kind": "v2", "tasks": ["t2va"],
                "canvas": TINY_CANVAS.as_json()}, seen
        queues = routing.Capability.from_json(advertised).queues()
        worker = next(w for w in stack.workers if w.name == name)
        assert f"worker starting consumer queues={','.join(queues)} " in worker.log_text()
    log = next(w for w in stack.workers if w.name == "large").log_text()
    assert f"max_rows={large_rows} (memory plan)" in log, log[-2000:]


def test_a_job_too_large_for_one_worker_waits_for_the_other_instead_of_failing(stack):
    """Two 2,404-row jobs sent together: `large` renders one, the other waits in its queue while `small` is idle
    (with one shared queue `small` took it and failed it exceeds_worker_capacity); both complete on `large`. A job
    both serve completes too."""
    first, second = (submit(stack, LARGE_JOB) for _ in range(2))
    assert first.status_code == second.status_code == 202, (first.text, second.text)
    small = submit(stack, SMALL_JOB)
    assert small.status_code == 202, small.text
    queue = routing.queue_name("t2va", "bf16", routing.rows_step(rows(LARGE_JOB)))
    assert queue not in routing.Capability.from_json(beat(stack, "small")).queues()
    done = [finished(stack, reply.json()["id"]) for reply in (first, second, small)]
    assert [job["status"] for job in done] == ["completed"] * 3, done
    assert [job["worker"] for job in done[:2]] == ["large", "large"], done
    assert all(job["attempt"] == 1 for job in done), done


def test_a_job_resent_after_its_worker_died_goes_back_to_its_capability_queue(stack):
    """`large` is killed mid-render of a 2,404-row job: the reaper (run by `small`'s heartbeat) puts it back in
    line on its own capability queue, where it waits (state queued, message in that queue) while `small` stays
    READY; a new large worker renders it as attempt 2."""
    reply = submit(stack, LARGE_JOB)
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["id"]
    poll_until(stack.api.base, job_id, lambda j: j["status"] == "in_progress" and j["worker"] == "large")
    next(w for w in stack.workers if w.name == "large").kill()
    r = stack.redis.client()
    queue = routing.queue_name("t2va", "bf16", routing.rows_step(rows(LARGE_JOB)))
    requeued = poll_until(stack.api.base, job_id,
                          lambda j: j["status"] == "queued" and j["attempt"] == 1
                          and job_id in reaper.messages_waiting(r, queue), timeout_s=120)
    assert requeued["status"] == "queued"
    assert beat(stack, "small")["state"] == "READY" and beat(stack, "small")["job_id"] is None
    stack.start_worker("large-2")
    done = finished(stack, job_id)
    assert (done["status"], done["worker"], done["attempt"]) == ("completed", "large-2", 2), done
    assert broker.render_depth(r) == 0


def test_what_no_live_worker_serves_is_refused_at_submission_naming_what_is_missing(stack):
    """fp8 (no fp8 worker), task fl2va (no worker serves it) and the web page's largest clip (past every worker's
    memory plan) are 422 on /jobs and /v1/videos, with nothing written; the message names what is missing and what
    the fleet serves. A batch names the refused lines by number and field."""
    r = stack.redis.client()
    before = (r.zcard(keys.JOBS_INDEX), broker.render_depth(r))
    cases = [
        (submit(stack, SMALL_JOB, precision="fp8"), "no_capable_worker", "precision 'fp8'"),
        (submit(stack, SMALL_JOB, task="fl2va"), "no_capable_worker", "task 'fl2va'"),
        (submit(stack, WEB_LARGEST), "exceeds_worker_capacity", f"needs {rows(WEB_LARGEST)} rows"),
        (requests.post(f"{stack.api.base}/v1/videos", data={"prompt": "rain", "size": "128x32", "seconds": "4",
                                                           "precision": "fp8"}, timeout=10),
         "no_capable_worker", "precision 'fp8'"),
        (requests.post(f"{stack.api.base}/v1/videos", json={"prompt": "rain", "size": "1344x768", "seconds": "15"},
                       timeout=10), "exceeds_worker_capacity", f"needs {rows(WEB_LARGEST)} rows"),
    ]
    for reply, code, missing in cases:
        assert reply.status_code == 422, reply.text
        error = reply.json()["error"]
        assert (error["code"], error["retryable"]) == (code, False), error
        assert missing in error["message"] and "t2va bf16 up to 1723 rows (v2)" in error["message"], error
    lines = [{"prompt": "a", "width": 128, "height": 32, "seconds": 4},
             {"prompt": "b", "width": 128, "height": 32, "seconds": 4, "precision": "fp8"},
             {"prompt": "c", "width": 1344, "height": 768, "seconds": 15},
             {"prompt": "d", "width": 128, "height": 32, "seconds": 4, "task": "ref2va"}]
    refused = requests.post(f"{stack.api.base}/batches", json={"requests": lines}, timeout=10)
    assert refused.status_code == 422, refused.text
    details = refused.json()["error"]["details"]
    assert [(d["line"], d["field"], d["message"].split(":")[0]) for d in details] == [
        (2, "precision", "no_capable_worker"), (3, "body", "exceeds_worker_capacity"),
        (4, "task", "no_capable_worker")], details
    assert (r.zcard(keys.JOBS_INDEX), broker.render_depth(r)) == before


def test_a_job_sent_by_hand_to_a_worker_of_another_precision_fails_instead_of_rendering_in_it(stack):
    """A fp8 job whose message is sent by hand to a queue `small` consumes fails `no_capable_worker` there: a
    worker never renders a job in a precision it was not asked for."""
    r = stack.redis.client()
    record = store.create_job(r, JobSpec(prompt="rain", seconds=4.0, width=128, height=32, seed=3, precision="fp8"),
                              max_queued=100)
    make_celery(stack.redis.url, max_run_s=60).send_task(defaults.RENDER_TASK, args=[record["id"]],
                                                         queue=routing.queue_name("t2va", "bf16", 1449))
    job = finished(stack, record["id"])
    assert (job["status"], job["error"]["code"], job["precision"]) == ("failed", "no_capable_worker", "fp8"), job
    assert job["error"]["message"] == "this worker serves t2va in bf16; the job needs t2va in fp8"
