"""The service stack for tests in any room: the real API (gunicorn subprocess), one real Celery worker subprocess for
the session, and the tiny release built once per session with `h3batch build-tiny`. The process helpers are imported
by name (`from tests.service_stack import ApiProcess, start_worker`); the fixtures reach every folder through
tests/conftest.py and start nothing until a test asks for them.

Nothing is mocked: tests talk HTTP to the API, the API talks to the session's private redis-server, the worker
renders with the resident tiny pipeline and writes real MP4s.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import requests

REPO = Path(__file__).resolve().parents[1]
H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]

STEP_DELAY_S = 0.12
"""H3BATCH_DEBUG_STEP_DELAY_S of the session worker: each progress report sleeps this long, so a job runs for about
1.5 s longer and the cancel / restart tests can act mid-render deterministically."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(redis_url: str, artifacts: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3BATCH_")}
    env.update(H3BATCH_REDIS_URL=redis_url, H3BATCH_ARTIFACTS_DIR=str(artifacts), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1", H3BATCH_LOG_LEVEL="INFO")
    env.update(extra)
    return env


def wait_http(url: str, timeout_s: float = 300.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            if requests.get(url, timeout=1).status_code < 500:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


class ApiProcess:
    """`h3batch api` (gunicorn) on a fixed port; can be killed and started again on the same port."""

    def __init__(self, env: dict[str, str], log_path: Path, workers: int = 1):
        self.env = env
        self.workers = workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(H3BATCH + ["api", "--port", str(self.port), "--threads", "8",
                                              "--workers", str(self.workers)], env=self.env,
                                     cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(self.base + "/healthz", proc=self.proc)

    def kill(self) -> None:
        """SIGKILL the whole process group (gunicorn master and its workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="session")
def api(redis_url, artifacts_dir, tmp_path_factory) -> ApiProcess:
    """The job API behind gunicorn, open (no keys), on the session Redis."""
    server = ApiProcess(service_env(redis_url, artifacts_dir), tmp_path_factory.mktemp("api") / "api.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory) -> Path:
    """The tiny release, built once per session into a temp dir (base VAE cache beside it)."""
    root = tmp_path_factory.mktemp("release")
    out = root / "tiny-release"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(H3BATCH + ["build-tiny", "--out", str(out), "--hf-cache", str(root / "hf-cache")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"h3batch build-tiny failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return out


class WorkerProcess:
    """An `h3batch worker` subprocess in its own process group, with its log file."""

    def __init__(self, proc: subprocess.Popen, name: str, log_path: Path):
        self.proc, self.name, self.log_path = proc, name, log_path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the worker dies mid-whatever, as on an OOM kill or a pulled node."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_worker(redis_url: str, artifacts: Path, release: Path, name: str, log_path: Path,
                 **extra_env: str) -> WorkerProcess:
    """Start `h3batch worker` on the tiny release and return once its heartbeat says READY."""
    env = service_env(redis_url, artifacts, H3BATCH_RELEASE=str(release), H3BATCH_WORKER_NAME=name,
                      H3BATCH_HF_CACHE=str(release.parent / "hf-cache"), H3BATCH_DEVICE="cpu", **extra_env)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(H3BATCH + ["worker"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    worker = WorkerProcess(proc, name, log_path)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"worker exited with {proc.returncode}: {worker.log_text()[-3000:]}")
            beat = r.get(f"h3b:worker:{name}")
            if beat and json.loads(beat)["state"] == "READY":
                return worker
            time.sleep(0.2)
        worker.kill()
        pytest.fail(f"worker not READY within 300 s: {worker.log_text()[-3000:]}")
    finally:
        r.close()


@pytest.fixture(scope="session")
def worker(redis_url, artifacts_dir, tiny_release, tmp_path_factory) -> WorkerProcess:
    """One `h3batch worker` subprocess for the session, READY (heartbeat seen) before tests use it."""
    process = start_worker(redis_url, artifacts_dir, tiny_release, f"test-worker-{os.getpid()}",
                           tmp_path_factory.mktemp("worker") / "worker.log",
                           H3BATCH_DEBUG_STEP_DELAY_S=str(STEP_DELAY_S))
    yield process
    process.stop()


@pytest.fixture
def r(redis_url) -> redis.Redis:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def wait_batch(base: str, batch_id: str, headers: dict | None = None, timeout_s: float = 600.0) -> dict:
    """GET the batch until it has finished (`finished_at` set); returns that batch JSON."""
    deadline = time.monotonic() + timeout_s
    batch = None
    while time.monotonic() < deadline:
        batch = requests.get(f"{base}/batches/{batch_id}", headers=headers, timeout=60).json()
        if batch["finished_at"] is not None:
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not finish; last seen {batch}")


def poll_until(base: str, job_id: str, predicate, timeout_s: float = 600.0, interval_s: float = 0.05) -> dict:
    """GET the job until predicate(job) holds; returns that job JSON."""
    deadline = time.monotonic() + timeout_s
    job = None
    while time.monotonic() < deadline:
        reply = requests.get(f"{base}/jobs/{job_id}", timeout=60)
        assert reply.status_code == 200, reply.text
        job = reply.json()
        if predicate(job):
            return job
        time.sleep(interval_s)
    raise AssertionError(f"job {job_id} never satisfied the condition; last seen: {job}")
