"""The reference server's fault modes (spec §13 "fixture modes"): a pure reply function per client message.

Each mode deviates from `success` in one way so the end-to-end matrix can prove one driver behaviour per mode.
`ConnectionState` is the per-connection record tests inspect, shared with the realtime mode.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from enum import Enum

import numpy as np

from h3batch.loadrunner.audio import FRAME_SAMPLES


class FixtureMode(str, Enum):
    SUCCESS = "success"
    REJECT_SECOND = "reject_second"
    MISSING_CAPABILITIES = "missing_capabilities"
    SILENT = "silent"
    DISCONNECT = "disconnect"
    BAD_JSON = "bad_json"
    SHORT_AUDIO = "short_audio"
    LATE_ON_CLOSE = "late_on_close"
    ERROR_ON_CLOSE = "error_on_close"
    NO_CLOSE_ACK = "no_close_ack"
    SHARED_RESPONSE = "shared_response"
    PRIVATE_METADATA = "private_metadata"
    LEGACY_AUDIO_EVENT = "legacy_audio_event"
    MISSING_PACKET_RATE = "missing_packet_rate"
    STRING_PACKET_RATE = "string_packet_rate"
    INVALID_BASE64 = "invalid_base64"
    ORPHAN_AUDIO = "orphan_audio"
    ODD_PACKET = "odd_packet"


FIXTURE_AMPLITUDE = 2000  # int16; RMS 2000/32768 ≈ 0.0610
PRIVATE_MARKER = "must-not-be-exported"
PRIVATE_METADATA_MARKER = "remote-detail-must-not-be-exported"
SILENT_MODES = frozenset({FixtureMode.SILENT, FixtureMode.LATE_ON_CLOSE})


@dataclass
class ConnectionState:
    """What tests inspect per accepted connection: accept order, handler exit, frames counted, close requested."""

    index: int
    closed: bool = False
    frames: int = 0
    close_requested: bool = False
    packets_sent: int = 0


@dataclass(frozen=True)
class Reply:
    """One action for the handler: send `text`, or close the socket when `close` is set."""

    text: str | None = None
    close: bool = False


def pcm(frames: int) -> bytes:
    return np.full(frames * FRAME_SAMPLES, FIXTURE_AMPLITUDE, dtype="<i2").tobytes()


def _packet(mode: FixtureMode, response_id: str | None, payload: bytes, ordinal: int) -> dict:
    """A normal packet, bent by modes that corrupt the 2nd packet (ordinal 1) or every packet."""
    if mode is FixtureMode.ODD_PACKET:
        payload = payload + b"\x00" if ordinal == 0 else payload[:-1]
    delta = base64.b64encode(payload).decode("ascii")
    if mode is FixtureMode.INVALID_BASE64 and ordinal == 1:
        delta = "!" + delta
    event: dict = {"type": "response.audio.delta" if mode is FixtureMode.LEGACY_AUDIO_EVENT
                   else "response.output_audio.delta"}
    if response_id is not None:
        event["response_id"] = response_id
    event["delta"] = delta
    event["sample_rate_hz"] = 24000
    if ordinal == 1 and mode is FixtureMode.MISSING_PACKET_RATE:
        del event["sample_rate_hz"]
    if ordinal == 1 and mode is FixtureMode.STRING_PACKET_RATE:
        event["sample_rate_hz"] = "24000"
    if mode is FixtureMode.PRIVATE_METADATA:
        event["metadata"] = {"vllm_omni": {"private": PRIVATE_METADATA_MARKER}}
    else:
        event["metadata"] = {"vllm_omni": {"runtime_impl": "scheduler_data_plane",
                                           "uses_model_runner_scheduler": True, "runner_kv_backed": True}}
    return event


def _send(event: dict) -> Reply:
    return Reply(text=json.dumps(event))


def fixture_replies(mode: FixtureMode, state: ConnectionState, message: dict,
                    fault_index: int = 1) -> list[Reply]:
    """Replies of fixture `mode` to one parsed client message on connection `state` (which it updates)."""
    kind = message.get("type")
    rid = "shared" if mode is FixtureMode.SHARED_RESPONSE else f"r-{state.index}"
    if kind == "session.update":
        if mode is FixtureMode.REJECT_SECOND and state.index == fault_index:
            return [_send({"type": "error", "error": {"code": "resource_exhausted"}})]
        if mode is FixtureMode.MISSING_CAPABILITIES:
            return [_send({"type": "session.created", "session": {"resume_token": PRIVATE_MARKER}})]
        return [_send({"type": "session.created", "session": {
                    "resume_token": PRIVATE_MARKER,
                    "capabilities": {"chunk_period_ms": 80, "supports_multi_session_same_replica": True}}}),
                _send({"type": "response.created", "response": {"id": rid}})]
    if kind == "input_audio_buffer.append":
        state.frames += 1
        if mode is FixtureMode.DISCONNECT:
            return [Reply(close=True)]
        if mode in SILENT_MODES:
            return []
        if mode is FixtureMode.BAD_JSON:
            return [Reply(text="{")]
        if mode is FixtureMode.SHORT_AUDIO and state.frames == 2:
            return []
        replies = []
        if mode is FixtureMode.ORPHAN_AUDIO and state.packets_sent == 1:
            replies.append(_send(_packet(FixtureMode.SUCCESS, None, pcm(1), 0)))
        replies.append(_send(_packet(mode, rid, pcm(1), state.packets_sent)))
        state.packets_sent += 1
        return replies
    if kind in ("session.close", "close", "close_session"):
        state.close_requested = True
        if mode is FixtureMode.NO_CLOSE_ACK:
            return []
        replies = []
        if mode is FixtureMode.LATE_ON_CLOSE:
            replies.append(_send(_packet(FixtureMode.SUCCESS, rid, pcm(state.frames), 0)))
        if mode is FixtureMode.ERROR_ON_CLOSE:
            replies.append(_send({"type": "error", "error": {"code": "cleanup_failed"}}))
        replies.append(_send({"type": "session.closed"}))
        return replies
    return []
