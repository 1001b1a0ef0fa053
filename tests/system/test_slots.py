"""Long-poll waits and SSE streams never starve the API (P5 item 3), and a stream whose Redis goes away ends with a
structured event (P5 item 4), against a real redis-server and the real API under gunicorn.

Waits and streams are raw loopback sockets, so a test can hang up exactly when it wants and watch the slot come
back. No worker runs: jobs stay queued, so every wait and stream stays open until its client leaves.
"""
from __future__ import annotations

import json
import socket
import statistics
import time

import pytest
import requests

from tests.service_stack import H3BATCH, REPO, ApiProcess, service_env
from tests.system.conftest import SMALL, RedisServer

KEYS = ("slots-key-alpha-0001", "slots-key-bravo-0002", "slots-key-charlie-03")
LATENCY_BUDGET_MS = 100.0


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class ThreadedApi(ApiProcess):
    """`h3batch api` with the thread count it runs by default (64; the shared fixture pins 8)."""

    def __init__(self, env: dict[str, str], log_path, threads: int | None = None):
        super().__init__(env, log_path)
        self.threads = threads

    def start(self) -> None:
        import subprocess  # noqa: PLC0415

        from tests.service_stack import wait_http  # noqa: PLC0415

        args = H3BATCH + ["api", "--port", str(self.port)]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(args, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_http(self.base + "/healthz", proc=self.proc)


@pytest.fixture
def slot_stack(tmp_path):
    """A private Redis and the API on it with three keys and its default thread count and slot settings."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    api = ThreadedApi(service_env(server.url, tmp_path / "artifacts", H3BATCH_API_KEYS=",".join(KEYS),
                                  H3BATCH_RATE_READS_PER_MIN="0", H3BATCH_RATE_CREATES_PER_MIN="0",
                                  H3BATCH_SSE_KEEPALIVE_S="1"), tmp_path / "api.log")
    api.start()
    yield server, api
    api.kill()
    server.kill9()


def _job(api: ApiProcess, key: str) -> str:
    reply = requests.post(f"{api.base}/jobs", json={"prompt": "a held wait", **SMALL}, headers=_bearer(key), timeout=30)
    assert reply.status_code == 202, reply.text
    return reply.json()["id"]


def _open(api: ApiProcess, path: str, key: str, extra: str = "") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", api.port), timeout=30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n{extra}\r\n".encode())
    return sock


def _status_line(sock: socket.socket) -> int:
    """Read until the end of the response head; the status code."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection before answering"
        data += chunk
    return int(data.split(b" ", 2)[1])


def _latencies_ms(api: ApiProcess, path: str, n: int = 20) -> list[float]:
    out = []
    with requests.Session() as session:
        for _ in range(n):
            started = time.perf_counter()
            reply = session.get(api.base + path, timeout=60)
            out.append((time.perf_counter() - started) * 1000)
            assert reply.status_code in (200, 503), reply.text  # /readyz is 503 here: no worker, by design
            assert reply.headers["Content-Type"].startswith("application/json")
    return out


def _wait_skipped(api: ApiProcess, job_id: str, key: str) -> bool:
    """A 1 s wait: True when it was answered at once because no wait slot was free."""
    started = time.monotonic()
    reply = requests.get(f"{api.base}/jobs/{job_id}", params={"wait": "1"}, headers=_bearer(key), timeout=30)
    assert reply.status_code == 200, reply.text
    skipped = "h3batch-wait" in reply.headers
    # A held wait blocks its whole second (a lower bound: load only lengthens it); a skipped one says so in its header.
    assert skipped or time.monotonic() - started >= 0.9, "a held wait blocks"
    return skipped


def _until(predicate, timeout_s: float = 60.0) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, "condition never held"
        time.sleep(0.05)
    return time.monotonic() - started


def test_32_waits_and_16_streams_leave_health_fast_and_free_their_slots_on_hang_up(slot_stack, capsys):
    """With every default slot taken (16 waits and 8 streams for each of two keys = 32 waits, 16 streams):
    /healthz and /readyz answer within 100 ms (95th percentile of 20 each); one more wait answers the current state
    at once (per key and per process), one more stream is 503 too_many_streams; when the clients hang up the slots
    come back within a second or two."""
    _, api = slot_stack
    a, b, c = KEYS
    jobs = {key: _job(api, key) for key in KEYS}
    held: list[socket.socket] = []
    try:
        for key in (a, b):
            for _ in range(16):
                held.append(_open(api, f"/jobs/{jobs[key]}?wait=60", key))
            for _ in range(8):
                sock = _open(api, f"/jobs/{jobs[key]}/events", key)
                assert _status_line(sock) == 200
                held.append(sock)
        time.sleep(1.0)  # the 32 waits are now blocked in their threads (they have no reply to read yet)

        assert _wait_skipped(api, jobs[a], a), "key a holds 16 waits: a 17th must not block"
        assert _wait_skipped(api, jobs[c], c), "the process holds 32 waits: a key with none must not block either"
        for key in (a, c):
            refused = requests.get(f"{api.base}/jobs/{jobs[key]}/events", headers=_bearer(key), timeout=60)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_streams"

        health, ready = _latencies_ms(api, "/healthz"), _latencies_ms(api, "/readyz")
        figures = {"open_waits": 32, "open_streams": 16,
                   "healthz_ms": {"median": round(statistics.median(health), 1),
                                  "p95": round(sorted(health)[18], 1), "max": round(max(health), 1)},
                   "readyz_ms": {"median": round(statistics.median(ready), 1),
                                 "p95": round(sorted(ready)[18], 1), "max": round(max(ready), 1)}}

        hung_up = time.monotonic()
        for sock in held:
            sock.close()
        held.clear()
        figures["wait_slot_back_s"] = round(_until(lambda: not _wait_skipped(api, jobs[c], c)), 2)
        figures["stream_slots_back_s"] = round(time.monotonic() - hung_up, 2)
        for _ in range(8):  # all of key a's stream slots are free again
            sock = _open(api, f"/jobs/{jobs[a]}/events", a)
            assert _status_line(sock) == 200
            held.append(sock)
        figures["all_back_after_hang_up_s"] = round(time.monotonic() - hung_up, 2)
        with capsys.disabled():
            print("\nRELIABILITY slots " + json.dumps(figures))
        assert figures["healthz_ms"]["p95"] < LATENCY_BUDGET_MS and figures["readyz_ms"]["p95"] < LATENCY_BUDGET_MS
        assert figures["all_back_after_hang_up_s"] < 5.0
    finally:
        for sock in held:
            sock.close()
    assert "Traceback" not in api.log_path.read_text(errors="replace")


def test_redis_lost_mid_stream_ends_with_a_structured_error_event(slot_stack):
    """Redis killed while an event stream is open: the stream ends with `event: error` carrying the envelope
    (storage_unavailable, retryable) and a `retry:` hint; the API logs one line, no traceback, and stays up."""
    server, api = slot_stack
    key = KEYS[0]
    job_id = _job(api, key)
    log_start = api.log_path.stat().st_size
    with requests.get(f"{api.base}/jobs/{job_id}/events", headers=_bearer(key), stream=True, timeout=30) as reply:
        assert reply.status_code == 200
        lines = reply.iter_lines(decode_unicode=True)
        assert next(lines).startswith("id: ")
        server.kill9()
        rest = list(lines)  # ends when the server ends the stream
    assert "event: error" in rest and "retry: 5000" in rest, rest
    after_error = rest[rest.index("event: error"):]
    data = json.loads(next(line for line in after_error if line.startswith("data: "))[len("data: "):])
    assert data["error"]["code"] == "storage_unavailable" and data["error"]["retryable"] is True
    assert requests.get(f"{api.base}/healthz", timeout=60).status_code == 200
    log = api.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "event stream ended: redis unavailable" in log and "Traceback" not in log, log[-3000:]


def test_slot_budget_leaves_a_quarter_of_the_threads_to_plain_requests():
    """The bounds follow the thread count: 64 threads give the configured 32 waits and 16 streams; the 8 threads the
    shared test fixtures run give 3 and 3; a single thread gives none (every wait answers at once)."""
    from h3batch.api.slots import SlotBudget, SlotPool, slot_budget  # noqa: PLC0415

    assert slot_budget(64, 32, 16, 16, 8) == SlotBudget(threads=64, waits=32, waits_per_key=16, streams=16,
                                                        streams_per_key=8)
    assert (slot_budget(8, 32, 16, 16, 8).waits, slot_budget(8, 32, 16, 16, 8).streams) == (3, 3)
    assert (slot_budget(1, 32, 16, 16, 8).waits, slot_budget(1, 32, 16, 16, 8).streams) == (0, 0)
    for threads in range(1, 200):
        budget = slot_budget(threads, 10**6, 10**6, 10**6, 10**6)
        assert budget.waits + budget.streams <= threads - max(2, threads // 4) or budget.waits + budget.streams == 0
    pool = SlotPool(per_process=3, per_key=2)
    assert [pool.try_take("a"), pool.try_take("a"), pool.try_take("a"), pool.try_take("b"), pool.try_take("c")] == [
        True, True, False, True, False]
    pool.release("a")
    assert pool.try_take("c") and pool.in_use() == 3 and pool.in_use("a") == 1
