"""Reference server session lifecycle (spec §3, §15.2) over real localhost WebSockets: one test per rule."""
from __future__ import annotations

import asyncio
import base64
import json
import re

import numpy as np
import pytest
from conftest import TIME_SCALE
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.server import DuplexServer, ServerConfig, parse_config
from h3batch.loadrunner.server_protocol import DEFAULT_PERSONA, MAX_PENDING_INPUT_BYTES, SERVER_OWNED_KEYS

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


def test_ids_are_server_allocated_fresh_and_epochs_advance():
    """§3.1: ids are `duplex-<32 hex>`, client ids ignored, epoch starts at 0 and each epoch event mints a response."""
    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            url = server.url + QUERY + "&session_id=client-chosen"
            a, created_a = await open_session(url, id="client-a", session_id="client-a")
            b, created_b = await open_session(url)
            rids = [created_a["session"]["active_response_id"]]
            for kind in ("response.cancel", "output_audio_buffer.clear", "input.cancel", "barge_in"):
                await a.send(json.dumps({"type": kind}))
                done, _ = await recv_until(a, "response.done")
                created, _ = await recv_until(a, "response.created")
                assert done["response_id"] == rids[-1]
                rids.append(created["response_id"])
            await a.close()
            await b.close()
            return created_a["session"], created_b["session"], rids

    a, b, rids = asyncio.run(scenario())
    assert re.fullmatch(f"duplex-{HEX32}", a["id"]) and re.fullmatch(f"duplex-{HEX32}", b["id"])
    assert a["id"] != b["id"] and a["epoch"] == 0 and a["state"] == "open"
    assert [re.fullmatch(f"resp-{a['id']}-(\\d)-[0-9a-f]{{8}}", r).group(1) for r in rids] == ["0", "1", "2", "3", "4"]
    assert b["active_response_id"].startswith(f"resp-{b['id']}-0-")


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


@pytest.mark.parametrize("max_sessions, multi", [(1, False), (2, True)])
def test_multi_session_flags_follow_max_sessions(max_sessions, multi):
    """§3.4: both multi-session capability flags are true only when max_sessions > 1."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=max_sessions)) as server:
            ws, created = await open_session(server.url + QUERY)
            await ws.close()
            return created["session"]["capabilities"]

    caps = asyncio.run(scenario())
    assert caps["supports_multi_session"] is multi and caps["supports_multi_session_same_replica"] is multi
    assert caps["supports_session_resume"] is False and caps["supports_session_lease"] is True


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
    assert 0.4 <= grace_s < 2.0, grace_s
    assert terminals[0] == {"session_id": sid, "type": "session.expired", "reason": "disconnect_grace_expired"}
    assert after["type"] == "session.created"


def test_zero_grace_releases_on_disconnect():
    """§2: with `disconnect_grace_s` 0 a dropped session ends at once as `session.closed` `disconnect`."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=1, disconnect_grace_s=0)) as server:
            a, created = await open_session(server.url + QUERY)
            await a.close()
            await wait_for(lambda: server.admission.held == 0, timeout=1.0)
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


def test_lifecycle_defaults_and_flags(capsys):
    """§3.7: defaults idle_ttl 300 s, grace 30 s, reaper 5 s, warm-up off; the CLI sets each and rejects bad values
    with one error line."""
    defaults = parse_config([])
    assert (defaults.idle_ttl_s, defaults.disconnect_grace_s, defaults.reaper_interval_s, defaults.warmup_frames,
            defaults.idle_timeout_s, defaults.cleanup_failures) == (300.0, 30.0, 5.0, 0, 300.0, 0)
    assert defaults == ServerConfig(port=8099)
    set_ = parse_config(["--idle-ttl-s", "1", "--disconnect-grace-s", "2", "--reaper-interval-s", "0.5",
                         "--warmup-frames", "3", "--max-pending-input-bytes", "1000", "--cleanup-failures", "1"])
    assert (set_.idle_ttl_s, set_.disconnect_grace_s, set_.reaper_interval_s, set_.warmup_frames,
            set_.max_pending_input_bytes, set_.cleanup_failures) == (1.0, 2.0, 0.5, 3, 1000, 1)
    with pytest.raises(SystemExit) as info:
        parse_config(["--reaper-interval-s", "0"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "h3batch duplex-server: --reaper-interval-s must be finite and positive, got 0.0\n")


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
