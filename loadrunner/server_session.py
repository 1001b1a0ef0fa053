"""One realtime session of the reference server: its state, output chunking and pacing, activity clock, cleanup.

`SerialWorker` is the emulated shared compute every session's output frames queue on (`frame_cost_ms` each), so
sessions slow each other down as they would on one accelerator. `DuplexServer` owns both and decides when a session
ends; a session only knows its connection, to send on, while the transport is attached.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import random
import uuid
from typing import TYPE_CHECKING

from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.audio import FRAME_PERIOD_S, SAMPLE_RATE_HZ
from h3batch.loadrunner.server_config import ServerConfig
from h3batch.loadrunner.server_protocol import (
    AppendDecoder,
    OutputRenderer,
    SessionState,
    capabilities,
    data_plane_metadata,
)

if TYPE_CHECKING:  # the connection creates sessions; a session sees it only as the transport it sends on
    from h3batch.loadrunner.server_connection import RealtimeConnection

logger = logging.getLogger("h3batch.loadrunner.server_session")


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

    def __init__(self, conn: RealtimeConnection, config: ServerConfig, worker: SerialWorker, session_id: str,
                 voice: str, instructions: str, idle_timeout_s: float | None = None):
        self.conn: RealtimeConnection | None = conn  # None once the transport dropped
        self.config, self.worker = config, worker
        self.id = session_id
        self.voice, self.instructions = voice, instructions
        self.idle_timeout_s = idle_timeout_s  # the session's own transport idle limit, if it set one
        self.state = SessionState.OPEN
        self.epoch = 0
        self.response_id = self._new_response_id()
        self.decoder = AppendDecoder()
        self.renderer = OutputRenderer(config.content)
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
        caps = capabilities(self.config.max_sessions)
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
            at = self.worker.ready_at(loop.time())
            loop.call_at(at, self._deliver, epoch, self.renderer.render(frame), share)

    def _deliver(self, epoch: int, pcm: bytes, share: float) -> None:
        self.pending_input_bytes = max(0, self.pending_input_bytes - share)
        if not self.closed and epoch == self.epoch:
            self.generated_samples += len(pcm) // 2
            self.ready.put_nowait(pcm)

    async def _pump(self) -> None:
        """First ready frame alone, then `chunk_frames` per packet; flush a partial chunk after one idle period."""
        config = self.config
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
        if self.cleanup_attempts <= self.config.cleanup_failures:
            return False
        self.decoder.clear()
        self.pending_input_bytes = 0.0
        return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")

