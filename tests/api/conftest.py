"""Fixtures for the OpenAI-compatible view, events, webhooks, web UI and CLI client: a private redis-server, the
real API under gunicorn with two API keys and webhooks enabled, and one real `h3batch worker` on the tiny release.

Reuses tests/service_stack.py's process helpers; the Redis is this directory's own, so a worker started by another test
directory in the same session can never take (and, lacking the webhook secret, drop) these jobs.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
import requests

from tests.conftest import start_redis
from tests.service_stack import ApiProcess, service_env, start_worker, tiny_release  # noqa: F401  (fixture)

KEY_A = "compat-key-alpha-1"
KEY_B = "compat-key-bravo-2"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"h3batch-test-webhook-secret-32by").decode()
RETRY_BASE_S = 0.3
STEP_DELAY_S = 0.08
"""The worker sleeps this long at each progress report, so a tiny render lasts about a second and the event stream
has time to show it live."""


def key_id(key: str) -> str:
    """The owner id the API stores for a key (auth.key_id of its SHA-256)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def auth(key: str = KEY_A) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


WEBHOOK_ENV = {"H3BATCH_WEBHOOK_SECRET": WEBHOOK_SECRET, "H3BATCH_WEBHOOK_ALLOW_LOOPBACK": "1",
               "H3BATCH_WEBHOOK_RETRY_BASE_S": str(RETRY_BASE_S), "H3BATCH_WEBHOOK_MAX_ATTEMPTS": "4",
               "H3BATCH_WEBHOOK_TIMEOUT_S": "3"}


@pytest.fixture(scope="module")
def app_redis(tmp_path_factory) -> str:
    """A private redis-server per test module, for tests that drive the app in process (create_app's test client)
    against a real Redis, with no worker: the module's tests flush it as they need."""
    proc, url = start_redis(tmp_path_factory.mktemp("app-redis"))
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def compat_redis_url(tmp_path_factory) -> str:
    proc, url = start_redis(tmp_path_factory.mktemp("compat-redis"))
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def compat_artifacts(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compat-artifacts")


@pytest.fixture(scope="session")
def compat_api(compat_redis_url, compat_artifacts, tmp_path_factory) -> ApiProcess:
    """gunicorn API with keys A and B, webhooks signed with WEBHOOK_SECRET, 1 s SSE keep-alives, 3 streams max."""
    env = service_env(compat_redis_url, compat_artifacts, H3BATCH_API_KEYS=f"{KEY_A},{KEY_B}",
                      H3BATCH_SSE_KEEPALIVE_S="1", H3BATCH_SSE_MAX_STREAMS="3",
                      H3BATCH_RATE_READS_PER_MIN="100000", H3BATCH_RATE_CREATES_PER_MIN="1000", **WEBHOOK_ENV)
    server = ApiProcess(env, tmp_path_factory.mktemp("compat-api") / "api.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def compat_worker(compat_redis_url, compat_artifacts, tiny_release, tmp_path_factory):  # noqa: F811
    """One real worker on the tiny release, with the webhook dispatcher configured like the API."""
    process = start_worker(compat_redis_url, compat_artifacts, tiny_release, f"compat-worker-{os.getpid()}",
                           tmp_path_factory.mktemp("compat-worker") / "worker.log",
                           H3BATCH_DEBUG_STEP_DELAY_S=str(STEP_DELAY_S), **WEBHOOK_ENV)
    yield process
    process.stop()


@pytest.fixture
def stack(compat_api, compat_worker) -> ApiProcess:
    """The API with a READY worker behind it."""
    return compat_api


@pytest.fixture
def rc(compat_redis_url) -> redis.Redis:
    client = redis.Redis.from_url(compat_redis_url, decode_responses=True)
    yield client
    client.close()


def wait_job(base: str, job_id: str, statuses=("completed", "failed", "cancelled"), key: str = KEY_A,
             timeout_s: float = 600.0) -> dict:
    """GET /jobs/{id} until its status is one of `statuses`."""
    deadline = time.monotonic() + timeout_s
    job = None
    while time.monotonic() < deadline:
        job = requests.get(f"{base}/jobs/{job_id}", headers=auth(key), timeout=60).json()
        if job.get("status") in statuses:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {statuses}; last seen {job}")


class Receiver:
    """A real HTTP server on 127.0.0.1 recording webhook POSTs; answers the queued status codes, then 200."""

    def __init__(self):
        self.calls: list[dict] = []
        self.statuses: list[int] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.calls.append({"path": self.path, "headers": dict(self.headers.items()), "body": body,
                                           "at": time.time(), "answered": status})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_calls(self, n: int, timeout_s: float = 300.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.calls) >= n:
                    return list(self.calls)
            time.sleep(0.05)
        raise AssertionError(f"expected {n} webhook calls, got {len(self.calls)}: {self.calls}")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    rec = Receiver()
    yield rec
    rec.close()


def parse_sse(lines) -> list[dict]:
    """Events from an iterable of decoded SSE lines: [{event, data, id}] plus {"comment": text} for ':' lines."""
    out, current = [], {}
    for line in lines:
        if line.startswith(":"):
            out.append({"comment": line[1:].strip()})
            continue
        if line == "":
            if current:
                current["data"] = json.loads(current["data"])
                out.append(current)
            current = {}
            continue
        field, _, value = line.partition(": ")
        current[field] = value
    return out
