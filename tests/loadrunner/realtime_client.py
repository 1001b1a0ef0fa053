"""A minimal realtime client for the reference-server tests: event builders and bounded waits on a real WebSocket.

Imported by name (`from tests.loadrunner.realtime_client import ...`); every wait scales by `harness.TIME_SCALE`.
"""
from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.loadrunner.harness import TIME_SCALE

QUERY = "?duplex=1&model=m&autostart=0"
HEX32 = "[0-9a-f]{32}"


def update(event_id: str | None = None, **session) -> str:
    event = {"type": "session.update", "session": {"model": "m", "voice": "NATF2.pt", "instructions": "p",
                                                   "extra_body": {"auto_response": True}, **session}}
    if event_id is not None:
        event["event_id"] = event_id
    return json.dumps(event)

def append(samples: np.ndarray, event_id: str | None = None) -> str:
    event = {"type": "input_audio_buffer.append", "audio": base64.b64encode(samples.astype("<f4").tobytes()).decode(),
             "format": "pcm_f32le", "sample_rate_hz": 24000}
    if event_id is not None:
        event["event_id"] = event_id
    return json.dumps(event)

async def recv_until(ws, *types: str, timeout: float = 3.0) -> tuple[dict, list[dict]]:
    """Events up to and including the first whose type is one of `types`."""
    seen = []
    async with asyncio.timeout(timeout * TIME_SCALE):
        while True:
            event = json.loads(await ws.recv())
            seen.append(event)
            if event["type"] in types:
                return event, seen

async def open_session(url: str, **session):
    ws = await connect(url)
    await ws.send(update(**session))
    created, _ = await recv_until(ws, "session.created", "error")
    return ws, created

async def close_frame(ws) -> tuple[int, str]:
    """Drain until the server closes; returns the received close code and reason."""
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(3 * TIME_SCALE):
            while True:
                await ws.recv()
    return info.value.rcvd.code, info.value.rcvd.reason

async def wait_for(predicate, timeout: float = 3.0) -> float:
    """Poll `predicate` until true; returns the loop time it became true (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout * TIME_SCALE
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
    return loop.time()
