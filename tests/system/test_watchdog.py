"""Consumer watchdog (worker/watchdog.py): a worker that stops taking messages while work waits exits with status 75
within H3BATCH_STALL_S, so its supervisor restarts it and the work is done (spec §3 pitfall 6)."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import redis as redis_lib

from h3batch.core.celery_app import make_celery
from h3batch.worker.heartbeat import WorkerState
from h3batch.worker.watchdog import EXIT_STALLED, Watchdog, WatchdogConfig
from tests.system.conftest import H3BATCH, REPO, post_job, wait_all_finished

STALL_S = 3.0


def test_a_worker_that_stops_consuming_exits_and_its_replacement_finishes_the_job(stack_factory):
    """A live worker whose consumer is cancelled (what a broker restart can leave behind: heartbeat fine, nothing
    consumed) exits with 75 once a job has waited STALL_S, deletes its heartbeat, and a restarted worker completes
    the job."""
    stack = stack_factory()
    api = stack.start_api()
    worker = stack.start_worker("wedged", H3BATCH_STALL_S=str(STALL_S))
    app = make_celery(stack.redis.url)
    node = f"{worker.name}@h3batch"
    consumed = app.control.inspect(destination=[node], timeout=10).active_queues() or {}
    queues = [q["name"] for q in consumed.get(node, [])]  # its capability queues (docs/service.md "Routing")
    assert queues, consumed
    for queue in queues:
        replies = app.control.cancel_consumer(queue, destination=[node], reply=True, timeout=10)
        assert replies and "ok" in json.dumps(replies), replies
    r = stack.redis.client()
    job = post_job(api.base)
    posted = time.monotonic()
    try:
        code = worker.proc.wait(timeout=STALL_S + 30)
    finally:
        app.close()
    waited = time.monotonic() - posted
    assert code == EXIT_STALLED, worker.log_text()[-2000:]
    assert waited >= STALL_S, waited  # a lower bound: load only lengthens it
    assert "watchdog: consumer stalled" in worker.log_text()
    assert r.get(f"h3b:worker:{worker.name}") is None  # /readyz stops counting it at once
    assert r.hget(f"h3b:job:{job['id']}", "status") == "queued"
    stack.start_worker("restarted", H3BATCH_STALL_S=str(STALL_S))
    assert wait_all_finished(r, [job["id"]], timeout_s=120) == {job["id"]: "completed"}


def test_a_busy_or_idle_worker_without_waiting_work_is_left_alone(stack_factory):
    """The watchdog never fires while the worker renders (BUSY) or while nothing waits: a worker with a 1 s stall
    limit renders three jobs back to back (each longer than 1 s) and is still alive afterwards."""
    stack = stack_factory()
    api = stack.start_api()
    worker = stack.start_worker("steady", H3BATCH_STALL_S="1", H3BATCH_DEBUG_STEP_DELAY_S="0.1")
    ids = [post_job(api.base, seed=i)["id"] for i in range(3)]
    statuses = wait_all_finished(stack.redis.client(), ids, timeout_s=120)
    assert set(statuses.values()) == {"completed"}
    time.sleep(2.5)  # idle with an empty queue for longer than the stall limit
    assert worker.proc.poll() is None, worker.log_text()[-2000:]


@pytest.mark.parametrize("command, variable, value", [
    ("worker", "H3BATCH_STALL_S", "soon"), ("worker", "H3BATCH_STALL_S", "-5"),
    ("api", "H3BATCH_RATE_CREATES_PER_MIN", "lots"), ("api", "H3BATCH_RATE_READS_PER_MIN", "-1"),
])
def test_bad_reliability_settings_exit_2_with_one_line(tmp_path, command, variable, value):
    """A malformed H3BATCH_STALL_S or H3BATCH_RATE_* makes `h3batch worker|api` print one line naming the variable,
    what it expects and what it found, and exit 2 (before touching Redis or the model)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3BATCH_")}
    env.update({variable: value, "H3BATCH_REDIS_URL": "redis://127.0.0.1:1/0",
                "H3BATCH_ARTIFACTS_DIR": str(tmp_path / "artifacts")})
    done = subprocess.run(H3BATCH + [command], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert variable in lines[0] and value in lines[0] and "expected" in lines[0]


@pytest.mark.parametrize("state, fires", [(WorkerState.READY, True), (WorkerState.BUSY, False)])
def test_the_watchdog_fires_on_a_waiting_message_only_when_the_worker_is_not_busy(redis_url, state, fires):
    """In-process, against real Redis: one message waits in the broker list; the watchdog calls `on_stall` within
    the stall limit while the heartbeat state is READY, and never while it is BUSY."""
    r = redis_lib.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/4", decode_responses=True)
    r.flushdb()
    stalls: list[float] = []
    dog = Watchdog(r, "dog-test", ["render"], lambda: state, WatchdogConfig(stall_s=0.3, check_every_s=0.05),
                   on_stall=stalls.append)
    try:
        r.rpush("render", "a message nobody takes")
        dog.start()
        dog.arm()
        time.sleep(1.0)
    finally:
        dog.stop()
        dog.join(timeout=5)
        r.flushdb()
        r.close()
    assert bool(stalls) is fires, stalls
    assert all(idle >= 0.3 for idle in stalls)
