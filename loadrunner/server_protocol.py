"""Reference server protocol pieces (spec §2-§4, §15.2) without I/O: events, errors, admission, audio decoding.

`server_connection` and `server_session` wrap these in websockets handlers; everything that decides what to say
lives here.
"""
from __future__ import annotations

import base64
import binascii
import math
import uuid
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from h3batch.loadrunner.audio import FRAME_SAMPLES, SAMPLE_RATE_HZ

BUNDLED_VOICES = frozenset(
    [f"NATF{i}.pt" for i in range(4)] + [f"NATM{i}.pt" for i in range(4)]
    + [f"VARF{i}.pt" for i in range(5)] + [f"VARM{i}.pt" for i in range(5)])
DEFAULT_VOICE = "NATF2.pt"
DEFAULT_PERSONA = "You are a helpful assistant."
SERVER_OWNED_KEYS = frozenset({"personaplex_prefill_slots", "personaplex_model_path", "personaplex_voice_prompt",
                               "personaplex_persona"})
MAX_CLIENT_FRAME_BYTES = 15 * 2**20
MAX_PENDING_INPUT_BYTES = 16 * 2**20

ERROR_TYPES = {
    "resource_exhausted": "rate_limit_error",
    "input_backpressure": "rate_limit_error",
    "runtime_append_failed": "server_error",
}
RETRYABLE = frozenset({"resource_exhausted", "input_backpressure"})

TRUE_CAPABILITIES = ("model_native_turn_policy", "playback_ack", "input_append", "session_adapter",
                     "model_internal_state", "stage_resumption", "core_resumable_request", "stage_connector_handoff",
                     "independent_io_streams", "realtime_endpoint", "session_lease")
FALSE_CAPABILITIES = ("external_turn_signal", "client_commit", "replace_latest_chunk", "reencode_context",
                      "rollback_to_checkpoint", "turn_commit_only", "kv_lease", "core_kv_lease",
                      "scheduler_native_append", "overlapped_commit", "session_resume", "audio_truncate",
                      "image_input", "text_only_turn")
IGNORED_CLIENT_EVENTS = frozenset({
    "input.text.append", "turn.signal", "response.create",
    "conversation.item.create", "conversation.item.delete", "conversation.item.truncate", "conversation.item.retrieve",
    "playback.ack", "audio.playback_ack", "input_audio_buffer.commit", "input.commit"})
CLOSE_TYPES = frozenset({"session.close", "close", "close_session"})
# Events that start a new epoch (§3.1): response cancel, output clear, input cancel, barge-in.
NEW_EPOCH_TYPES = frozenset({"response.cancel", "output_audio_buffer.clear", "input.cancel", "barge_in"})


def error_type(code: str) -> str:
    return ERROR_TYPES.get(code, "invalid_request_error")


def capabilities(max_sessions: int) -> dict:
    """§4.3 capability object; the multi-session flags are true only with more than one slot."""
    multi = max_sessions > 1
    caps: dict = {
        "implementation_level": "model_native_duplex",
        "chunk_period_ms": 80,
        "supports_multi_session": multi,
        "supports_multi_session_same_replica": multi,
        "supports_barge_in": False,
    }
    caps.update({f"supports_{name}": True for name in TRUE_CAPABILITIES})
    caps.update({"requires_model_runner_kv": True, "requires_native_stage_role": True})
    caps.update({f"supports_{name}": False for name in FALSE_CAPABILITIES})
    caps.update({
        "session_admission_mode": "engine_managed",
        "required_input_modalities": ["audio"],
        "optional_input_modalities": ["video"],
        "adapter_patterns": ["scheduler_data_plane"],
        "stage_handoff_transport": "scheduler_data_plane",
        "input_modes": ["append_audio_chunk"],
        "signal_sources": ["model_native", "client_event"],
        "target_barge_in_latency_ms": None,
    })
    return caps


def new_event_id() -> str:
    return f"event_{uuid.uuid4().hex}"


@dataclass
class EventSequencer:
    """Stamps `event_id` and an increasing `server_event_seq` (from 1) on every event but `session.created`."""

    seq: int = 0

    def stamp(self, event: dict) -> dict:
        stamped = {"type": event["type"], "event_id": new_event_id()}
        if event["type"] != "session.created":
            self.seq += 1
            stamped["server_event_seq"] = self.seq
        stamped.update({k: v for k, v in event.items() if k != "type"})
        return stamped


def error_event(code: str, message: str, client_event_id: str | None = None, param: str | None = None) -> dict:
    error: dict = {"type": error_type(code), "code": code, "message": message}
    if client_event_id is not None:
        error["event_id"] = client_event_id
    if param is not None:
        error["param"] = param
    if code in RETRYABLE:
        error["retryable"] = True
    return {"type": "error", "error": error}


class SessionState(str, Enum):
    """§3.1 session states: `closing` lasts from close/disconnect until cleanup finished (the slot still counts)."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Admission:
    """Slot accounting for `max_sessions` (§3.2): admitted = live sessions (open, or closing with unfinished
    cleanup) + opens in progress. Release is by session id, so a repeated close can never free a second slot."""

    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self.opening = 0
        self.live: set[str] = set()
        self.issued: set[str] = set()  # every id ever admitted: ids are never reused

    @property
    def held(self) -> int:
        return len(self.live) + self.opening

    def try_reserve(self) -> bool:
        """Hold a slot for an open in progress; False when every slot is taken."""
        if self.held >= self.max_sessions:
            return False
        self.opening += 1
        return True

    def abandon(self) -> None:
        """An open in progress failed before it produced a session."""
        self.opening = max(0, self.opening - 1)

    def commit(self, session_id: str) -> bool:
        """Turn the reservation into live session `session_id`; False (reservation dropped) for a reused id."""
        self.abandon()
        if session_id in self.issued:
            return False
        self.issued.add(session_id)
        self.live.add(session_id)
        return True

    def release(self, session_id: str) -> None:
        self.live.discard(session_id)

    def exhausted_event(self) -> dict:
        return error_event("resource_exhausted", f"duplex_session_capacity_exhausted: limit={self.max_sessions}")


def _owned_keys_error(session: dict) -> tuple[str, str] | None:
    extra = session.get("extra_body") or {}
    if not isinstance(extra, dict):
        return "invalid_session_config", "extra_body must be an object"
    owned = sorted(SERVER_OWNED_KEYS & set(extra))
    if owned:
        return "invalid_session_config", f"server-owned keys are not accepted in extra_body: {owned}"
    return None


def open_error(session: object) -> tuple[str, str] | None:
    """(code, message) when a first `session.update` payload must be refused, else None."""
    if not isinstance(session, dict):
        return "invalid_session_config", "session must be an object"
    voice = session.get("voice", DEFAULT_VOICE)
    if not isinstance(voice, str) or voice not in BUNDLED_VOICES:
        return "invalid_voice", f"voice must be one of the bundled basenames, got {voice!r}"
    owned = _owned_keys_error(session)
    if owned is not None:
        return owned
    idle = session.get("idle_timeout_s")
    if idle is not None and (type(idle) not in (int, float) or not 0 <= idle < math.inf):
        return "invalid_session_config", f"idle_timeout_s must be a finite number >= 0, got {idle!r}"
    rate = session.get("sample_rate_hz", SAMPLE_RATE_HZ)
    if rate != SAMPLE_RATE_HZ:
        return "unsupported_audio_format", f"sample_rate_hz must be {SAMPLE_RATE_HZ}, got {rate!r}"
    fmt = session.get("input_audio_format", "pcm_f32le")
    if fmt != "pcm_f32le":
        return "unsupported_audio_format", f"input_audio_format must be pcm_f32le, got {fmt!r}"
    return None


def update_error(opened: dict, session: object) -> tuple[str, str] | None:
    """A later `session.update` may not change voice or persona."""
    if not isinstance(session, dict):
        return "invalid_session_config", "session must be an object"
    if "voice" in session and session["voice"] != opened["voice"]:
        return "voice_update_unsupported", "voice cannot change after the session opened"
    if "instructions" in session and (session["instructions"] or DEFAULT_PERSONA) != opened["instructions"]:
        return "persona_update_unsupported", "instructions cannot change after the session opened"
    return _owned_keys_error(session)


@dataclass
class AppendDecoder:
    """Validates appends and cuts them into whole 1920-sample frames; a rate change mid-session is refused."""

    rate: int | None = None
    residual: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))

    def decode(self, message: dict) -> tuple[list[np.ndarray], tuple[str, str] | None]:
        """(new whole frames, error) for one append message."""
        audio = message.get("audio", message.get("delta"))
        fmt = message.get("format", message.get("input_audio_format", "pcm_f32le"))
        rate = message.get("sample_rate_hz", message.get("sample_rate", SAMPLE_RATE_HZ))
        if fmt != "pcm_f32le":
            return [], ("unsupported_audio_format", f"format must be pcm_f32le, got {fmt!r}")
        if type(rate) is not int or rate != SAMPLE_RATE_HZ or (self.rate is not None and rate != self.rate):
            return [], ("runtime_append_failed", f"sample rate must stay {SAMPLE_RATE_HZ}, got {rate!r}")
        self.rate = rate
        if not isinstance(audio, str):
            return [], ("bad_audio", "audio must be a base64 string")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            return [], ("bad_audio", "audio is not valid base64")
        if len(raw) % 4:
            return [], ("bad_audio", f"pcm_f32le byte length must be a multiple of 4, got {len(raw)}")
        samples = np.frombuffer(raw, dtype="<f4")
        if not np.all(np.isfinite(samples)):
            return [], ("bad_audio", "audio contains non-finite samples")
        buffered = np.concatenate([self.residual, samples])
        whole = len(buffered) // FRAME_SAMPLES
        self.residual = buffered[whole * FRAME_SAMPLES:]
        return [buffered[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES] for i in range(whole)], None

    def clear(self) -> None:
        self.residual = np.zeros(0, dtype=np.float32)


class Content(str, Enum):
    ECHO = "echo"
    TONE = "tone"


@dataclass
class OutputRenderer:
    """Output frame k from input frame k: echo (clip, x32767, round) or a continuous 440 Hz sine at 0.1."""

    content: Content
    phase_samples: int = 0

    def render(self, frame: np.ndarray) -> bytes:
        if self.content is Content.ECHO:
            pcm = np.round(np.clip(frame.astype(np.float64), -1.0, 1.0) * 32767.0).astype("<i2")
        else:
            t = (self.phase_samples + np.arange(FRAME_SAMPLES)) / SAMPLE_RATE_HZ
            pcm = np.round(0.1 * 32767.0 * np.sin(2 * math.pi * 440.0 * t)).astype("<i2")
        self.phase_samples += FRAME_SAMPLES
        return pcm.tobytes()


def data_plane_metadata() -> dict:
    return {"runtime_impl": "scheduler_data_plane", "owned_runtime": True, "model_turn_id": None,
            "uses_model_runner_scheduler": True, "runner_kv_backed": True, "stage_metrics": {}}
