"""Acceptance checks over one session's received events (spec §6); pure functions.

The first failing check raises `AcceptanceError` (an AssertionError) carrying its code, a message built from local
numbers only (never remote metadata or ids, §11) and the stats computed so far.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from h3batch.loadrunner.audio import FRAME_SAMPLES
from h3batch.loadrunner.packets import check_packet, is_audio_event


class AcceptanceCode(str, Enum):
    """Acceptance checks in the order they run."""

    PCM16_OUTPUT = "pcm16_output"
    AUDIO_RMS = "audio_rms"
    SAMPLE_RATE = "sample_rate"
    INPUT_FRAMES = "input_frames"
    WHOLE_CODEC_FRAMES = "whole_codec_frames"
    AUDIO_CHUNKS = "audio_chunks"
    FRAME_DEFICIT = "frame_deficit"
    VOICED_FRAMES = "voiced_frames"
    SCHEDULER_DATA_PLANE = "scheduler_data_plane"
    RESPONSE_IDENTITY = "response_identity"


class AcceptanceError(AssertionError):
    """A failed acceptance check: `code`, local-numbers-only `message`, and `stats` computed so far."""

    def __init__(self, code: AcceptanceCode, message: str, stats: dict):
        super().__init__(message)
        self.code = code
        self.message = message
        self.stats = dict(stats)


@dataclass(frozen=True)
class AcceptanceConfig:
    """Thresholds of §6 with the CLI defaults."""

    max_frame_deficit: int = 4
    min_voiced_frames: int = 5
    minimum_audio_chunks: int = 2
    voiced_frame_rms_threshold: float = 1e-3


SILENCE_RMS = 1e-5


def frame_stats(pcm: np.ndarray, input_frames: int, voiced_threshold: float) -> dict:
    """Per-80-ms-frame counts of int16 `pcm` against `input_frames` sent: frames, voiced, silent, deficit, coverage."""
    output_frames = len(pcm) // FRAME_SAMPLES
    frames = pcm[: output_frames * FRAME_SAMPLES].astype(np.float64).reshape(output_frames, FRAME_SAMPLES) / 32768.0
    rms = np.sqrt(np.mean(np.square(frames), axis=1)) if output_frames else np.zeros(0)
    voiced = int(np.count_nonzero(rms >= voiced_threshold))
    return {
        "output_frames": output_frames,
        "voiced_frames": voiced,
        "silent_frames": output_frames - voiced,
        "frame_deficit": int(input_frames - output_frames),
        "frame_coverage_ratio": output_frames / input_frames if input_frames else None,
    }


def _proves_data_plane(event: dict) -> bool:
    metadata = event.get("metadata")
    plane = metadata.get("vllm_omni") if isinstance(metadata, dict) else None
    return (isinstance(plane, dict) and plane.get("runtime_impl") == "scheduler_data_plane"
            and plane.get("uses_model_runner_scheduler") is True and plane.get("runner_kv_backed") is True)


def validate_session_audio(events: list[dict], input_frames: int, minimum_chunks: int,
                           config: AcceptanceConfig) -> dict:
    """Validate all packets (ValueError(<code>) on the first invalid one), then run checks 1-10 in order.

    Returns the stats plus sorted `response_ids`; raises AcceptanceError on the first failing check.
    """
    audio_events = [e for e in events if is_audio_event(e)]
    chunks: list[bytes] = []
    for event in audio_events:
        result = check_packet(event)
        if result.code is not None:
            raise ValueError(result.code.value)
        if result.payload:
            chunks.append(result.payload)
    raw = b"".join(chunks)
    stats: dict = {"audio_chunks": len(chunks), "audio_samples": len(raw) // 2}

    if not raw or len(raw) % 2:
        raise AcceptanceError(AcceptanceCode.PCM16_OUTPUT,
                              f"invalid PCM16 output: chunks={len(chunks)}, bytes={len(raw)}", stats)
    pcm = np.frombuffer(raw, dtype="<i2")
    scaled = pcm.astype(np.float64) / 32768.0
    rms = float(np.sqrt(np.mean(np.square(scaled))))
    stats["audio_rms"] = rms
    if not np.all(np.isfinite(scaled)) or not math.isfinite(rms) or rms <= SILENCE_RMS:
        raise AcceptanceError(AcceptanceCode.AUDIO_RMS,
                              f"output audio is non-finite or silent: samples={len(pcm)}, rms={rms}", stats)
    rates = {e.get("sample_rate_hz") for e in audio_events if type(e.get("sample_rate_hz")) is int}
    if rates != {24_000}:
        raise AcceptanceError(AcceptanceCode.SAMPLE_RATE, f"unexpected output sample rates: {sorted(rates)}", stats)
    if input_frames < 1:
        raise AcceptanceError(AcceptanceCode.INPUT_FRAMES,
                              f"audio received without input frames: input={input_frames}", stats)
    if len(pcm) % FRAME_SAMPLES:
        raise AcceptanceError(AcceptanceCode.WHOLE_CODEC_FRAMES,
                              "PersonaPlex output must contain whole 80 ms codec frames: "
                              f"samples={len(pcm)}, samples_per_frame={FRAME_SAMPLES}", stats)
    stats.update(frame_stats(pcm, input_frames, config.voiced_frame_rms_threshold))
    if len(chunks) < minimum_chunks:
        raise AcceptanceError(AcceptanceCode.AUDIO_CHUNKS,
                              f"insufficient audio chunks: chunks={len(chunks)}, minimum={minimum_chunks}", stats)
    if not 0 <= stats["frame_deficit"] <= config.max_frame_deficit:
        raise AcceptanceError(AcceptanceCode.FRAME_DEFICIT,
                              f"invalid synchronous frame accounting: input={input_frames}, "
                              f"maximum_deficit={config.max_frame_deficit}, stats={stats}", stats)
    if config.min_voiced_frames < 1:
        raise ValueError(f"min_voiced_frames must be positive, got {config.min_voiced_frames}")
    if stats["voiced_frames"] < config.min_voiced_frames:
        raise AcceptanceError(AcceptanceCode.VOICED_FRAMES,
                              "output contained insufficient audible speech: "
                              f"minimum_voiced_frames={config.min_voiced_frames}, stats={stats}", stats)
    if not any(_proves_data_plane(e) for e in audio_events):
        raise AcceptanceError(AcceptanceCode.SCHEDULER_DATA_PLANE,
                              "audio events did not prove the scheduler data plane", stats)
    ids = {e["response_id"] for e in audio_events if isinstance(e.get("response_id"), str) and e["response_id"]}
    if len(ids) != 1:
        raise AcceptanceError(AcceptanceCode.RESPONSE_IDENTITY,
                              f"continuous stream requires one response: count={len(ids)}", stats)
    return {**stats, "response_ids": sorted(ids)}
