"""Redis restart with jobs queued (AOF on): every job completes, each exactly once, and the running worker resumes
consuming with no manual action (its watchdog would restart it if the consumer wedged; the test counts that too).

`make test` runs 5 jobs through a kill -9 of Redis (appendfsync always); `make test-chaos` runs 50 jobs through a
clean restart (appendfsync everysec), a kill -9 (always), and a kill -9 with everysec, where up to ~1 s of writes
may be lost and the reaper must make up for it.
"""
from __future__ import annotations

import json
import time

import av
import pytest
import requests

from tests.system.conftest import completed_events, post_job, wait_all_finished, wait_consuming


def run_redis_restart(stack_factory, jobs: int, mode: str, appendfsync: str) -> dict:
    stack = stack_factory(appendfsync=appendfsync)
    api = stack.start_api()
    worker = stack.start_worker("steady", H3BATCH_STALL_S="15")
    r = stack.redis.client()
    ids = [post_job(api.base, seed=i, prompt=f"clip {i}: surf on shingle")["id"] for i in range(jobs)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not r.zcard("h3b:running"):
        time.sleep(0.01)
    queued_at_restart = r.zcard("h3b:queue")
    started = time.monotonic()
    if mode == "kill9":
        stack.redis.kill9()
    else:
        stack.redis.shutdown()
    time.sleep(1.0)
    stack.redis.start()  # same port, same AOF
    down_s = time.monotonic() - started
    restarts = []

    def supervise() -> None:  # what compose's `restart: unless-stopped` does
        current = stack.workers[-1]
        if current.proc.poll() is not None:
            restarts.append(current.proc.returncode)
            wait_consuming(r, stack.spawn_worker(f"steady-{len(restarts)}", H3BATCH_STALL_S="15"))

    statuses = wait_all_finished(r, ids, timeout_s=90 + 6 * jobs, on_tick=supervise)
    assert statuses == {job_id: "completed" for job_id in ids}, (statuses, stack.logs()[-4000:])
    rendered = []
    for job_id in ids:
        assert completed_events(r, job_id) == 1, job_id
        rendered.append(int(r.hget(f"h3b:runs:{job_id}", "rendered") or 0))
        path = stack.artifacts / job_id / "video.mp4"
        assert sorted(p.name for p in path.parent.iterdir()) == ["video.mp4"], job_id
        with av.open(str(path)) as container:
            assert sum(1 for _ in container.decode(video=0)) == int(r.hget(f"h3b:job:{job_id}", "frames"))
    if appendfsync == "always":  # nothing acknowledged was lost: no render had to run twice
        assert rendered == [1] * jobs, rendered
    figures = {"mode": mode, "appendfsync": appendfsync, "jobs": jobs, "queued_at_restart": queued_at_restart,
               "completed": jobs, "lost": 0, "renders_run_twice": sum(n > 1 for n in rendered),
               "worker_restarts": len(restarts), "worker_exit_codes": restarts,
               "first_worker_alive": worker.proc.poll() is None, "redis_down_s": round(down_s, 2),
               "wall_s": round(time.monotonic() - started, 1)}
    print("\nRELIABILITY redis-restart " + json.dumps(figures))
    return figures


def test_redis_kill9_with_five_queued_jobs(stack_factory):
    """kill -9 of Redis (AOF, appendfsync always) while a job renders and four wait: all five complete exactly once
    with decodable MP4s, with no render run twice."""
    run_redis_restart(stack_factory, jobs=5, mode="kill9", appendfsync="always")


@pytest.mark.chaos
@pytest.mark.parametrize("mode, appendfsync", [("shutdown", "everysec"), ("kill9", "always"), ("kill9", "everysec")])
def test_redis_restart_with_fifty_queued_jobs(stack_factory, mode, appendfsync):
    """A Redis restart (clean, kill -9 with fsync always, kill -9 with fsync everysec) with 50 jobs queued: all 50
    complete exactly once with decodable MP4s and the worker consumes again without manual action."""
    run_redis_restart(stack_factory, jobs=50, mode=mode, appendfsync=appendfsync)


def test_api_answers_503_while_redis_is_down(stack_factory):
    """While Redis is down the API answers 503 storage_unavailable with Retry-After (never 500), and serves again
    once Redis is back."""
    stack = stack_factory(appendfsync="always")
    api = stack.start_api()
    job = post_job(api.base)
    stack.redis.kill9()
    for method, path in (("GET", f"/jobs/{job['id']}"), ("POST", "/jobs"), ("GET", "/jobs")):
        reply = requests.request(method, api.base + path, json={"prompt": "x"}, timeout=30)
        assert reply.status_code == 503, (path, reply.text)
        assert reply.json()["error"]["code"] == "storage_unavailable" and int(reply.headers["Retry-After"]) > 0
    stack.redis.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{api.base}/jobs/{job['id']}", timeout=60).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.2)
    assert requests.get(f"{api.base}/jobs/{job['id']}", timeout=60).json()["status"] == "queued"
