"""Flower against the real stack: task events from the API and the GPU worker reach `celery flower` on the test
Redis, which lists the finished render task (and, in a second Flower on the sweep app, a sweep task) in its HTTP
API, with the worker and the queue it came from.

Flower keeps only what it hears: events are pub/sub messages and are not replayed, so a task that finished before
Flower started never shows. Each test therefore waits until its Flower has heard the worker's heartbeat (Flower's
/metrics `flower_worker_online`) before sending work. The render test uses the session's API and worker
(tests/service_stack.py); the sweep test starts its own `h3batch sweep-worker` on the same Redis.
"""
from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from h3batch.core import defaults
from tests.service_stack import free_port, poll_until, service_env, wait_http
from tests.system.conftest import FINISHED, post_job

FLOWER_USER = "ops"


class FlowerProcess:
    """`celery [app args] flower` on a loopback port with basic auth and read-only mode, as in docker-compose.yml."""

    def __init__(self, celery_args: list[str], env: dict[str, str], log_path: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.auth = (FLOWER_USER, secrets.token_hex(12))
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "celery", *celery_args, "flower", "--address=127.0.0.1",
                 f"--port={self.port}", f"--basic-auth={self.auth[0]}:{self.auth[1]}", "--read-only"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.log_path = log_path
        wait_http(self.base + "/healthcheck", proc=self.proc)

    def get(self, path: str) -> requests.Response:
        return requests.get(self.base + path, auth=self.auth, timeout=60)

    def wait_worker_online(self, hostname: str, timeout_s: float = 60.0) -> None:
        """Until Flower's own metrics say it heard `hostname`'s worker events (so the event path is live)."""
        line = re.compile(r'^flower_worker_online\{worker="' + re.escape(hostname) + r'"\} 1\.0$', re.MULTILINE)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if line.search(requests.get(self.base + "/metrics", timeout=60).text):
                return
            time.sleep(0.2)
        pytest.fail(f"Flower never saw worker {hostname} online: {self.log_path.read_text()[-2000:]}")

    def wait_task(self, predicate, timeout_s: float = 30.0) -> dict:
        """Poll GET /api/tasks until a task satisfies predicate(task); returns it (its uuid under "uuid")."""
        deadline = time.monotonic() + timeout_s
        tasks: dict = {}
        while time.monotonic() < deadline:
            reply = self.get("/api/tasks")
            assert reply.status_code == 200, reply.text
            tasks = reply.json()
            for uuid, task in tasks.items():
                if predicate(task):
                    return {**task, "uuid": uuid}
            time.sleep(0.2)
        pytest.fail(f"no task matched in Flower within {timeout_s} s; it lists: {tasks}")

    def worker_queues(self, hostname: str) -> list[str]:
        """Ask Flower to inspect the workers now (a solo worker answers between jobs); `hostname`'s queue names."""
        reply = self.get("/api/workers?refresh=1")
        assert reply.status_code == 200, reply.text
        return [q["name"] for q in reply.json().get(hostname, {}).get("active_queues", [])]

    def queue_lengths(self) -> dict[str, int]:
        """Messages waiting per queue that Flower knows of (from the last inspection), read from Redis."""
        reply = self.get("/api/queues/length")
        assert reply.status_code == 200, reply.text
        return {q["name"]: q["messages"] for q in reply.json()["active_queues"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def test_flower_lists_a_finished_render_task(redis_url, api, worker, artifacts_dir, tmp_path):
    """`celery --broker=$H3BATCH_REDIS_URL flower` (the documented command), started beside the session's API and
    worker, hears the worker's heartbeat, then the API's task-sent and the worker's task events: after one job,
    /api/tasks holds `h3batch.render` with the job id as its only argument, state SUCCESS, run by the worker's Celery
    hostname on the render queue, with received/started/succeeded times in order; the worker's queue and its length
    are listed; without credentials the API answers 401, and read-only mode refuses control actions."""
    flower = FlowerProcess([f"--broker={redis_url}"], service_env(redis_url, artifacts_dir), tmp_path / "flower.log")
    try:
        hostname = f"{worker.name}@h3batch"
        flower.wait_worker_online(hostname)  # a heartbeat event: Celery's heartbeat is on (worker/run_worker.py)
        job_id = post_job(api.base)["id"]
        job = poll_until(api.base, job_id, lambda j: j["status"] in FINISHED)
        assert job["status"] == "completed", job
        task = flower.wait_task(lambda t: job_id in (t.get("args") or "") and t.get("state") == "SUCCESS")
        assert task["name"] == defaults.RENDER_TASK and task["args"] == repr([job_id])
        assert task["worker"] == hostname and task["routing_key"] == defaults.RENDER_QUEUE
        assert task["sent"] is not None  # the API's task-sent event (task_send_sent_event)
        assert task["received"] <= task["started"] <= task["succeeded"]  # (sent is stamped after the publish)
        assert flower.worker_queues(hostname) == [defaults.RENDER_QUEUE]
        assert defaults.RENDER_QUEUE in flower.queue_lengths()
        assert requests.get(flower.base + "/api/tasks", timeout=60).status_code == 401
        assert requests.post(f"{flower.base}/api/worker/shutdown/{hostname}", auth=flower.auth,
                             timeout=10).status_code == 403  # read-only: no control from the UI
    finally:
        flower.stop()


def test_a_second_flower_on_the_sweep_app_lists_a_sweep_task(redis_url, artifacts_dir, tmp_path):
    """The sweep app's keys and event channels carry its own prefix, so the sweep queue has its own Flower:
    `celery -A h3batch.loadrunner.celery_app flower`. A `loadrunner.start_sweep` run by a real `h3batch
    sweep-worker` shows there as SUCCESS on the `loadrunner` queue."""
    env = service_env(redis_url, artifacts_dir, H3BATCH_SWEEP_RESULTS_DIR=str(tmp_path / "sweeps"))
    flower = FlowerProcess(["-A", "h3batch.loadrunner.celery_app"], env, tmp_path / "flower-sweeps.log")
    log = (tmp_path / "sweep-worker.log").open("ab")
    sweep_worker = subprocess.Popen([sys.executable, "-P", "-m", "h3batch.cli", "sweep-worker"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        flower.wait_worker_online(_sweep_hostname())
        from h3batch.loadrunner.celery_app import START_SWEEP, make_app  # noqa: PLC0415
        from h3batch.loadrunner.sweep_settings import SweepSettings  # noqa: PLC0415

        sender = make_app(SweepSettings(redis_url=redis_url, results_dir=tmp_path / "sweeps"))
        # A scheduled sweep whose request does not parse: the task logs the refusal and succeeds (no load run).
        sent = sender.send_task(START_SWEEP, args=[{"url": "not a url"}, None, "schedule:flower-test"])
        task = flower.wait_task(lambda t: t.get("state") == "SUCCESS" and t.get("name") == START_SWEEP)
        assert task["uuid"] == sent.id and task["worker"] == _sweep_hostname()
        assert task["routing_key"] == "loadrunner"
        assert flower.worker_queues(_sweep_hostname()) == ["loadrunner"]
        assert flower.queue_lengths() == {"loadrunner": 0}  # counted under the sweep app's key prefix
    finally:
        flower.stop()
        sweep_worker.terminate()
        sweep_worker.wait(timeout=30)
        log.close()


def _sweep_hostname() -> str:
    import socket  # noqa: PLC0415

    return f"loadrunner@{socket.gethostname()}"
