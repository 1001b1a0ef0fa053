"""Reliability fixtures: each stack gets its own redis-server (so a test may kill or restart it), the real API behind
gunicorn, and real `h3batch worker` subprocesses on the tiny release, built once per session.

The API and worker process classes come from tests/service_stack.py (one way to start them for the whole
project); Redis is started here because these tests choose its persistence and kill it.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import requests

REPO = Path(__file__).resolve().parents[2]

from tests.service_stack import H3BATCH, ApiProcess, WorkerProcess, service_env  # noqa: E402

FAST_RECOVERY = {"H3BATCH_LEASE_TTL_S": "3", "H3BATCH_RECONCILE_INTERVAL_S": "0.5"}
"""Worker env: a lease lapses 3 s after its worker's death (renewed every 1 s: a CPU-starved but live worker keeps it)
and the reaper looks every 0.5 s (defaults 30 s and 10 s)."""

SMALL = {"width": 128, "height": 32}
"""Smallest canvas the geometry rules allow: a tiny-release job renders in about a second on a CPU."""

FINISHED = ("completed", "failed", "cancelled", "expired")


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: long fault-injection runs (make test-chaos); skipped unless "
                                       "H3BATCH_CHAOS=1")


def pytest_collection_modifyitems(config, items):
    """Chaos tests run only under `make test-chaos` (H3BATCH_CHAOS=1); `make test` shows them skipped, with why."""
    if os.environ.get("H3BATCH_CHAOS") == "1":
        return
    skip = pytest.mark.skip(reason="long fault-injection run (minutes on 2 cores): `make test-chaos`")
    for item in items:
        if "chaos" in item.keywords:
            item.add_marker(skip)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server with chosen persistence that a test can kill -9, shut down and start again."""

    def __init__(self, data_dir: Path, appendfsync: str = "everysec"):
        self.data_dir, self.appendfsync = data_dir, appendfsync
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (Debian package: redis-server); the tests need a real Redis")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir), "--save", "",
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--maxmemory-policy", "noeviction",
             "--daemonize", "no", "--loglevel", "warning", "--logfile", str(self.data_dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except redis.exceptions.RedisError:  # includes BusyLoadingError while the AOF replays
                time.sleep(0.05)
        pytest.fail(f"redis-server did not answer on port {self.port} within 20 s")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def shutdown(self) -> None:
        """Clean stop: Redis flushes the AOF and exits (as `docker compose restart redis` does)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                redis.Redis(port=self.port, socket_timeout=5).shutdown()
            except redis.exceptions.ConnectionError:
                pass  # the server closes the connection as it exits
            self.proc.wait(timeout=20)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=10)


@dataclass
class Stack:
    """Redis + API + supervised workers for one test; `close()` stops everything it started."""

    root: Path
    release: Path
    redis: RedisServer
    api: ApiProcess | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    worker_env: dict[str, str] = field(default_factory=dict)

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def start_api(self, **env: str) -> ApiProcess:
        self.api = ApiProcess(service_env(self.redis.url, self.artifacts, **env), self.root / "api.log")
        self.api.start()
        return self.api

    def spawn_worker(self, name: str, **env: str) -> WorkerProcess:
        """Start `h3batch worker` (fast recovery settings) without waiting for it."""
        env = service_env(self.redis.url, self.artifacts, H3BATCH_RELEASE=str(self.release), H3BATCH_WORKER_NAME=name,
                          H3BATCH_HF_CACHE=str(self.release.parent / "hf-cache"), H3BATCH_DEVICE="cpu",
                          **{**FAST_RECOVERY, **self.worker_env, **env})
        log_path = self.root / f"{name}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(H3BATCH + ["worker"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        worker = WorkerProcess(proc, name, log_path)
        self.workers.append(worker)
        return worker

    def start_worker(self, name: str, **env: str) -> WorkerProcess:
        """Start a worker and return once it consumes (heartbeat READY or already BUSY with a job)."""
        worker = self.spawn_worker(name, **env)
        wait_consuming(self.redis.client(), worker)
        return worker

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("*.log")))

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        if self.api is not None:
            self.api.kill()
        self.redis.kill9()


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory) -> Path:
    """The tiny release, built once for this directory's tests."""
    root = tmp_path_factory.mktemp("rel-release")
    out = root / "tiny-release"
    done = subprocess.run(H3BATCH + ["build-tiny", "--out", str(out), "--hf-cache", str(root / "hf-cache")],
                          cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        pytest.fail(f"h3batch build-tiny failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return out


@pytest.fixture
def stack_factory(tmp_path, tiny_release):
    """make(appendfsync=...) → a Stack with its Redis started; everything is killed at teardown."""
    made: list[Stack] = []

    def make(appendfsync: str = "everysec") -> Stack:
        root = tmp_path / f"stack{len(made)}"
        server = RedisServer(root / "redis", appendfsync)
        server.start()
        stack = Stack(root=root, release=tiny_release, redis=server)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.close()


def wait_consuming(r: redis.Redis, worker: WorkerProcess, timeout_s: float = 300.0) -> None:
    """Block until the worker's heartbeat says READY or BUSY (its consumer is up); fail if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            pytest.fail(f"worker {worker.name} exited with {worker.proc.returncode}: {worker.log_text()[-3000:]}")
        try:
            beat = r.get(f"h3b:worker:{worker.name}")
        except redis.exceptions.RedisError:
            beat = None
        if beat and json.loads(beat).get("state") in ("READY", "BUSY"):
            return
        time.sleep(0.05)
    worker.kill()
    pytest.fail(f"worker {worker.name} not consuming within {timeout_s} s: {worker.log_text()[-3000:]}")


def post_job(base: str, headers: dict[str, str] | None = None, **body) -> dict:
    payload = {"prompt": "a kettle whistles in a rainy kitchen", **SMALL, **body}
    reply = requests.post(f"{base}/jobs", json=payload, headers=headers or {}, timeout=60)
    assert reply.status_code == 202, reply.text
    return reply.json()


def wait_all_finished(r: redis.Redis, job_ids: list[str], timeout_s: float, on_tick=None) -> dict[str, str]:
    """Poll the records until every job is finished (or the timeout); returns id → status."""
    deadline = time.monotonic() + timeout_s
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        with r.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(f"h3b:job:{job_id}", "status")
            statuses = dict(zip(job_ids, pipe.execute()))
        if all(s in FINISHED for s in statuses.values()):
            return statuses
        if on_tick is not None:
            on_tick()
        time.sleep(0.2)
    return statuses


def completed_events(r: redis.Redis, job_id: str) -> int:
    """How many `completed` transitions the job's event stream recorded."""
    return sum(1 for _, fields in r.xrange(f"h3b:events:{job_id}") if fields.get("event") == "completed")


KEY_A = "h3b-canary-key-alpha-7c1f0e9a2b"
KEY_B = "h3b-canary-key-beta-51d3aa60e4"
"""Bearer keys of the keyed stack; the secret-leak test greps every log for them and their SHA-256 digests."""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="session")
def keyed_stack(tmp_path_factory, tiny_release):
    """One Redis + API with two API keys and generous rate limits, no worker (jobs stay queued): the HTTP-only
    tests (bad input, idempotency, security, fuzzing) share it."""
    root = tmp_path_factory.mktemp("keyed")
    server = RedisServer(root / "redis")
    server.start()
    stack = Stack(root=root, release=tiny_release, redis=server)
    stack.start_api(H3BATCH_API_KEYS=f"{KEY_A},{KEY_B}", H3BATCH_RATE_CREATES_PER_MIN="100000",
                    H3BATCH_RATE_READS_PER_MIN="100000", H3BATCH_LOG_LEVEL="DEBUG")
    yield stack
    stack.close()
