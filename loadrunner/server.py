"""`h3batch duplex-server`: reference full-duplex server — the §13 fixture modes and a paced `realtime` mode.

Message decisions come from `server_protocol` and `fault_modes`; this module moves frames, keeps per-connection state
for tests (`index`, `closed`, `frames`, `close_requested`) and owns the timing of realtime output and of the session
lifecycle (§3): admission slots, close/expiry terminals, the disconnect grace, the idle TTL and the cleanup reaper.

Session lifecycle (realtime mode):
* open: a slot is reserved before validation and the optional `warmup_frames` preparation, so concurrent opens cannot
  over-admit; the id is allocated only after warm-up and must never have been issued before (`session_exists`).
* `session.close` (aliases, default reason `client_close`): state `closing`, work aborted, cleanup attempted, then
  `session.closed` and close 1000 with the reason. A failed cleanup (fault knob `cleanup_failures`) keeps the slot
  counted until the reaper, every `reaper_interval_s`, succeeds.
* transport drop without close: the session turns `closing`, its output stops, and it keeps its slot (a lease) for
  `disconnect_grace_s`; then it ends with `session.expired` `disconnect_grace_expired` (recorded in
  `DuplexServer.terminals`, there is no transport to send it on) and is cleaned up. Resume is unsupported, so nothing
  can re-attach during the grace; `disconnect_grace_s` 0 ends it at once as `session.closed` `disconnect`.
* idle: no activity (client message or output packet) for `idle_ttl_s`, or no client message for the transport's
  `idle_timeout_s` (a session may lower it with `session.idle_timeout_s`) ends the session with `session.expired`
  `idle_ttl_expired` and close 1000 `timeout`.
* server shutdown ends every attached session with `session.closed` `shutdown`.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import random
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.audio import FRAME_PERIOD_S, SAMPLE_RATE_HZ
from h3batch.loadrunner.fault_modes import ConnectionState, FixtureMode, fixture_replies
from h3batch.loadrunner.server_protocol import (
    CLOSE_TYPES,
    DEFAULT_PERSONA,
    DEFAULT_VOICE,
    IGNORED_CLIENT_EVENTS,
    MAX_CLIENT_FRAME_BYTES,
    MAX_PENDING_INPUT_BYTES,
    NEW_EPOCH_TYPES,
    Admission,
    AppendDecoder,
    Content,
    EventSequencer,
    OutputRenderer,
    SessionState,
    capabilities,
    data_plane_metadata,
    error_event,
    open_error,
    update_error,
)

logger = logging.getLogger("h3batch.loadrunner.server")
REALTIME = "realtime"
MODES = [REALTIME, *(m.value for m in FixtureMode)]
FALSY = ("0", "false", "no", "off")


@dataclass(frozen=True)
class ServerConfig:
    """Reference server settings; times in seconds unless the name says ms."""

    host: str = "127.0.0.1"
    port: int = 0
    mode: str = REALTIME
    max_sessions: int = 2
    fault_connection_index: int = 1
    initial_chunk_frames: int = 1
    chunk_frames: int = 5
    content: Content = Content.ECHO
    processing_delay_ms: float = 0.0
    frame_cost_ms: float = 0.0  # charged per output frame to one serial worker shared by all sessions
    jitter_ms: float = 0.0
    jitter_seed: int = 0
    slowdown: float = 1.0  # multiplies frame_cost_ms
    first_message_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0  # §2 transport: no client message for this long (0 = off)
    idle_ttl_s: float = 300.0  # §3.7 lease: no client message or output for this long (0 = off)
    disconnect_grace_s: float = 30.0  # slot kept after a transport drop; 0 = clean up at once
    reaper_interval_s: float = 5.0  # retry period for failed cleanups
    warmup_frames: int = 0  # silent frames run through the worker while an open holds its slot
    max_pending_input_bytes: int = MAX_PENDING_INPUT_BYTES  # §3.5 per-session input reservation
    cleanup_failures: int = 0  # fault knob: the first N cleanup attempts of every session fail


def new_session_id() -> str:
    return f"duplex-{uuid.uuid4().hex}"


class SerialWorker:
    """Emulated shared compute: each output frame occupies the worker for `frame_cost_ms` (+ jitter) in turn."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.busy_until = 0.0
        self.rng = random.Random(config.jitter_seed)

    def ready_at(self, now: float) -> float:
        cost = self.config.frame_cost_ms * self.config.slowdown
        if self.config.jitter_ms:
            cost += self.rng.uniform(0.0, self.config.jitter_ms)
        start = max(now, self.busy_until)
        self.busy_until = start + cost / 1000.0
        return self.busy_until + self.config.processing_delay_ms / 1000.0


class RealtimeSession:
    """One realtime session: output chunking, its state, activity clock and cleanup (owned by `DuplexServer`)."""

    def __init__(self, conn: RealtimeConnection, session_id: str, voice: str, instructions: str,
                 idle_timeout_s: float | None = None):
        self.conn: RealtimeConnection | None = conn  # None once the transport dropped
        self.server = conn.server
        self.id = session_id
        self.voice, self.instructions = voice, instructions
        self.idle_timeout_s = idle_timeout_s  # the session's own transport idle limit, if it set one
        self.state = SessionState.OPEN
        self.epoch = 0
        self.response_id = self._new_response_id()
        self.decoder = AppendDecoder()
        self.renderer = OutputRenderer(conn.server.config.content)
        self.ready: asyncio.Queue[bytes] = asyncio.Queue()
        self.generated_samples = 0
        self.sent_samples = 0
        self.pending_input_bytes = 0.0
        self.unassigned_input_bytes = 0  # wire bytes of appends whose samples still wait in the residual
        self.closed = False  # work aborted: no more output is produced or sent
        self.cleanup_attempts = 0
        self.last_activity = asyncio.get_running_loop().time()
        self.detached_at: float | None = None
        self.pump = asyncio.create_task(self._pump(), name=f"pump-{self.id}")

    def _new_response_id(self) -> str:
        return f"resp-{self.id}-{self.epoch}-{uuid.uuid4().hex[:8]}"

    def session_object(self) -> dict:
        caps = capabilities(self.server.config.max_sessions)
        return {
            "object": "realtime.session", "type": "realtime", "id": self.id, "model": self.conn.model,
            "state": self.state.value, "turn_state": "listening", "epoch": self.epoch, "turn_id": None,
            "active_request_id": None, "active_response_id": self.response_id, "active_response_turn_id": None,
            "modalities": ["audio", "text"], "output_modalities": ["audio", "text"],
            "instructions": self.instructions, "voice": self.voice, "response_format": "pcm16",
            "input_audio_format": "pcm_f32le", "output_audio_format": "pcm16",
            "playback": self.playback(), "turn_detection": None, "capabilities": caps,
        }

    def playback(self) -> dict:
        return {"generated_ms": self.generated_samples * 1000 // SAMPLE_RATE_HZ,
                "sent_ms": self.sent_samples * 1000 // SAMPLE_RATE_HZ, "played_ms": 0, "committed_ms": 0}

    def response_events(self) -> list[dict]:
        rid, item_id = self.response_id, f"item_{self.response_id}"
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
                "status": "in_progress", "content": []}
        where = {"response_id": rid, "output_index": 0, "content_index": 0}
        return [
            {"type": "response.created", "response_id": rid,
             "response": {"id": rid, "object": "realtime.response", "status": "in_progress", "status_details": None,
                          "output": [], "modalities": ["audio", "text"], "metadata": {"session_id": self.id}}},
            {"type": "conversation.item.added", "previous_item_id": None, "item": item},
            {"type": "conversation.item.created", "previous_item_id": None, "item": item},
            {"type": "response.output_item.added", **where, "item": item},
            {"type": "response.content_part.added", **where, "item_id": item_id,
             "part": {"type": "audio", "transcript": ""}},
            {"type": "response.speak", **where, "metadata": {"session_id": self.id, "epoch": self.epoch,
                                                             "model_speak": True}},
        ]

    def touch(self) -> None:
        self.last_activity = asyncio.get_running_loop().time()

    def accept_frames(self, frames, wire_bytes: int) -> None:
        """Reserve the append's wire size, then schedule output frame k for input frame k on the shared worker."""
        loop = asyncio.get_running_loop()
        self.pending_input_bytes += wire_bytes
        self.unassigned_input_bytes += wire_bytes
        if not frames:
            return
        share = self.unassigned_input_bytes / len(frames)  # released as each frame is produced
        self.unassigned_input_bytes = 0
        epoch = self.epoch
        for frame in frames:
            self.conn.state.frames += 1
            at = self.server.worker.ready_at(loop.time())
            loop.call_at(at, self._deliver, epoch, self.renderer.render(frame), share)

    def _deliver(self, epoch: int, pcm: bytes, share: float) -> None:
        self.pending_input_bytes = max(0, self.pending_input_bytes - share)
        if not self.closed and epoch == self.epoch:
            self.generated_samples += len(pcm) // 2
            self.ready.put_nowait(pcm)

    async def _pump(self) -> None:
        """First ready frame alone, then `chunk_frames` per packet; flush a partial chunk after one idle period."""
        config = self.server.config
        target, buffered = config.initial_chunk_frames, []
        try:
            while True:
                try:
                    async with asyncio.timeout(FRAME_PERIOD_S if buffered else None):
                        buffered.append(await self.ready.get())
                except TimeoutError:
                    await self._send_packet(buffered)
                    buffered, target = [], config.chunk_frames
                    continue
                if len(buffered) >= target:
                    await self._send_packet(buffered)
                    buffered, target = [], config.chunk_frames
        except ConnectionClosed:
            return
        except Exception:
            logger.exception("output pump of %s failed", self.id)

    async def _send_packet(self, frames: list[bytes]) -> None:
        conn = self.conn
        if conn is None:
            return
        payload = b"".join(frames)
        first = self.sent_samples == 0
        self.sent_samples += len(payload) // 2
        self.touch()
        rid = self.response_id
        await conn.send({
            "type": "response.output_audio.delta", "response_id": rid, "item_id": f"item_{rid}",
            "output_index": 0, "content_index": 0, "delta": _b64(payload), "format": "pcm16",
            "sample_rate_hz": SAMPLE_RATE_HZ,
            "metadata": {"session_id": self.id, "epoch": self.epoch, "model_speak": True, "end_of_turn": False,
                         "playback": self.playback(), "vllm_omni": data_plane_metadata(),
                         "audio_duration_ms": self.sent_samples * 1000 // SAMPLE_RATE_HZ, "audio_text_marks": []}})
        await conn.send({"type": "response.output_audio_transcript.delta", "response_id": rid,
                              "item_id": f"item_{rid}", "output_index": 0, "content_index": 0,
                              "delta": "Hello" if first else ""})

    async def cancel_response(self) -> None:
        """A §3.1 epoch event (cancel, output clear, input cancel, barge-in): new epoch, drop queued output, new
        response."""
        done = {"type": "response.done", "response_id": self.response_id,
                "response": {"id": self.response_id, "object": "realtime.response", "status": "cancelled"}}
        self.epoch += 1
        while not self.ready.empty():
            self.ready.get_nowait()
        self.response_id = self._new_response_id()
        await self.conn.send(done)
        for event in self.response_events():
            await self.conn.send(event)

    async def abort(self) -> None:
        """Stop producing and sending output (idempotent); scheduled deliveries are dropped by `closed`."""
        self.closed = True
        if not self.pump.done():
            self.pump.cancel()
            await asyncio.wait([self.pump])
        while not self.ready.empty():
            self.ready.get_nowait()

    async def cleanup(self) -> bool:
        """One cleanup attempt: abort work and free the session's resources; False when the attempt failed."""
        await self.abort()
        self.cleanup_attempts += 1
        if self.cleanup_attempts <= self.server.config.cleanup_failures:
            return False
        self.decoder.clear()
        self.pending_input_bytes = 0.0
        return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


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
        self.session = RealtimeSession(self, session_id, session_payload.get("voice", DEFAULT_VOICE),
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


class DuplexServer:
    """Serves one mode on host:port; `connections` holds every accepted connection's state, in accept order.

    Realtime sessions live in `sessions` (id -> session, open or closing) until their cleanup succeeded; `terminals`
    records how each ended ({session_id, type, reason}) in order. `new_session_id` is injectable for tests.
    """

    def __init__(self, config: ServerConfig, log: logging.Logger | None = None,
                 new_session_id: Callable[[], str] = new_session_id):
        self.config = config
        self.logger = log or logger
        self.connections: list[ConnectionState] = []
        self.admission = Admission(config.max_sessions)
        self.worker = SerialWorker(config)
        self.new_session_id = new_session_id
        self.sessions: dict[str, RealtimeSession] = {}
        self.terminals: list[dict] = []
        self.sessions_opened = 0
        self._reaping: dict[str, RealtimeSession] = {}
        self._timers: dict[str, asyncio.Task] = {}
        self._reaper: asyncio.Task | None = None
        self._server: Server | None = None
        self.fixture = None if config.mode == REALTIME else FixtureMode(config.mode)

    # -- session lifecycle (§3) -------------------------------------------------------------------------------
    def register(self, session: RealtimeSession) -> None:
        self.sessions[session.id] = session
        self.sessions_opened += 1

    async def warm_up(self) -> None:
        """Open preparation: `warmup_frames` silent frames occupy the shared worker while the slot is held."""
        loop = asyncio.get_running_loop()
        ready = loop.time()
        for _ in range(self.config.warmup_frames):
            ready = self.worker.ready_at(loop.time())
        if ready > loop.time():
            await asyncio.sleep(ready - loop.time())

    async def end(self, session: RealtimeSession, terminal: str, reason: str) -> None:
        """Terminal `terminal` (`session.closed` / `session.expired`) with `reason`: state `closing`, work aborted,
        one cleanup attempt; the slot is released only when cleanup succeeded, else the reaper retries. A session
        ends once: later calls are no-ops."""
        if session.state is not SessionState.OPEN and session.detached_at is None:
            return
        timer = self._timers.pop(session.id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        session.state, session.detached_at = SessionState.CLOSING, None
        self.terminals.append({"session_id": session.id, "type": terminal, "reason": reason})
        self.logger.info("%s %s %s", session.id, terminal, reason)
        await self._clean(session)

    async def _clean(self, session: RealtimeSession) -> None:
        if await session.cleanup():
            session.state = SessionState.CLOSED
            self._reaping.pop(session.id, None)
            self.sessions.pop(session.id, None)
            self.admission.release(session.id)
        else:
            self._reaping[session.id] = session

    async def transport_lost(self, session: RealtimeSession) -> None:
        """The connection handler exited; an open session keeps its slot for the disconnect grace."""
        session.conn = None
        if session.state is not SessionState.OPEN:
            return
        grace = self.config.disconnect_grace_s
        if grace <= 0:
            await self.end(session, "session.closed", "disconnect")
            return
        session.state = SessionState.CLOSING
        session.detached_at = asyncio.get_running_loop().time()
        await session.abort()
        self._timers[session.id] = asyncio.create_task(self._lease_timer(session), name=f"lease-{session.id}")

    async def _lease_timer(self, session: RealtimeSession) -> None:
        """A detached session ends at the grace deadline or its idle TTL, whichever comes first."""
        grace_at = session.detached_at + self.config.disconnect_grace_s
        ttl = self.config.idle_ttl_s
        ttl_at = session.last_activity + ttl if ttl > 0 else float("inf")
        await asyncio.sleep(max(0.0, min(grace_at, ttl_at) - asyncio.get_running_loop().time()))
        reason = "idle_ttl_expired" if ttl_at < grace_at else "disconnect_grace_expired"
        await self.end(session, "session.expired", reason)

    async def _reap(self) -> None:
        """Every `reaper_interval_s`, retry the cleanup of sessions whose cleanup failed."""
        while True:
            await asyncio.sleep(self.config.reaper_interval_s)
            for session in list(self._reaping.values()):
                try:
                    await self._clean(session)
                except Exception:
                    self.logger.exception("reaper: cleanup of %s failed", session.id)

    async def _shut_down_sessions(self) -> None:
        """Server shutdown: attached sessions end with `session.closed` `shutdown`; every slot is freed."""
        for session in list(self.sessions.values()):
            conn = session.conn
            try:
                if conn is not None and session.state is SessionState.OPEN:
                    async with asyncio.timeout(1.0):
                        await conn.close_session("shutdown")
                elif session.state is SessionState.OPEN or session.detached_at is not None:
                    await self.end(session, "session.closed", "shutdown")
            except (ConnectionClosed, TimeoutError):
                pass
        tasks = [*self._timers.values(), *([self._reaper] if self._reaper else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timers.clear()
        for session in list(self.sessions.values()):  # cleanup still failing: the process is going away anyway
            await session.abort()
            session.state = SessionState.CLOSED
            self.admission.release(session.id)
        self.sessions.clear()
        self._reaping.clear()

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://{self.config.host}:{self.port}/v1/realtime"

    async def start(self) -> DuplexServer:
        self._server = await serve(self._handle, self.config.host, self.config.port, max_size=64 * 2**20,
                                   compression=None, process_request=self._check_path, logger=self.logger)
        if self.fixture is None:
            self._reaper = asyncio.create_task(self._reap(), name="session-reaper")
        return self

    async def close(self) -> None:
        if self._server is not None:
            await self._shut_down_sessions()
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> DuplexServer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _check_path(self, connection: ServerConnection, request):
        """Realtime mode serves /v1/realtime (duplex=1) and /v1/duplex; fixtures accept any path."""
        if self.fixture is not None:
            return None
        parts = urlsplit(request.path)
        duplex = dict(parse_qsl(parts.query, keep_blank_values=True)).get("duplex", "1").lower()
        if parts.path == "/v1/duplex" or (parts.path == "/v1/realtime" and duplex in ("1", "true", "on")):
            return None
        return connection.respond(404, "only /v1/realtime?duplex=1 and /v1/duplex are served here\n")

    async def _handle(self, websocket: ServerConnection) -> None:
        state = ConnectionState(index=len(self.connections))
        self.connections.append(state)
        try:
            if self.fixture is None:
                await RealtimeConnection(self, websocket, state).run()
            else:
                await self._fixture(websocket, state)
        finally:
            state.closed = True

    async def _fixture(self, websocket: ServerConnection, state: ConnectionState) -> None:
        try:
            async for raw in websocket:
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                for reply in fixture_replies(self.fixture, state, message, self.config.fault_connection_index):
                    if reply.close:
                        await websocket.close()
                        return
                    await websocket.send(reply.text)
        except ConnectionClosed:
            return


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="h3batch duplex-server", description="Reference full-duplex Realtime server.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8099, help="0 picks a free port (printed on start)")
    p.add_argument("--mode", choices=MODES, default=REALTIME)
    p.add_argument("--max-sessions", type=int, default=2)
    p.add_argument("--fault-connection-index", type=int, default=1)
    p.add_argument("--initial-chunk-frames", type=int, default=1)
    p.add_argument("--chunk-frames", type=int, default=5)
    p.add_argument("--content", choices=[c.value for c in Content], default=Content.ECHO.value)
    p.add_argument("--processing-delay-ms", type=float, default=0.0)
    p.add_argument("--frame-cost-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--jitter-seed", type=int, default=0)
    p.add_argument("--slowdown", type=float, default=1.0)
    p.add_argument("--first-message-timeout-s", type=float, default=10.0)
    p.add_argument("--idle-timeout-s", type=float, default=300.0,
                   help="close after this long without a client message (0 = off)")
    p.add_argument("--idle-ttl-s", type=float, default=300.0,
                   help="session.expired idle_ttl_expired after this long without activity (0 = off)")
    p.add_argument("--disconnect-grace-s", type=float, default=30.0,
                   help="a dropped session keeps its slot this long, then session.expired (0 = release at once)")
    p.add_argument("--reaper-interval-s", type=float, default=5.0, help="retry period for failed cleanups")
    p.add_argument("--warmup-frames", type=int, default=0, help="silent frames run at open while the slot is held")
    p.add_argument("--max-pending-input-bytes", type=int, default=MAX_PENDING_INPUT_BYTES,
                   help="per-session input reservation; over it appends get input_backpressure")
    p.add_argument("--cleanup-failures", type=int, default=0,
                   help="fault injection: the first N cleanup attempts of every session fail")
    return p


def parse_config(argv: list[str]) -> ServerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be in [0, 65535], got {args.port}")
    if args.max_sessions < 1:
        parser.error(f"--max-sessions must be at least 1, got {args.max_sessions}")
    if args.initial_chunk_frames < 1 or args.chunk_frames < 1:
        parser.error("--initial-chunk-frames and --chunk-frames must be at least 1")
    for name in ("processing_delay_ms", "frame_cost_ms", "jitter_ms", "first_message_timeout_s", "idle_timeout_s",
                 "idle_ttl_s", "disconnect_grace_s"):
        value = getattr(args, name)
        if not 0 <= value < float("inf"):
            parser.error(f"--{name.replace('_', '-')} must be finite and non-negative, got {value}")
    if not 0 < args.slowdown < float("inf"):
        parser.error(f"--slowdown must be finite and positive, got {args.slowdown}")
    if not 0 < args.reaper_interval_s < float("inf"):
        parser.error(f"--reaper-interval-s must be finite and positive, got {args.reaper_interval_s}")
    for name in ("warmup_frames", "cleanup_failures"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be at least 0, got {getattr(args, name)}")
    if args.max_pending_input_bytes < 1:
        parser.error(f"--max-pending-input-bytes must be at least 1, got {args.max_pending_input_bytes}")
    return ServerConfig(**{**vars(args), "content": Content(args.content)})


async def serve_forever(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with DuplexServer(config) as server:
        print(f"duplex-server listening on {server.url} mode={config.mode} max_sessions={config.max_sessions}",
              flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    config = parse_config(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        asyncio.run(serve_forever(config))
    except OSError as exc:
        print(f"h3batch duplex-server: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
