"""Shared fixtures: a private real redis-server per test session, and tiny-size helpers.

Each room keeps its own fixtures in `tests/<room>/conftest.py`; only what several rooms need lives here.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tests_only_path() -> str:
    """A folder whose one entry is `tests`, a link to this suite, for the processes the tests start.

    The suite runs under `python -P` with pytest's importlib mode, so the checkout is on no sys.path and its
    top-level folders (`kernels/`, ...) cannot shadow installed distributions (docs/development.md). A child that
    must import a helper by name (a spawned rank running a function of a test module, Schemathesis loading its
    hooks) finds `tests.*` through this folder and nothing else of the checkout.
    """
    folder = Path(tempfile.mkdtemp(prefix="h3batch-tests-path-"))
    (folder / "tests").symlink_to(REPO / "tests", target_is_directory=True)
    return str(folder)


TESTS_PATH = _tests_only_path()
sys.path.append(TESTS_PATH)  # a spawned child starts from this process's sys.path
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [TESTS_PATH, os.environ.get("PYTHONPATH")]))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp_dir: Path, port: int | None = None, *, appendonly: bool = False) -> tuple[subprocess.Popen, str]:
    """Start a real redis-server on a free loopback port; returns (process, url). Caller terminates it."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (Debian package: redis-server); the tests need a real Redis")
    port = port or free_port()
    tmp_dir.mkdir(parents=True, exist_ok=True)
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_dir), "--save", "",
            "--appendonly", "yes" if appendonly else "no", "--daemonize", "no", "--loglevel", "warning"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail(f"redis-server did not answer on port {port} within 10 s")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """URL of a private redis-server for this test session (never the machine's shared one)."""
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    os.environ.setdefault("H3BATCH_TEST_REDIS_URL", url)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


SCRATCH_DB = 2
"""Database of the session Redis that tests writing keys directly may flush: no worker or API of the session uses it."""


@pytest.fixture
def scratch_redis(redis_url):
    """A client on the session Redis' scratch database, flushed before and after the test."""
    import redis  # noqa: PLC0415  (most test folders never need it)

    client = redis.Redis.from_url(f"{redis_url.rsplit('/', 1)[0]}/{SCRATCH_DB}", decode_responses=True)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


# The service stack (real API + worker processes) for every folder that needs it; its fixtures start nothing
# until a test asks for them.
from tests.service_stack import api, artifacts_dir, r, tiny_release, worker  # noqa: E402, F401
