"""Lifecycle mode (spec §7): two sessions, an N+1 probe, slot recycle with a fresh replacement.

Lifecycle output (raw events, audio, raw errors) is deliberately unscrubbed and must never enter sweep storage.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from h3batch.loadrunner.acceptance import validate_session_audio
from h3batch.loadrunner.audio import (
    PCM16_FRAME_BYTES,
    append_message,
    input_identity,
    load_input_samples,
    split_frames,
    write_pcm16_wav,
)
from h3batch.loadrunner.config import DriverConfig
from h3batch.loadrunner.connection import DuplexConnection, open_connection
from h3batch.loadrunner.packets import check_packet, is_audio_event, probe_error_code
from h3batch.loadrunner.protocol import (
    LIFECYCLE_CAPABILITIES,
    SESSION_CLOSE,
    capabilities_match,
    created_capabilities,
    created_session_id,
    realtime_url,
    session_update,
)

logger = logging.getLogger("h3batch.loadrunner.lifecycle")
LIFECYCLE_CLOSE_TIMEOUT_S = 10.0


@dataclass
class Opened:
    conn: DuplexConnection
    session_id: str | None
    capabilities: dict | None
    frames_sent: int = 0


async def await_session_created(conn: DuplexConnection, config: DriverConfig, persona: str,
                                check: Callable[[], None] | None = None) -> dict:
    """Send `session.update` with `persona`, then return the `session.created` event once it arrives (§7, §8).

    The wait is bounded by config.timeout_s; `check` runs on every poll (load mode fails fast on a server error or a
    finished reader). Both modes open their sessions this way.
    """
    await conn.send(session_update(config.model, config.voice, persona), config.timeout_s)

    def created() -> bool:
        if check is not None:
            check()
        return conn.log.count("session.created") > 0

    await conn.wait_for(created, config.timeout_s, "session.created")
    return conn.log.first("session.created")


def valid_bytes(conn: DuplexConnection) -> int:
    """Total PCM16 bytes of valid packets so far; an invalid packet raises ValueError(<code>)."""
    total = 0
    for event in conn.log.events:
        if is_audio_event(event):
            result = check_packet(event)
            if result.code is not None:
                raise ValueError(result.code.value)
            total += len(result.payload)
    return total


class Lifecycle:
    def __init__(self, config: DriverConfig, log: logging.Logger):
        self.config, self.logger = config, log
        self.url = realtime_url(config.url, config.model)

    async def connect(self) -> DuplexConnection:
        websocket = await open_connection(self.url, LIFECYCLE_CLOSE_TIMEOUT_S, self.config.timeout_s)
        return DuplexConnection(websocket, self.logger)

    async def open(self, persona: str) -> Opened:
        conn = await self.connect()
        event = await await_session_created(conn, self.config, persona)
        caps = created_capabilities(event)
        if caps is None:
            raise AssertionError(f"session.created omitted capabilities: {event}")
        return Opened(conn, created_session_id(event), caps)

    async def probe_overflow(self) -> object:
        conn = await self.connect()
        try:
            await conn.send(session_update(self.config.model, self.config.voice, self.config.persona),
                            self.config.timeout_s)
            await conn.wait_for(lambda: bool(conn.log.errors()), self.config.timeout_s, "error")
            event = conn.log.errors()[0]
        finally:
            await conn.close(LIFECYCLE_CLOSE_TIMEOUT_S)  # transport only: the probe never opened a session
        code = probe_error_code(event)
        if code != "resource_exhausted":
            raise AssertionError(f"overflow session was not rejected: {event}")
        return code

    async def stream(self, session: Opened, messages: list[str]) -> None:
        """Send, then sleep 80 ms, per frame."""
        for text in messages:
            await session.conn.send(text, self.config.timeout_s)
            session.frames_sent += 1
            await asyncio.sleep(0.080)

    async def wait_coverage(self, session: Opened, label: str) -> None:
        target = session.frames_sent - self.config.max_frame_deficit
        await session.conn.wait_for(lambda: valid_bytes(session.conn) // PCM16_FRAME_BYTES >= target,
                                    self.config.timeout_s, label)

    async def close(self, session: Opened) -> None:
        await session.conn.send(SESSION_CLOSE, self.config.timeout_s)
        await session.conn.wait_for(lambda: session.conn.log.count("session.closed") > 0, self.config.timeout_s,
                                    "session.closed")
        await session.conn.close(LIFECYCLE_CLOSE_TIMEOUT_S)

    def validate(self, session: Opened, minimum_chunks: int) -> dict:
        return validate_session_audio(session.conn.log.events, session.frames_sent, minimum_chunks,
                                      self.config.acceptance)

    @staticmethod
    def save(session: Opened, out_dir: Path, role: str) -> None:
        with open(out_dir / f"{role}-events.jsonl", "w", encoding="utf-8") as handle:
            for event in session.conn.log.events:
                handle.write(json.dumps(event, ensure_ascii=False) + "\n")
        packets_pcm = b"".join(check_packet(e).payload for e in session.conn.log.events if is_audio_event(e))
        write_pcm16_wav(out_dir / f"{role}-output.wav", packets_pcm)

    async def run(self) -> dict:
        cfg = self.config
        if cfg.replacement_frames < 0:
            raise ValueError(f"max_frames must be non-negative, got {cfg.replacement_frames}")
        identity = input_identity(cfg.input_wav, cfg.expected_input_sha256)
        samples = load_input_samples(cfg.input_wav, cfg.tail_s)
        messages = [append_message(seq, frame) for seq, frame in enumerate(split_frames(samples))]
        out_dir = Path(cfg.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        opened: list[Opened] = []
        try:
            primary = await self.open(cfg.persona)
            opened.append(primary)
            secondary = await self.open(cfg.secondary_persona)
            opened.append(secondary)
            ids = [primary.session_id, secondary.session_id]
            if None in ids or ids[0] == ids[1]:
                raise AssertionError(f"server did not allocate distinct session ids: {ids}")
            if primary.capabilities != secondary.capabilities:
                raise AssertionError("concurrent sessions returned different capabilities")
            if not capabilities_match(primary.capabilities, LIFECYCLE_CAPABILITIES):
                raise AssertionError(f"unexpected PersonaPlex capabilities: {primary.capabilities}")
            overflow_code = await self.probe_overflow()

            await asyncio.gather(self.stream(primary, messages), self.stream(secondary, messages))
            await self.wait_coverage(primary, "primary frame coverage")
            await self.wait_coverage(secondary, "secondary frame coverage")
            await asyncio.sleep(cfg.drain_s)
            primary_stats = self.validate(primary, cfg.minimum_audio_chunks)
            secondary_stats = self.validate(secondary, cfg.minimum_audio_chunks)
            if set(primary_stats["response_ids"]) & set(secondary_stats["response_ids"]):
                raise AssertionError("concurrent sessions shared a response id")
            self.save(primary, out_dir, "primary")
            await self.close(primary)
            opened.remove(primary)

            replacement = await self.open(cfg.replacement_persona)
            opened.append(replacement)
            if replacement.session_id is None or replacement.session_id in ids:
                raise AssertionError(
                    f"replacement session id was not freshly allocated: {[*ids, replacement.session_id]}")
            if replacement.capabilities != primary.capabilities:
                raise AssertionError("replacement session returned different capabilities")
            limit = cfg.replacement_frames or len(messages)
            frames_before = secondary.frames_sent
            await asyncio.gather(self.stream(secondary, messages[:limit]), self.stream(replacement, messages[:limit]))
            await self.wait_coverage(secondary, "survivor frame coverage after slot recycle")
            await self.wait_coverage(replacement, "replacement frame coverage")
            await asyncio.sleep(cfg.drain_s)
            survivor_stats = self.validate(secondary, cfg.minimum_audio_chunks + 1)
            replacement_stats = self.validate(replacement, 1)
            if survivor_stats["response_ids"] != secondary_stats["response_ids"]:
                raise AssertionError("survivor response changed while another session slot was recycled")
            used = set(primary_stats["response_ids"]) | set(survivor_stats["response_ids"])
            if used & set(replacement_stats["response_ids"]):
                raise AssertionError("replacement session reused another session's response id")
            self.save(secondary, out_dir, "secondary")
            self.save(replacement, out_dir, "replacement")
            await asyncio.gather(self.close(secondary), self.close(replacement))
            opened.clear()
            errors = primary.conn.log.errors() + secondary.conn.log.errors() + replacement.conn.log.errors()
            result = {
                "ok": not errors,
                "model": cfg.model,
                "input": {"path": identity.path, "sha256": identity.sha256, "tail_s": cfg.tail_s},
                "capabilities": primary.capabilities,
                "overflow_error_code": overflow_code,
                "primary": {"session_id": primary.session_id, "input_frames": primary.frames_sent, **primary_stats},
                "secondary": {"session_id": secondary.session_id, "input_frames": secondary.frames_sent,
                              "continuation_frames_after_recycle": secondary.frames_sent - frames_before,
                              **survivor_stats},
                "replacement": {"session_id": replacement.session_id, "input_frames": replacement.frames_sent,
                                **replacement_stats},
                "errors": errors,
                "output_dir": str(out_dir.resolve()),
            }
            (out_dir / "result.json").write_text(json.dumps(result, indent=2, ensure_ascii=False, allow_nan=False),
                                                 encoding="utf-8")
            if errors:
                raise RuntimeError(f"Realtime sessions emitted errors: {errors}")
            return result
        finally:
            for session in opened:
                await session.conn.close(LIFECYCLE_CLOSE_TIMEOUT_S)


async def run_lifecycle(config: DriverConfig, log: logging.Logger | None = None) -> dict:
    return await Lifecycle(config, log or logger).run()
