"""Reference server session lifecycle (`DuplexServer`, spec §3, §15.2) over real localhost WebSockets: admission,
close, disconnect grace, idle TTL, reaper and shutdown, one test per rule.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.server import DuplexServer
from h3batch.loadrunner.server_config import ServerConfig
from h3batch.loadrunner.server_protocol import DEFAULT_PERSONA
from tests.loadrunner.realtime_client import (
    HEX32,
    QUERY,
    append,
    close_frame,
    open_session,
    recv_until,
    update,
    wait_for,
)


def test_reused_session_id_is_refused_with_session_exists():
    """§3.2: an id that was ever issued is never admitted again (`session_exists`), and the refused open frees its
    reservation."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=3), new_session_id=lambda: "duplex-" + "0" * 32) as server:
            url = server.url + QUERY
            first, created = await open_session(url)
            second = await connect(url)
            await second.send(update(event_id="evt-dup"))
            refused, _ = await recv_until(second, "error")
            held = server.admission.held
            for ws in (first, second):
                await ws.close()
            return created, refused, held

    created, refused, held = asyncio.run(scenario())
    assert created["session"]["id"] == "duplex-" + "0" * 32
    assert refused["error"]["code"] == "session_exists" and refused["error"]["type"] == "invalid_request_error"
    assert refused["error"]["event_id"] == "evt-dup" and held == 1

def test_capacity_refusal_envelope_and_retry_after_close():
    """§3.2/§4.2: over capacity the open gets the exact retryable `resource_exhausted` envelope with the client's
    event id; the refused connection stays usable and is admitted once a slot frees."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1)) as server:
            url = server.url + QUERY
            a, _ = await open_session(url)
            b = await connect(url)
            await b.send(update(event_id="evt-b"))
            refused, _ = await recv_until(b, "error")
            await a.send(json.dumps({"type": "session.close"}))
            await recv_until(a, "session.closed")
            await b.send(update())
            admitted, _ = await recv_until(b, "session.created", "error")
            await b.close()
            return refused, admitted

    refused, admitted = asyncio.run(scenario())
    assert refused["error"] == {"type": "rate_limit_error", "code": "resource_exhausted",
                                "message": "duplex_session_capacity_exhausted: limit=1", "retryable": True,
                                "event_id": "evt-b"}
    assert re.fullmatch(f"event_{HEX32}", refused["event_id"]) and refused["server_event_seq"] == 1
    assert admitted["type"] == "session.created"

def test_slot_is_held_during_warmup_so_concurrent_opens_cannot_over_admit():
    """§3.2/§3.7: `warmup_frames` runs while the open holds its slot: a concurrent open is refused before the
    warming one is created, three racing opens on two slots admit exactly two, and warm-up makes no output."""
    config = ServerConfig(max_sessions=2, warmup_frames=4, frame_cost_ms=60)  # 240 ms of warm-up per open

    async def scenario():
        async with DuplexServer(config) as server:
            url = server.url + QUERY
            sockets = [await connect(url) for _ in range(3)]
            loop = asyncio.get_running_loop()
            began = loop.time()
            for ws in sockets:
                await ws.send(update())

            async def outcome(ws):
                event, _ = await recv_until(ws, "session.created", "error")
                return event, loop.time() - began

            outcomes = await asyncio.gather(*(outcome(ws) for ws in sockets))
            arrivals = sorted((at, event["type"]) for event, at in outcomes)
            admitted = [ws for ws, o in zip(sockets, outcomes) if o[0]["type"] == "session.created"]
            held = server.admission.held
            frame = np.full(1920, 0.25)
            await admitted[0].send(append(frame))
            packet, _ = await recv_until(admitted[0], "response.output_audio.delta")
            for ws in sockets:
                await ws.close()
            return arrivals, held, packet

    arrivals, held, packet = asyncio.run(scenario())
    # the refusal comes first, while both admitted opens are still warming up (>= 240 ms each)
    assert [kind for _, kind in arrivals] == ["error", "session.created", "session.created"] and held == 2
    assert arrivals[1][0] >= 0.2, arrivals
    audio = np.frombuffer(base64.b64decode(packet["delta"]), "<i2")
    assert audio.size == 1920 and np.all(audio == round(0.25 * 32767))  # first packet = first input frame

@pytest.mark.parametrize("event, reason", [({"type": "session.close"}, "client_close"),
                                           ({"type": "close", "reason": "done"}, "done"),
                                           ({"type": "close_session"}, "client_close")])
def test_close_aliases_release_then_ack(event, reason):
    """§3.6: every close alias frees the slot before `session.closed` (reason default `client_close`), so a
    replacement opened at once on a 1-slot server is admitted; the socket closes 1000 with the reason."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1)) as server:
            url = server.url + QUERY
            ws, created = await open_session(url)
            await ws.send(json.dumps(event))
            closed, _ = await recv_until(ws, "session.closed")
            held_at_ack = server.admission.held
            code = await close_frame(ws)
            replacement, outcome = await open_session(url)
            await replacement.close()
            return created, closed, held_at_ack, code, outcome, list(server.terminals)

    created, closed, held, code, outcome, terminals = asyncio.run(scenario())
    sid = created["session"]["id"]
    assert closed["session_id"] == sid and closed["reason"] == reason
    assert closed["event"] == {"type": "session.closed", "reason": reason}
    assert held == 0 and code == (1000, reason) and outcome["type"] == "session.created"
    assert terminals[0] == {"session_id": sid, "type": "session.closed", "reason": reason}

def test_close_is_idempotent():
    """§3.6: a repeated close produces one `session.closed` and frees one slot only (no over-admission after)."""
    async def scenario():
        # grace 0: the transport drop that follows the close would end the session a second time if close weren't final
        async with DuplexServer(ServerConfig(max_sessions=2, disconnect_grace_s=0)) as server:
            url = server.url + QUERY
            a, created = await open_session(url)
            b, _ = await open_session(url)
            await a.send(json.dumps({"type": "session.close"}))
            await a.send(json.dumps({"type": "close"}))
            events = []
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(3):
                    while True:
                        events.append(json.loads(await a.recv()))
            await wait_for(lambda: server.connections[0].closed)
            c, c_outcome = await open_session(url)
            d, d_outcome = await open_session(url)
            for ws in (b, c, d):
                await ws.close()
            return events, c_outcome, d_outcome, [t for t in server.terminals if t["session_id"] == created[
                "session"]["id"]]

    events, c_outcome, d_outcome, terminals_of_a = asyncio.run(scenario())
    assert [e["type"] for e in events].count("session.closed") == 1
    assert c_outcome["type"] == "session.created" and d_outcome["error"]["code"] == "resource_exhausted"
    assert [t["reason"] for t in terminals_of_a] == ["client_close"]

def test_replacement_inherits_no_voice_persona_or_audio_tail():
    """§3.6: a session opened after a close starts from defaults: its own voice/persona and no leftover input."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1)) as server:
            url = server.url + QUERY
            a, _ = await open_session(url, voice="VARM2.pt", instructions="pirate")
            await a.send(append(np.full(1000, 0.9)))  # a partial frame stays in A's residual
            await a.send(json.dumps({"type": "session.close"}))
            await recv_until(a, "session.closed")
            b = await connect(url)
            await b.send(json.dumps({"type": "session.update", "session": {"model": "m"}}))
            created, _ = await recv_until(b, "session.created")
            await b.send(append(np.full(1920, 0.2)))
            packet, _ = await recv_until(b, "response.output_audio.delta")
            await b.close()
            return created["session"], packet

    session, packet = asyncio.run(scenario())
    assert session["voice"] == "NATF2.pt" and session["instructions"] == DEFAULT_PERSONA and session["epoch"] == 0
    audio = np.frombuffer(base64.b64decode(packet["delta"]), "<i2")
    assert audio.size == 1920 and np.all(audio == round(0.2 * 32767))

def test_disconnect_grace_holds_the_slot_then_expires():
    """§3.6/§3.7: a dropped transport leaves the session `closing` with its slot held for `disconnect_grace_s`, then
    it ends `session.expired` `disconnect_grace_expired` and the slot frees."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1, disconnect_grace_s=0.5)) as server:
            url = server.url + QUERY
            a, created = await open_session(url)
            sid = created["session"]["id"]
            await a.close()  # transport gone, no session.close
            dropped = await wait_for(lambda: server.connections[0].closed)
            state_in_grace = server.sessions[sid].state.value
            b, during = await open_session(url)
            freed = await wait_for(lambda: server.admission.held == 0)
            await b.send(update())
            after, _ = await recv_until(b, "session.created", "error")
            await b.close()
            return sid, state_in_grace, during, freed - dropped, after, list(server.terminals)

    sid, state, during, grace_s, after, terminals = asyncio.run(scenario())
    assert state == "closing" and during["error"]["code"] == "resource_exhausted"
    assert grace_s >= 0.4, grace_s  # held for its grace (a lower bound: a busy machine only makes it longer)
    assert terminals[0] == {"session_id": sid, "type": "session.expired", "reason": "disconnect_grace_expired"}
    assert after["type"] == "session.created"

def test_zero_grace_releases_on_disconnect():
    """§2: with `disconnect_grace_s` 0 a dropped session ends at once as `session.closed` `disconnect`."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1, disconnect_grace_s=0)) as server:
            a, created = await open_session(server.url + QUERY)
            await a.close()
            await wait_for(lambda: server.admission.held == 0, timeout=30.0)
            return created["session"]["id"], list(server.terminals)

    sid, terminals = asyncio.run(scenario())
    assert terminals == [{"session_id": sid, "type": "session.closed", "reason": "disconnect"}]

def test_detached_session_idle_ttl_can_end_before_grace():
    """§3.6: a detached session whose idle TTL comes before the grace deadline ends `idle_ttl_expired`."""
    async def scenario():
        async with DuplexServer(ServerConfig(disconnect_grace_s=5, idle_ttl_s=0.3)) as server:
            a, created = await open_session(server.url + QUERY)
            await a.close()
            await wait_for(lambda: server.admission.held == 0)
            return created["session"]["id"], list(server.terminals)

    sid, terminals = asyncio.run(scenario())
    assert terminals == [{"session_id": sid, "type": "session.expired", "reason": "idle_ttl_expired"}]

def test_reaper_retries_failed_cleanup_while_the_slot_counts():
    """§3.6: when cleanup fails the session still gets `session.closed`, but its slot counts (replacement refused)
    until the reaper's retry every `reaper_interval_s` succeeds."""
    config = ServerConfig(max_sessions=1, cleanup_failures=2, reaper_interval_s=0.2)

    async def scenario():
        async with DuplexServer(config) as server:
            url = server.url + QUERY
            a, created = await open_session(url)
            session = server.sessions[created["session"]["id"]]
            await a.send(json.dumps({"type": "session.close"}))
            await recv_until(a, "session.closed")
            acked = asyncio.get_running_loop().time()
            state_pending = session.state.value
            b, refused = await open_session(url)
            freed = await wait_for(lambda: server.admission.held == 0)
            await b.send(update())
            admitted, _ = await recv_until(b, "session.created", "error")
            await b.close()
            return state_pending, refused, freed - acked, session.cleanup_attempts, session.state.value, admitted

    state_pending, refused, waited, attempts, final_state, admitted = asyncio.run(scenario())
    assert state_pending == "closing" and refused["error"]["code"] == "resource_exhausted"
    # attempt 1 at close, 2 and 3 on reaper ticks 0.2 s apart (the first tick may fall just before the ack)
    assert attempts == 3 and final_state == "closed" and 0.15 <= waited < 2.0, waited
    assert admitted["type"] == "session.created"

def test_idle_ttl_expires_and_activity_keeps_the_session():
    """§3.6/§3.7: heartbeats keep a session past `idle_ttl_s`; after they stop it ends `session.expired`
    `idle_ttl_expired`, closes 1000 `timeout` and frees its slot."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1, idle_ttl_s=0.3, idle_timeout_s=0)) as server:
            ws, created = await open_session(server.url + QUERY)
            for _ in range(6):  # 0.6 s of activity, twice the TTL
                await asyncio.sleep(0.1)
                await ws.send(json.dumps({"type": "session.heartbeat"}))
            alive_after_heartbeats = created["session"]["id"] in server.sessions
            loop = asyncio.get_running_loop()
            quiet = loop.time()
            expired, _ = await recv_until(ws, "session.expired")
            waited = loop.time() - quiet
            code = await close_frame(ws)
            return created, alive_after_heartbeats, expired, waited, code, server.admission.held

    created, alive, expired, waited, code, held = asyncio.run(scenario())
    assert alive and expired["reason"] == "idle_ttl_expired" and expired["session_id"] == created["session"]["id"]
    assert 0.15 <= waited < 1.5, waited
    assert code == (1000, "timeout") and held == 0

def test_shutdown_ends_sessions_with_reason_shutdown():
    """§3.6: stopping the server sends each attached session `session.closed` `shutdown` and closes 1000."""
    async def scenario():
        server = await DuplexServer(ServerConfig()).start()
        ws, _ = await open_session(server.url + QUERY)
        await server.close()
        closed, _ = await recv_until(ws, "session.closed")
        return closed, await close_frame(ws), server.admission.held

    closed, code, held = asyncio.run(scenario())
    assert closed["reason"] == "shutdown" and code == (1000, "shutdown") and held == 0
