"""Fixtures for h3batch.client: the live stack of tests/api (a private redis-server, the API under gunicorn with two
keys, one real worker on the tiny release), and `front`, a real HTTP server on 127.0.0.1 in front of that API that
answers each request by a script (pass it on, lose the answer after the API handled it, or refuse with 429 and a
Retry-After), so the client's retries are tested against what a flaky network or a busy server really does.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from tests.api.conftest import (KEY_A, compat_api, compat_artifacts, compat_redis_url, rc,  # noqa: F401  (fixtures)
                                compat_worker, stack)
from tests.service_stack import tiny_release  # noqa: F401  (fixture)

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


class ScriptedFront:
    """Forwards to `upstream`; each request takes the next action of `script` (then "pass" once it is empty):
    "pass" relays the answer, "drop" forwards the request and closes the connection without an answer (the job
    exists, the client never hears), "429" answers rate_limited with `Retry-After: 1` without forwarding.
    `seen` records (monotonic time, method, path, Idempotency-Key) of every request."""

    def __init__(self, upstream: str):
        self.upstream, self.script, self.seen = upstream, [], []
        self.lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with front.lock:
                    action = front.script.pop(0) if front.script else "pass"
                    front.seen.append((time.monotonic(), self.command, self.path,
                                       self.headers.get("Idempotency-Key")))
                if action == "429":
                    payload = json.dumps({"error": {"code": "rate_limited", "message": "slow down",
                                                    "retryable": True}}).encode()
                    self.send_response(429)
                    self.send_header("Retry-After", "1")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                answer = requests.request(self.command, front.upstream + self.path, headers=headers, data=body,
                                          timeout=120)
                if action == "drop":
                    self.close_connection = True
                    return
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = _handle  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def front(compat_api):  # noqa: F811
    proxy = ScriptedFront(compat_api.base)
    yield proxy
    proxy.close()


@pytest.fixture
def api_env(stack, monkeypatch):  # noqa: F811
    """H3BATCH_API_URL / H3BATCH_API_KEY of the live stack, as a user's shell would have them."""
    monkeypatch.setenv("H3BATCH_API_URL", stack.base)
    monkeypatch.setenv("H3BATCH_API_KEY", KEY_A)
    return stack
