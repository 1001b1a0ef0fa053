"""Slots for requests that hold a server thread for a long time: long-poll waits (`?wait=N`, `Prefer: wait=N`) and
SSE event streams. Each kind has a per-process and a per-key bound, and the two bounds together leave a quarter of
the process's threads for plain requests, so /healthz, /readyz and short reads always find a free thread.

`SlotPool` does the counting; `slot_budget` turns the configured maxima and the thread count of one API process into
the bounds it enforces; `client_gone` tells a waiting view that its client has hung up, so the slot is freed at once
rather than when the wait or the stream would have ended.
"""
from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any


class SlotPool:
    """At most `per_process` holders at once, and at most `per_key` of them for any one key. Thread-safe."""

    def __init__(self, per_process: int, per_key: int):
        self.per_process, self.per_key = per_process, per_key
        self._lock = threading.Lock()
        self._total = 0
        self._by_key: dict[str, int] = {}

    def try_take(self, key: str) -> bool:
        """Take a slot for `key` if both bounds allow it; never blocks."""
        with self._lock:
            held = self._by_key.get(key, 0)
            if self._total >= self.per_process or held >= self.per_key:
                return False
            self._total += 1
            self._by_key[key] = held + 1
            return True

    def release(self, key: str) -> None:
        with self._lock:
            held = self._by_key.get(key, 0)
            if held <= 0:
                return
            self._total -= 1
            if held == 1:
                del self._by_key[key]
            else:
                self._by_key[key] = held - 1

    def in_use(self, key: str | None = None) -> int:
        """Slots held in this process, or by `key`."""
        with self._lock:
            return self._total if key is None else self._by_key.get(key, 0)


@dataclass(frozen=True)
class SlotBudget:
    """The bounds one API process enforces."""

    threads: int
    waits: int
    waits_per_key: int
    streams: int
    streams_per_key: int


def slot_budget(threads: int, max_waits: int, max_waits_per_key: int, max_streams: int,
                max_streams_per_key: int) -> SlotBudget:
    """Bounds for a process of `threads` request threads: a quarter (at least 2) stay free for plain requests; of
    the rest, streams may take half and waits what streams leave, each capped at its configured maximum.

    64 threads (the default) give the configured 32 waits and 16 streams; 8 threads give 3 streams and 3 waits."""
    threads = max(1, threads)
    available = max(0, threads - max(2, threads // 4))
    streams = min(max_streams, available // 2)
    waits = min(max_waits, available - streams)
    return SlotBudget(threads, waits, min(max_waits_per_key, waits), streams, min(max_streams_per_key, streams))


def client_gone(environ: dict[str, Any]) -> bool:
    """True once the client closed its connection (EOF or reset on the request's socket). The WSGI servers h3batch
    runs under expose the socket: gunicorn as `gunicorn.socket`, werkzeug's dev server as `werkzeug.socket`; under
    any other server this cannot tell and says False."""
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if not isinstance(sock, socket.socket):
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: still connected
    except OSError:
        return True  # reset, or the socket is already closed


WAITS_KEY = "h3batch.wait_slots"
STREAMS_KEY = "h3batch.sse_slots"


def init_slots(app) -> SlotBudget:
    """Build this process's wait and stream pools from app config (API_THREADS, WAIT_MAX, WAIT_MAX_PER_KEY,
    SSE_MAX_STREAMS, SSE_MAX_STREAMS_PER_KEY) and keep them, and the budget, on the app."""
    config = app.config
    budget = slot_budget(int(config["API_THREADS"]), int(config["WAIT_MAX"]), int(config["WAIT_MAX_PER_KEY"]),
                         int(config["SSE_MAX_STREAMS"]), int(config["SSE_MAX_STREAMS_PER_KEY"]))
    app.extensions[WAITS_KEY] = SlotPool(budget.waits, budget.waits_per_key)
    app.extensions[STREAMS_KEY] = SlotPool(budget.streams, budget.streams_per_key)
    app.extensions["h3batch.slot_budget"] = budget
    return budget
