"""One driver WebSocket (spec §5.1, §5.2): a reader task that records JSON objects with receive times.

The event log itself is plain data (`EventLog`); this module only moves frames from the socket into it and offers
bounded waits. Nothing here decides pass/fail.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.protocol import MAX_MESSAGE_BYTES

POLL_INTERVAL_S = 0.020
CLIENT_TIME_KEY = "_client_received_at_s"


@dataclass
class EventLog:
    """Received objects (shallow copies) and, in a parallel list, their client receive times."""

    events: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    # Per-type counts kept as events arrive: the connection check runs before every send, so it must not rescan.
    counts: Counter = field(default_factory=Counter)

    def add(self, event: dict, received_at: float) -> None:
        copy = dict(event)
        copy.setdefault(CLIENT_TIME_KEY, received_at)  # informational only; metrics read `times`
        self.events.append(copy)
        self.times.append(received_at)
        kind = event.get("type")
        if isinstance(kind, str):
            self.counts[kind] += 1

    def count(self, event_type: str) -> int:
        return self.counts[event_type]

    def errors(self) -> list[dict]:
        return [e for e in self.events if e.get("type") == "error"]

    def first(self, event_type: str) -> dict | None:
        return next((e for e in self.events if e.get("type") == event_type), None)


def open_connection(url: str, close_timeout: float, open_timeout: float):
    """websockets client connect with the driver's limits.

    Compression is off: base64 float audio deflates poorly and the CPU it costs lands in the pacing loop.
    """
    return connect(url, max_size=MAX_MESSAGE_BYTES, close_timeout=close_timeout, open_timeout=open_timeout,
                   compression=None)


class DuplexConnection:
    """A connected socket plus its reader task; `close()` is bounded and idempotent."""

    def __init__(self, websocket: ClientConnection, logger: logging.Logger):
        self.websocket = websocket
        self.log = EventLog()
        self.logger = logger
        self.reader_error: BaseException | None = None
        self._reader = asyncio.create_task(self._read(), name="duplex-reader")
        self._closed = False

    async def _read(self) -> None:
        try:
            async for message in self.websocket:
                if isinstance(message, bytes):
                    continue
                event = json.loads(message)
                if isinstance(event, dict):
                    self.log.add(event, time.monotonic())
        except ConnectionClosed:
            return
        except Exception as exc:  # held for load mode to re-raise at its next connection check
            self.reader_error = exc
            self.logger.debug("reader stopped: %s", type(exc).__name__)

    @property
    def reader_done(self) -> bool:
        return self._reader.done()

    async def send(self, message: str | bytes, timeout: float) -> None:
        """Send one text frame within `timeout`; `bytes` must already be UTF-8 JSON (sent as text, not binary)."""
        async with asyncio.timeout(timeout):
            await self.websocket.send(message, text=True)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, label: str) -> None:
        """Poll `predicate` every 20 ms until true; TimeoutError("Timed out waiting for <label>") at the deadline."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Timed out waiting for {label}")
            await asyncio.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))

    async def close(self, timeout: float) -> None:
        """Close the socket within `timeout` (errors logged), then always cancel and await the reader."""
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(timeout):
                await self.websocket.close()
        except (TimeoutError, OSError, ConnectionClosed) as exc:
            self.logger.debug("websocket close ended with %s", type(exc).__name__)
        finally:
            if self.websocket.transport is not None and not self.websocket.transport.is_closing():
                self.websocket.transport.abort()
            self._reader.cancel()
            await asyncio.wait([self._reader])  # never raises the reader's own cancellation
