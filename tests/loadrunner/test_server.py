"""Reference server (`DuplexServer`) in realtime mode (§2-§4, §15.2) over real WebSockets, and the driver's
lifecycle (§7) and load modes against it.
"""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.config import parse_config
from h3batch.loadrunner.lifecycle import run_lifecycle
from h3batch.loadrunner.load import run_load
from h3batch.loadrunner.protocol import session_update
from h3batch.loadrunner.server import DuplexServer
from h3batch.loadrunner.server_config import ServerConfig
from tests.loadrunner.harness import write_wav
from tests.loadrunner.realtime_client import recv_until


@pytest.fixture
def voiced_wav(tmp_path):
    """0.8 s of a 220 Hz tone at 0.3: audible when echoed."""
    t = np.arange(19200) / 24000
    return write_wav(tmp_path / "tone.wav", np.round(0.3 * np.sin(2 * np.pi * 220 * t) * 32767))

@pytest.fixture
def long_wav(tmp_path):
    """2 s (25 frames) of the same tone: enough packets for a 10-90 % stream-timing window."""
    t = np.arange(25 * 1920) / 24000
    return write_wav(tmp_path / "tone2s.wav", np.round(0.3 * np.sin(2 * np.pi * 220 * t) * 32767))

def test_capacity_envelope_and_slot_release():
    """A third open gets the exact resource_exhausted envelope; a close frees the slot before session.closed."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=2)) as server:
            url = server.url + "?duplex=1&model=m&autostart=0"
            a, b, c = [await connect(url) for _ in range(3)]
            for ws in (a, b):
                await ws.send(session_update("m", "NATF2.pt", "p"))
                created, seen = await recv_until(ws, "session.created")
            await c.send(session_update("m", "NATF2.pt", "p"))
            error, _ = await recv_until(c, "error")
            await a.send(json.dumps({"type": "session.close"}))
            closed, after = await recv_until(a, "session.closed")
            with pytest.raises(ConnectionClosed) as info:
                await a.recv()
            await c.send(session_update("m", "NATF2.pt", "p"))
            replacement, _ = await recv_until(c, "session.created")
            for ws in (b, c):
                await ws.close()
            return created, seen, error, closed, info.value, replacement

    created, seen, error, closed, close_exc, replacement = asyncio.run(scenario())
    assert error["error"] == {"type": "rate_limit_error", "code": "resource_exhausted",
                              "message": "duplex_session_capacity_exhausted: limit=2", "retryable": True}
    assert error["event_id"].startswith("event_") and len(error["event_id"]) == 6 + 32
    assert "server_event_seq" not in created and created["session"]["id"].startswith("duplex-")
    assert created["session"]["capabilities"]["supports_multi_session_same_replica"] is True
    assert closed["reason"] == "client_close" and closed["event"] == {"type": "session.closed",
                                                                      "reason": "client_close"}
    assert close_exc.rcvd.code == 1000 and close_exc.rcvd.reason == "client_close"
    assert replacement["session"]["id"] != created["session"]["id"]

def test_idle_session_expires():
    """A session without client messages for the idle TTL gets session.expired, close 1000 and frees its slot."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1, idle_timeout_s=0.3)) as server:
            async with connect(server.url + "?duplex=1&model=m&autostart=0") as ws:
                await ws.send(session_update("m", "NATF2.pt", "p"))
                expired, _ = await recv_until(ws, "session.expired")
                with pytest.raises(ConnectionClosed) as info:
                    await ws.recv()
            return expired, info.value, server.admission.held

    expired, closed, held = asyncio.run(scenario())
    assert expired["reason"] == "idle_ttl_expired" and expired["session_id"].startswith("duplex-")
    assert closed.rcvd.code == 1000 and held == 0

def test_lifecycle_against_realtime_server(voiced_wav, tmp_path):
    """Lifecycle mode passes on a 2-slot realtime server: N+1 refused, slot recycled, replacement fresh."""
    config = parse_config(["--model", "m", "--input-wav", str(voiced_wav), "--output-dir", str(tmp_path / "life"),
                           "--tail-s", "0.16", "--drain-s", "0.3", "--timeout-s", "5", "--url", "PLACEHOLDER"])

    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=2)) as server:
            from dataclasses import replace
            return await run_lifecycle(replace(config, url=server.url))

    result = asyncio.run(scenario())
    assert result["ok"] is True and result["overflow_error_code"] == "resource_exhausted"
    ids = {result[r]["session_id"] for r in ("primary", "secondary", "replacement")}
    assert len(ids) == 3
    assert result["secondary"]["input_frames"] == 2 * result["primary"]["input_frames"]
    assert result["secondary"]["continuation_frames_after_recycle"] == result["primary"]["input_frames"]
    for name in ("result.json", "primary-events.jsonl", "primary-output.wav", "secondary-output.wav",
                 "replacement-output.wav"):
        assert (tmp_path / "life" / name).exists()

def load_against(server_config: ServerConfig, wav, out, sessions: int, frames: int, *extra: str) -> dict:
    async def scenario():
        async with DuplexServer(server_config) as server:
            config = parse_config(["--url", server.url, "--model", "m", "--input-wav", str(wav), "--output-dir",
                                   str(out), "--sessions", str(sessions), "--load-frames", str(frames),
                                   "--tail-s", "0", "--drain-s", "0.3", "--timeout-s", "5", *extra])
            return await run_load(config)
    return asyncio.run(scenario())

def test_realtime_load_passes_and_tracks_real_time(long_wav, tmp_path):
    """Paced load against realtime echo: every session passes with no deficit and stream RTF near 1."""
    report = load_against(ServerConfig(max_sessions=4), long_wav, tmp_path / "o", 3, 25)
    assert report["ok"] is True, [r["error"] for r in report["sessions"]]
    for row in report["sessions"]:
        assert row["frame_deficit"] == 0 and row["client_first_text_after_stream_start_ms"] is not None
        assert row["server_stream_rtf"] is not None and abs(row["server_stream_rtf"] - 1.0) < 0.15, row[
            "server_stream_rtf"]

def test_one_slot_server_fails_load_admission(voiced_wav, tmp_path):
    """With max_sessions 1 the multi-session flags are false, so even --sessions 1 fails admission."""
    report = load_against(ServerConfig(max_sessions=1), voiced_wav, tmp_path / "o", 1, 3)
    assert report["sessions"][0]["error"] == "admission: AssertionError"

def test_frame_cost_shows_the_knee(long_wav, tmp_path):
    """Two sessions at 60 ms per frame on one serial worker exceed real time: stream RTF above 1."""
    report = load_against(ServerConfig(max_sessions=2, frame_cost_ms=60), long_wav, tmp_path / "o", 2, 25,
                          "--drain-s", "1.0")
    rtfs = [row["server_stream_rtf"] for row in report["sessions"]]
    assert all(r is not None and r > 1.2 for r in rtfs), rtfs
