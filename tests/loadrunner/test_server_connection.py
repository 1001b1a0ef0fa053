"""Reference server, one realtime WebSocket (`server_connection`, spec §2-§4, §15.2): first-message rules, open
validation, later updates, input backpressure, idle limits, resume and transport errors, over real WebSockets.
"""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect

from h3batch.loadrunner.protocol import session_update
from h3batch.loadrunner.server import DuplexServer
from h3batch.loadrunner.server_config import ServerConfig
from h3batch.loadrunner.server_protocol import DEFAULT_PERSONA, MAX_PENDING_INPUT_BYTES, SERVER_OWNED_KEYS
from tests.loadrunner.realtime_client import QUERY, append, close_frame, open_session, recv_until, update, wait_for


def test_first_message_rules():
    """autostart=0 requires session.update first; silence gets config_timeout, bad voices and owned keys refused."""
    async def scenario():
        async with DuplexServer(ServerConfig(first_message_timeout_s=0.2)) as server:
            url = server.url + "?duplex=1&model=m&autostart=0"
            async with connect(url) as ws:
                timeout, _ = await recv_until(ws, "error")
            async with connect(url) as ws:
                await ws.send("not json")
                bad_json, _ = await recv_until(ws, "error")
            async with connect(url) as ws:
                await ws.send(session_update("m", "../NATF2.pt", "p"))
                voice, _ = await recv_until(ws, "error")
                update = json.loads(session_update("m", "NATF2.pt", "p"))
                update["session"]["extra_body"]["personaplex_model_path"] = "/x"
                await ws.send(json.dumps(update))
                owned, _ = await recv_until(ws, "error")
            return timeout, bad_json, voice, owned, server.admission.held

    timeout, bad_json, voice, owned, held = asyncio.run(scenario())
    assert timeout["error"]["code"] == "config_timeout" and bad_json["error"]["code"] == "invalid_json"
    assert voice["error"]["code"] == "invalid_voice" and owned["error"]["code"] == "invalid_session_config"
    assert held == 0

def test_open_validation_voice_owned_keys_and_default_persona():
    """§3.3: non-bundled or path-like voices get `invalid_voice`, each server-owned extra_body key is refused, no
    refused open keeps a slot, and empty instructions open with the default persona and voice."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1)) as server:
            url = server.url + QUERY
            codes = []
            async with connect(url) as ws:
                for voice in ("../NATF2.pt", "voices/NATF2.pt", "NATF9.pt", 5):
                    await ws.send(update(voice=voice))
                    codes.append((await recv_until(ws, "error"))[0]["error"]["code"])
                for key in sorted(SERVER_OWNED_KEYS):
                    await ws.send(update(extra_body={"auto_response": True, key: "x"}))
                    error = (await recv_until(ws, "error"))[0]["error"]
                    codes.append(error["code"] if key in error["message"] else "key not named")
            held = server.admission.held
            ws, created = await open_session(url, instructions="")
            await ws.close()
            return codes, held, created

    codes, held, created = asyncio.run(scenario())
    assert codes == ["invalid_voice"] * 4 + ["invalid_session_config"] * len(SERVER_OWNED_KEYS)
    assert held == 0
    assert created["type"] == "session.created" and created["session"]["instructions"] == DEFAULT_PERSONA

def test_default_voice_when_omitted():
    """§2/§3.3: an open without `voice` gets NATF2.pt and one with empty instructions the default persona."""
    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            ws = await connect(server.url + QUERY)
            await ws.send(json.dumps({"type": "session.update", "session": {"model": "m", "instructions": ""}}))
            created, _ = await recv_until(ws, "session.created", "error")
            await ws.close()
            return created

    created = asyncio.run(scenario())
    assert created["session"]["voice"] == "NATF2.pt" and created["session"]["instructions"] == DEFAULT_PERSONA

def test_later_voice_and_persona_changes_are_refused():
    """§3.3: after open, a voice change gets `voice_update_unsupported`, a persona change
    `persona_update_unsupported`, an owned key `invalid_session_config`; repeating the same values is accepted."""
    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            ws, _ = await open_session(server.url + QUERY, voice="VARM1.pt", instructions="P")
            codes = []
            for change in ({"voice": "NATM0.pt", "instructions": "P"}, {"voice": "VARM1.pt", "instructions": "Q"},
                           {"voice": "VARM1.pt", "instructions": "P",
                            "extra_body": {"personaplex_voice_prompt": "x"}}):
                await ws.send(update(event_id="evt-u", **change))
                error, _ = await recv_until(ws, "error")
                codes.append((error["error"]["code"], error["error"]["event_id"]))
            await ws.send(update(voice="VARM1.pt", instructions="P"))
            same, _ = await recv_until(ws, "session.updated", "error")
            await ws.close()
            return codes, same

    codes, same = asyncio.run(scenario())
    assert codes == [("voice_update_unsupported", "evt-u"), ("persona_update_unsupported", "evt-u"),
                     ("invalid_session_config", "evt-u")]
    assert same["type"] == "session.updated" and same["session"]["voice"] == "VARM1.pt"

def test_input_backpressure_reserves_wire_size():
    """§3.5: appends reserve their wire size against the pending-input limit; the append that would exceed it gets
    retryable `input_backpressure` and is not counted, and the reservation frees as frames are produced."""
    one_frame = append(np.full(1920, 0.1), event_id="evt-a")
    config = ServerConfig(max_pending_input_bytes=2 * len(one_frame) + 10, processing_delay_ms=400)

    async def scenario():
        async with DuplexServer(config) as server:
            ws, _ = await open_session(server.url + QUERY)
            for _ in range(3):
                await ws.send(one_frame)
            refused, _ = await recv_until(ws, "error")
            frames_when_refused = server.connections[0].frames
            await wait_for(lambda: server.sessions and next(iter(server.sessions.values())).pending_input_bytes == 0)
            await ws.send(one_frame)
            await wait_for(lambda: server.connections[0].frames == 3)
            await ws.close()
            return refused, frames_when_refused

    refused, frames = asyncio.run(scenario())
    assert refused["error"] == {"type": "rate_limit_error", "code": "input_backpressure", "retryable": True,
                                "message": refused["error"]["message"], "event_id": "evt-a"}
    assert frames == 2
    assert ServerConfig().max_pending_input_bytes == MAX_PENDING_INPUT_BYTES == 16 * 2**20

def test_session_idle_timeout_overrides_the_transport_limit():
    """§2: a session's own `idle_timeout_s` > 0 replaces the server's 300 s transport idle limit."""
    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            ws, _ = await open_session(server.url + QUERY, idle_timeout_s=0.2)
            expired, _ = await recv_until(ws, "session.expired", timeout=2.0)
            return expired

    assert asyncio.run(scenario())["reason"] == "idle_ttl_expired"

def test_session_resume_is_unsupported():
    """§4.1: `session.resume` (first message with `resume=1`) gets `unsupported_session_resume`, holds no slot, and a
    following `session.update` still opens."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1)) as server:
            ws = await connect(server.url + "?duplex=1&model=m&resume=1")
            await ws.send(json.dumps({"type": "session.resume", "event_id": "evt-r", "session_id": "duplex-x",
                                      "resume_token": "t", "last_received_server_event_seq": 3}))
            error, _ = await recv_until(ws, "error")
            held = server.admission.held
            await ws.send(update())
            created, _ = await recv_until(ws, "session.created", "error")
            await ws.close()
            return error, held, created

    error, held, created = asyncio.run(scenario())
    assert error["error"]["code"] == "unsupported_session_resume" and error["error"]["event_id"] == "evt-r"
    assert held == 0 and created["type"] == "session.created"

def test_paths_and_transport_errors():
    """§2/§15.2: `/v1/duplex` and `/v1/realtime?duplex=1` are served, `duplex=0` is refused at the handshake; a
    non-object first message gets `bad_event` and a close, a frame over 15 MiB `event_too_large` with the connection
    kept, and heartbeats, bad event acks and unknown types get their answers."""
    from websockets.exceptions import InvalidStatus

    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            base = f"ws://127.0.0.1:{server.port}"
            with pytest.raises(InvalidStatus) as refused:
                await connect(base + "/v1/realtime?duplex=0&model=m&autostart=0")
            async with connect(base + "/v1/realtime?model=m&autostart=0") as ws:
                await ws.send("[1, 2]")
                bad_event, _ = await recv_until(ws, "error")
                bad_event_close = await close_frame(ws)
            ws, created = await open_session(base + "/v1/duplex?model=m&autostart=0")
            await ws.send(json.dumps({"type": "session.heartbeat", "pad": "x" * (15 * 2**20)}))
            too_large, _ = await recv_until(ws, "error")
            answers = []
            for event in ({"type": "session.heartbeat"}, {"type": "session.event_ack", "server_event_seq": 10**6},
                          {"type": "no.such.event", "event_id": "evt-n"}):
                await ws.send(json.dumps(event))
                answers.append((await recv_until(ws, "session.heartbeat_ack", "error"))[0])
            await ws.close()
            return refused.value.response.status_code, bad_event, bad_event_close, created, too_large, answers

    status, bad_event, bad_close, created, too_large, answers = asyncio.run(scenario())
    assert status == 404 and bad_event["error"]["code"] == "bad_event" and bad_close[0] == 1000
    assert created["type"] == "session.created" and too_large["error"]["code"] == "event_too_large"
    assert answers[0]["type"] == "session.heartbeat_ack"
    assert answers[1]["error"]["code"] == "invalid_event_ack"
    assert answers[2]["error"]["code"] == "unknown_event" and answers[2]["error"]["event_id"] == "evt-n"
