"""Capacity and out-of-memory, end to end: a real worker advertises `max_rows` (here H3BATCH_MAX_ROWS), the API
refuses larger requests on both create routes before anything is queued, a job that reaches the worker over its
limit fails `exceeds_worker_capacity`, and a CUDA out-of-memory error (the real torch class, raised inside the
pipeline by H3BATCH_DEBUG_OOM_AT) fails its job `out_of_memory` while the same worker process renders the next.

One stack for the module (Redis, API, one worker): every test leaves the worker idle. Only the last test renders a
clip to the end (the job after the OOM), about 2 s on an idle CPU.
"""
from __future__ import annotations

import json

import pytest
import requests

from h3batch.core import broker, defaults, keys, routing
from h3batch.core import jobs as store
from h3batch.core.celery_app import make_celery
from h3batch.core.geometry import RequestGeometry
from h3batch.core.jobs import JobSpec
from tests.service_stack import poll_until, wait_batch
from tests.system.conftest import RedisServer, Stack

SMALL = (128, 32, 4.0)  # 1,508 rows: fits and does not trip the injected OOM
MEDIUM = (256, 128, 4.0)  # 2,404 rows: fits the limit, trips the injected OOM
LARGE = (256, 128, 15.0)  # 5,654 rows: over the limit
MAX_ROWS = 3000
SERVED = routing.served_rows(MAX_ROWS)  # 2,896: the routing ladder's step at or below it (core/routing.py)
OOM_FROM_ROWS = 2000


def rows(size: tuple[int, int, float]) -> int:
    return RequestGeometry(*size).capacity_rows


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_release):
    assert rows(SMALL) < OOM_FROM_ROWS <= rows(MEDIUM) <= MAX_ROWS < rows(LARGE)
    root = tmp_path_factory.mktemp("capacity")
    server = RedisServer(root / "redis")
    server.start()
    made = Stack(root=root, release=tiny_release, redis=server)
    made.start_api()
    made.start_worker("cap-worker", H3BATCH_MAX_ROWS=str(MAX_ROWS), H3BATCH_DEBUG_OOM_AT=f"denoise:{OOM_FROM_ROWS}")
    yield made
    made.close()


def beat(stack: Stack) -> dict:
    return json.loads(stack.redis.client().get(keys.worker("cap-worker")))


def submit(stack: Stack, size: tuple[int, int, float]) -> dict:
    width, height, seconds = size
    reply = requests.post(f"{stack.api.base}/jobs", json={"prompt": "a kettle whistles", "width": width,
                                                          "height": height, "seconds": seconds}, timeout=10)
    assert reply.status_code == 202, reply.text
    return reply.json()


def finished(stack: Stack, job_id: str) -> dict:
    return poll_until(stack.api.base, job_id, lambda j: j["status"] in ("completed", "failed", "cancelled"),
                      timeout_s=180)


def test_heartbeat_advertises_the_max_rows_setting(stack):
    """The worker's heartbeat and its h3b:capacity entry carry H3BATCH_MAX_ROWS; /readyz reports it."""
    assert beat(stack)["max_rows"] == MAX_ROWS
    entry = json.loads(stack.redis.client().hget(keys.CAPACITY, "cap-worker"))
    assert entry["max_rows"] == MAX_ROWS
    ready = requests.get(f"{stack.api.base}/readyz", timeout=60).json()
    assert ready["checks"]["workers"]["max_rows"] == MAX_ROWS


def test_request_over_capacity_is_refused_on_both_routes_and_nothing_is_queued(stack):
    """/jobs and /v1/videos answer 422 exceeds_worker_capacity, retryable false, naming the limit and the request's
    rows; no record, index entry or render message is written."""
    r = stack.redis.client()
    before = (r.zcard(keys.JOBS_INDEX), r.zcard(keys.QUEUE), broker.render_depth(r),
              sorted(r.scan_iter(match=keys.job("*"))))
    width, height, seconds = LARGE
    replies = [
        requests.post(f"{stack.api.base}/jobs", json={"prompt": "rain", "width": width, "height": height,
                                                      "seconds": seconds}, timeout=10),
        requests.post(f"{stack.api.base}/v1/videos", json={"prompt": "rain", "size": f"{width}x{height}",
                                                           "seconds": str(int(seconds))}, timeout=10),
        requests.post(f"{stack.api.base}/v1/videos", data={"prompt": "rain", "size": f"{width}x{height}",
                                                           "seconds": str(int(seconds))}, timeout=10),
    ]
    for reply in replies:
        assert reply.status_code == 422, reply.text
        error = reply.json()["error"]
        assert error["code"] == "exceeds_worker_capacity" and error["retryable"] is False
        assert str(rows(LARGE)) in error["message"] and str(SERVED) in error["message"], error["message"]
    after = (r.zcard(keys.JOBS_INDEX), r.zcard(keys.QUEUE), broker.render_depth(r),
             sorted(r.scan_iter(match=keys.job("*"))))
    assert after == before  # (a request under the limit is accepted on the same route: the OOM test below)


def _line(size: tuple[int, int, float], custom_id: str) -> str:
    width, height, seconds = size
    return json.dumps({"custom_id": custom_id, "prompt": "a kettle whistles", "width": width, "height": height,
                       "seconds": seconds})


def test_a_batch_line_over_capacity_is_refused_by_line_and_skip_leaves_it_out(stack):
    """POST /batches measures every line as POST /jobs does: a line over the fleet's max_rows makes the batch 422
    invalid_batch naming that line, exceeds_worker_capacity and both figures, with nothing queued; with on_invalid
    skip the other lines run and the large one is listed as skipped."""
    r = stack.redis.client()
    before = (r.zcard(keys.JOBS_INDEX), r.zcard(keys.QUEUE), broker.render_depth(r))
    jsonl = "\n".join([_line(SMALL, "small-1"), _line(LARGE, "large"), _line(SMALL, "small-2")]).encode()
    refused = requests.post(f"{stack.api.base}/batches", files={"file": ("clips.jsonl", jsonl)}, timeout=60)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_batch" and error["retryable"] is False
    [detail] = error["details"]
    assert detail["line"] == 2 and detail["message"].startswith("exceeds_worker_capacity: "), detail
    assert str(rows(LARGE)) in detail["message"] and str(SERVED) in detail["message"], detail
    assert (r.zcard(keys.JOBS_INDEX), r.zcard(keys.QUEUE), broker.render_depth(r)) == before

    skipped = requests.post(f"{stack.api.base}/batches", files={"file": ("clips.jsonl", jsonl)},
                            data={"on_invalid": "skip"}, timeout=60)
    assert skipped.status_code == 202, skipped.text
    batch = skipped.json()
    assert [entry["line"] for entry in batch["skipped"]] == [2], batch
    assert batch["counts"]["total"] == 2, batch
    done = wait_batch(stack.api.base, batch["id"], timeout_s=180)  # the worker is idle again for the tests below
    results = requests.get(f"{stack.api.base}/batches/{batch['id']}/results", timeout=60).text.splitlines()
    assert [json.loads(line)["custom_id"] for line in results] == ["small-1", "small-2"], results
    assert all(json.loads(line)["status"] == "completed" for line in results), (done, results)


def test_a_job_over_the_workers_own_limit_fails_exceeds_worker_capacity(stack):
    """A job queued past the API (as when the fleet shrank after it was accepted) is refused by the worker itself."""
    r = stack.redis.client()
    width, height, seconds = LARGE
    record = store.create_job(r, JobSpec(prompt="rain", seconds=seconds, width=width, height=height, seed=3),
                              max_queued=100)
    consumed = routing.queue_name("t2va", "bf16", SERVED)  # a queue it consumes, as if routed before it shrank
    make_celery(stack.redis.url, max_run_s=60).send_task(defaults.RENDER_TASK, args=[record["id"]], queue=consumed)
    job = finished(stack, record["id"])
    assert job["status"] == "failed" and job["error"]["code"] == "exceeds_worker_capacity", job
    assert job["error"]["retryable"] is False and str(MAX_ROWS) in job["error"]["message"]


def test_out_of_memory_fails_the_job_and_the_same_worker_renders_the_next(stack):
    """torch.OutOfMemoryError raised inside denoise fails that job out_of_memory (retryable false, stage
    denoise, logged with the job id, memory released); the same worker process then completes the next job."""
    pid = beat(stack)["pid"]
    failed = finished(stack, submit(stack, MEDIUM)["id"])
    assert failed["status"] == "failed", failed
    assert failed["error"]["code"] == "out_of_memory" and failed["error"]["retryable"] is False, failed
    assert failed["error"]["stage"] == "denoise" and str(rows(MEDIUM)) in failed["error"]["message"]
    done = finished(stack, submit(stack, SMALL)["id"])
    assert done["status"] == "completed", done
    assert done["worker"] == failed["worker"] == "cap-worker"
    assert beat(stack)["pid"] == pid and stack.workers[0].proc.poll() is None
    log = stack.workers[0].log_text()
    oom_lines = [line for line in log.splitlines() if "out of GPU memory" in line]
    assert oom_lines and failed["id"] in oom_lines[0], log[-3000:]
    assert any("memory released after out-of-memory" in line and failed["id"] in line for line in log.splitlines())
    assert "Traceback" not in log.split(oom_lines[0], 1)[1].split("memory released", 1)[0]
