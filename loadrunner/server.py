"""`h3batch duplex-server`: reference full-duplex server — the §13 fixture modes and a paced `realtime` mode.

Message decisions come from `server_protocol` and `fixtures`; this module moves frames, keeps per-connection state
for tests (`index`, `closed`, `frames`, `close_requested`) and owns the timing of realtime output.
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
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from loadrunner.audio import FRAME_PERIOD_S, SAMPLE_RATE_HZ
from loadrunner.fixtures import ConnectionState, FixtureMode, fixture_replies
from loadrunner.server_protocol import (CLOSE_TYPES, DEFAULT_PERSONA, DEFAULT_VOICE, IGNORED_CLIENT_EVENTS,
                                        MAX_CLIENT_FRAME_BYTES, MAX_PENDING_INPUT_BYTES, Admission, AppendDecoder,
                                        Content, EventSequencer, OutputRenderer, capabilities, data_plane_metadata,
                                        error_event, open_error, update_error)

logger = logging.getLogger("loadrunner.server")
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
    idle_timeout_s: float = 300.0


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
    """One open realtime session on a connection: output chunking and the per-session event sequence."""

    def __init__(self, conn: RealtimeConnection, voice: str, instructions: str):
        self.conn = conn
        self.id = f"duplex-{uuid.uuid4().hex}"
        self.voice, self.instructions = voice, instructions
        self.epoch = 0
        self.response_id = self._new_response_id()
        self.decoder = AppendDecoder()
        self.renderer = OutputRenderer(conn.server.config.content)
        self.ready: asyncio.Queue[bytes] = asyncio.Queue()
        self.generated_samples = 0
        self.sent_samples = 0
        self.pending_input_bytes = 0
        self.closed = False
        self.pump = asyncio.create_task(self._pump(), name=f"pump-{self.id}")

    def _new_response_id(self) -> str:
        return f"resp-{self.id}-{self.epoch}-{uuid.uuid4().hex[:8]}"

    def session_object(self) -> dict:
        caps = capabilities(self.conn.server.config.max_sessions)
        return {
            "object": "realtime.session", "type": "realtime", "id": self.id, "model": self.conn.model,
            "state": "open", "turn_state": "listening", "epoch": self.epoch, "turn_id": None,
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

    def accept_frames(self, frames, wire_bytes: int) -> None:
        """Schedule output frame k for input frame k on the shared worker (or after the processing delay)."""
        loop = asyncio.get_running_loop()
        share = wire_bytes / max(1, len(frames))
        if frames:
            self.pending_input_bytes += wire_bytes
        epoch = self.epoch
        for frame in frames:
            self.conn.state.frames += 1
            at = self.conn.server.worker.ready_at(loop.time())
            loop.call_at(at, self._deliver, epoch, self.renderer.render(frame), share)

    def _deliver(self, epoch: int, pcm: bytes, share: float) -> None:
        self.pending_input_bytes = max(0, self.pending_input_bytes - share)
        if not self.closed and epoch == self.epoch:
            self.generated_samples += len(pcm) // 2
            self.ready.put_nowait(pcm)

    async def _pump(self) -> None:
        """First ready frame alone, then `chunk_frames` per packet; flush a partial chunk after one idle period."""
        config = self.conn.server.config
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
        payload = b"".join(frames)
        first = self.sent_samples == 0
        self.sent_samples += len(payload) // 2
        rid = self.response_id
        await self.conn.send({
            "type": "response.output_audio.delta", "response_id": rid, "item_id": f"item_{rid}",
            "output_index": 0, "content_index": 0, "delta": _b64(payload), "format": "pcm16",
            "sample_rate_hz": SAMPLE_RATE_HZ,
            "metadata": {"session_id": self.id, "epoch": self.epoch, "model_speak": True, "end_of_turn": False,
                         "playback": self.playback(), "vllm_omni": data_plane_metadata(),
                         "audio_duration_ms": self.sent_samples * 1000 // SAMPLE_RATE_HZ, "audio_text_marks": []}})
        await self.conn.send({"type": "response.output_audio_transcript.delta", "response_id": rid,
                              "item_id": f"item_{rid}", "output_index": 0, "content_index": 0,
                              "delta": "Hello" if first else ""})

    async def cancel_response(self) -> None:
        """`response.cancel` / `output_audio_buffer.clear`: new epoch, drop queued output, start a new response."""
        done = {"type": "response.done", "response_id": self.response_id,
                "response": {"id": self.response_id, "object": "realtime.response", "status": "cancelled"}}
        self.epoch += 1
        while not self.ready.empty():
            self.ready.get_nowait()
        self.response_id = self._new_response_id()
        await self.conn.send(done)
        for event in self.response_events():
            await self.conn.send(event)

    async def stop(self) -> None:
        self.closed = True
        self.pump.cancel()
        await asyncio.wait([self.pump])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class RealtimeConnection:
    """§2-§4 for one WebSocket: first-message rules, admission, appends, close and disconnect cleanup."""

    def __init__(self, server: DuplexServer, websocket: ServerConnection, state: ConnectionState):
        self.server, self.websocket, self.state = server, websocket, state
        self.sequencer = EventSequencer()
        self.lock = asyncio.Lock()
        self.session: RealtimeSession | None = None
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
                idle = config.idle_timeout_s
                try:
                    async with asyncio.timeout(idle if idle > 0 else None):
                        raw = await self.websocket.recv()
                except TimeoutError:
                    await self.expire("idle_ttl_expired")
                    return
                message = await self.parse(raw)
                if message is not None and not await self.handle(message, len(raw)):
                    return
        except ConnectionClosed:
            return
        finally:
            await self.release()

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
        admission = self.server.admission
        if not admission.try_acquire():
            event = admission.exhausted_event()
            if client_event_id is not None:
                event["error"]["event_id"] = client_event_id
            await self.send(event)
            return True
        refused = open_error(session_payload)
        if refused is not None:
            admission.release()
            await self.send_error(*refused, client_event_id)
            return True
        self.session = RealtimeSession(self, session_payload.get("voice", DEFAULT_VOICE),
                                       session_payload.get("instructions") or DEFAULT_PERSONA)
        self.server.sessions_opened += 1
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
            reason = message.get("reason") if isinstance(message.get("reason"), str) else "client_close"
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
            code = "unknown_event" if kind not in IGNORED_CLIENT_EVENTS and not kind.startswith(
                ("input_audio_buffer.", "response.", "output_audio_buffer.")) else "unknown_session"
            await self.send_error(code, f"no open session for {kind}", client_event_id)
            return True
        if kind == "input_audio_buffer.append":
            if session.pending_input_bytes > MAX_PENDING_INPUT_BYTES:
                await self.send_error("input_backpressure", "pending input exceeds 16 MiB", client_event_id)
                return True
            frames, refused = session.decoder.decode(message)
            if refused is not None:
                await self.send_error(*refused, client_event_id)
                return True
            session.accept_frames(frames, wire_bytes)
            return True
        if kind in ("response.cancel", "output_audio_buffer.clear"):
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
        """Release first, then `session.closed`, then close 1000 with the reason (idempotent)."""
        session_id = self.session.id if self.session else None
        await self.release()
        await self.send({"type": "session.closed", "session_id": session_id, "reason": reason,
                         "event": {"type": "session.closed", "reason": reason}})
        await self.websocket.close(1000, reason)

    async def expire(self, reason: str) -> None:
        """No client message for the idle TTL: release, `session.expired`, close with reason `timeout`."""
        session_id = self.session.id if self.session else None
        await self.release()
        await self.send({"type": "session.expired", "session_id": session_id, "reason": reason})
        await self.websocket.close(1000, "timeout")

    async def release(self) -> None:
        if self.session is not None and not self.session.closed:
            await self.session.stop()
            self.server.admission.release()


class DuplexServer:
    """Serves one mode on host:port; `connections` holds every accepted connection's state, in accept order."""

    def __init__(self, config: ServerConfig, log: logging.Logger | None = None):
        self.config = config
        self.logger = log or logger
        self.connections: list[ConnectionState] = []
        self.admission = Admission(config.max_sessions)
        self.worker = SerialWorker(config)
        self.sessions_opened = 0
        self._server: Server | None = None
        self.fixture = None if config.mode == REALTIME else FixtureMode(config.mode)

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://{self.config.host}:{self.port}/v1/realtime"

    async def start(self) -> DuplexServer:
        self._server = await serve(self._handle, self.config.host, self.config.port, max_size=64 * 2**20,
                                   compression=None, process_request=self._check_path, logger=self.logger)
        return self

    async def close(self) -> None:
        if self._server is not None:
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
    p.add_argument("--idle-timeout-s", type=float, default=300.0)
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
    for name in ("processing_delay_ms", "frame_cost_ms", "jitter_ms"):
        value = getattr(args, name)
        if not 0 <= value < float("inf"):
            parser.error(f"--{name.replace('_', '-')} must be finite and non-negative, got {value}")
    if not 0 < args.slowdown < float("inf"):
        parser.error(f"--slowdown must be finite and positive, got {args.slowdown}")
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
