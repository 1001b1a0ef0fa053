"""One realtime WebSocket of the reference server (spec §2-§4): first-message rules, admission, frame handling.

`RealtimeConnection` reads client frames, asks `server_protocol` what each means and answers; the session it opens
lives in `server_session`, and the lifecycle decisions (when a session ends, when its slot is free) stay with
`DuplexServer`, which the connection calls back into.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.fault_modes import ConnectionState
from h3batch.loadrunner.server_protocol import (
    CLOSE_TYPES,
    DEFAULT_PERSONA,
    DEFAULT_VOICE,
    IGNORED_CLIENT_EVENTS,
    MAX_CLIENT_FRAME_BYTES,
    NEW_EPOCH_TYPES,
    EventSequencer,
    error_event,
    open_error,
    update_error,
)
from h3batch.loadrunner.server_session import RealtimeSession

if TYPE_CHECKING:  # the server creates connections; a connection sees it only as the lifecycle it reports to
    from h3batch.loadrunner.server import DuplexServer

FALSY = ("0", "false", "no", "off")


class RealtimeConnection:
    """§2-§4 for one WebSocket: first-message rules, admission, appends, close, idle expiry and disconnect."""

    def __init__(self, server: DuplexServer, websocket: ServerConnection, state: ConnectionState):
        self.server, self.websocket, self.state = server, websocket, state
        self.sequencer = EventSequencer()
        self.lock = asyncio.Lock()
        self.session: RealtimeSession | None = None
        self.last_message_at = asyncio.get_running_loop().time()
        query = dict(parse_qsl(urlsplit(websocket.request.path).query, keep_blank_values=True))
        self.model = query.get("model", "reference-duplex")
        self.autostart = "model" in query and query.get("autostart", "1").lower() not in FALSY \
            and query.get("resume", "0").lower() in FALSY

    async def send(self, event: dict) -> None:
        async with self.lock:  # stamp and send under one lock so server_event_seq follows wire order
            await self.websocket.send(json.dumps(self.sequencer.stamp(event)))

    async def send_error(self, code: str, message: str, client_event_id=None) -> None:
        await self.send(error_event(code, message, client_event_id))

    async def run(self) -> None:
        config = self.server.config
        try:
            if self.autostart:
                await self.open({"voice": DEFAULT_VOICE}, None)
            else:
                try:
                    async with asyncio.timeout(config.first_message_timeout_s):
                        raw = await self.websocket.recv()
                except TimeoutError:
                    await self.send_error("config_timeout", "no session.update within "
                                          f"{config.first_message_timeout_s:g} s")
                    await self.websocket.close(1000, "timeout")
                    return
                self.last_message_at = asyncio.get_running_loop().time()
                message = await self.parse(raw)
                if message is None:
                    await self.websocket.close(1000, "transport_error")
                    return
                if message.get("type") not in ("session.update", "session.resume"):
                    await self.send_error("invalid_session_config", "first message must be session.update "
                                          "(autostart=0)", message.get("event_id"))
                    await self.websocket.close(1000, "transport_error")
                    return
                if not await self.handle(message):
                    return
            while True:
                raw = await self.receive_or_idle()
                if raw is None:
                    await self.expire_idle()
                    return
                message = await self.parse(raw)
                if message is not None and not await self.handle(message, len(raw)):
                    return
        except ConnectionClosed:
            return
        finally:
            if self.session is not None:
                await self.server.transport_lost(self.session)

    def idle_deadline(self) -> float | None:
        """Loop time at which this connection counts as idle (§2 transport limit, §3.7 session TTL), or None."""
        config, session = self.server.config, self.session
        transport_limit = config.idle_timeout_s
        if session is not None and session.idle_timeout_s:
            transport_limit = session.idle_timeout_s
        deadlines = []
        if transport_limit > 0:
            deadlines.append(self.last_message_at + transport_limit)
        if session is not None and config.idle_ttl_s > 0:
            deadlines.append(session.last_activity + config.idle_ttl_s)
        return min(deadlines) if deadlines else None

    async def receive_or_idle(self):
        """The next client frame, or None once the idle deadline passed without one."""
        loop = asyncio.get_running_loop()
        while True:
            deadline = self.idle_deadline()
            try:
                async with asyncio.timeout_at(deadline):
                    raw = await self.websocket.recv()
            except TimeoutError:
                if self.idle_deadline() is not None and loop.time() >= self.idle_deadline():
                    return None
                continue  # output activity moved the deadline on
            self.last_message_at = loop.time()
            if self.session is not None:
                self.session.touch()
            return raw

    async def parse(self, raw) -> dict | None:
        if len(raw) > MAX_CLIENT_FRAME_BYTES:
            await self.send_error("event_too_large", f"client frame exceeds {MAX_CLIENT_FRAME_BYTES} bytes")
            return None
        try:
            message = json.loads(raw)
        except (ValueError, TypeError):
            await self.send_error("invalid_json", "client message is not JSON")
            return None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            await self.send_error("bad_event", "client message must be an object with a string type")
            return None
        return message

    async def open(self, session_payload: dict, client_event_id) -> bool:
        """Admission (§3.2) and validation (§3.3) of a first `session.update`; the slot is held from here on."""
        admission = self.server.admission
        if not admission.try_reserve():
            event = admission.exhausted_event()
            if client_event_id is not None:
                event["error"]["event_id"] = client_event_id
            await self.send(event)
            return True
        try:
            refused = open_error(session_payload)
            if refused is None:
                await self.server.warm_up()
                session_id = self.server.new_session_id()
                if not admission.commit(session_id):
                    refused = ("session_exists", f"session {session_id} already exists")
        except BaseException:
            admission.abandon()
            raise
        if refused is not None:
            if refused[0] != "session_exists":
                admission.abandon()
            await self.send_error(*refused, client_event_id)
            return True
        self.session = RealtimeSession(self, self.server.config, self.server.worker, session_id,
                                       session_payload.get("voice", DEFAULT_VOICE),
                                       session_payload.get("instructions") or DEFAULT_PERSONA,
                                       session_payload.get("idle_timeout_s"))
        self.server.register(self.session)
        body = self.session.session_object()
        await self.send({"type": "session.created", "session": body})
        await self.send({"type": "session.updated", "session": body})
        for event in self.session.response_events():
            await self.send(event)
        return True

    async def handle(self, message: dict, wire_bytes: int = 0) -> bool:
        """Act on one client message (`wire_bytes` long); False when the connection must end."""
        kind, client_event_id = message["type"], message.get("event_id")
        session = self.session
        if kind == "session.update":
            if session is None:
                return await self.open(message.get("session"), client_event_id)
            refused = update_error({"voice": session.voice, "instructions": session.instructions},
                                   message.get("session"))
            if refused is not None:
                await self.send_error(*refused, client_event_id)
            else:
                await self.send({"type": "session.updated", "session": session.session_object()})
            return True
        if kind == "session.resume":
            await self.send_error("unsupported_session_resume", "this model does not resume sessions",
                                  client_event_id)
            return True
        if kind in CLOSE_TYPES:
            reason = message.get("reason") if isinstance(message.get("reason"), str) and message.get("reason") \
                else "client_close"
            self.state.close_requested = True
            await self.close_session(reason)
            return False
        if kind == "session.heartbeat":
            await self.send({"type": "session.heartbeat_ack"})
            return True
        if kind == "session.event_ack":
            seq = message.get("server_event_seq")
            if type(seq) is not int or not 1 <= seq <= self.sequencer.seq:
                await self.send_error("invalid_event_ack", f"server_event_seq out of range: {seq!r}",
                                      client_event_id)
            return True
        if session is None:
            known = kind in IGNORED_CLIENT_EVENTS or kind in NEW_EPOCH_TYPES or kind.startswith(
                ("input_audio_buffer.", "response.", "output_audio_buffer."))
            await self.send_error("unknown_session" if known else "unknown_event", f"no open session for {kind}",
                                  client_event_id)
            return True
        if kind == "input_audio_buffer.append":
            limit = self.server.config.max_pending_input_bytes
            if session.pending_input_bytes + wire_bytes > limit:
                await self.send_error("input_backpressure", f"pending input would exceed {limit} bytes",
                                      client_event_id)
                return True
            frames, refused = session.decoder.decode(message)
            if refused is not None:
                await self.send_error(*refused, client_event_id)
                return True
            session.accept_frames(frames, wire_bytes)
            return True
        if kind in NEW_EPOCH_TYPES:
            if kind == "input.cancel":
                session.decoder.clear()
            await session.cancel_response()
            return True
        if kind == "input_audio_buffer.clear":
            session.decoder.clear()
            await self.send({"type": "input_audio_buffer.cleared"})
            return True
        if kind in IGNORED_CLIENT_EVENTS or kind.startswith("conversation.item."):
            return True
        await self.send_error("unknown_event", f"unknown event type {kind!r}", client_event_id)
        return True

    async def close_session(self, reason: str) -> None:
        """Abort and clean up first, then `session.closed`, then close 1000 with the reason (idempotent)."""
        session = self.session
        if session is not None:
            await self.server.end(session, "session.closed", reason)
        await self.send({"type": "session.closed", "session_id": session.id if session else None, "reason": reason,
                         "event": {"type": "session.closed", "reason": reason}})
        await self.websocket.close(1000, reason)

    async def expire_idle(self) -> None:
        """Idle limit reached: clean up, `session.expired` `idle_ttl_expired`, close 1000 `timeout`."""
        session = self.session
        if session is not None:
            await self.server.end(session, "session.expired", "idle_ttl_expired")
            await self.send({"type": "session.expired", "session_id": session.id, "reason": "idle_ttl_expired"})
        await self.websocket.close(1000, "timeout")
