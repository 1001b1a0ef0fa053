"""A sweep request (spec §15.1): grid of session counts × load frames × repetitions against one server URL.

Stdlib only: the API validates requests with this module (and the driver's own argument rules in `config`) before
anything is queued, so a bad grid is refused at the door rather than failing inside the worker.
"""
from __future__ import annotations

import math
import re
import uuid
from dataclasses import asdict, dataclass, field

from h3batch.loadrunner.config import MAX_LOAD_FRAMES, MAX_SESSIONS, build_parser, validation_error

MAX_POINTS = 256
LABEL_RE = re.compile(r"^[\w.:/@+-]{1,128}$")
INPUT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\.wav$")
"""`input_wav` is a name in the named input set (H3BATCH_SWEEP_INPUTS_DIR), never a path on the worker."""


@dataclass(frozen=True)
class SweepRequest:
    """The validated body of POST /sweeps (also a schedule entry's `sweep`)."""

    url: str
    sessions: tuple[int, ...]
    load_frames: tuple[int, ...] = (250,)
    repetitions: int = 1
    model: str = "reference-duplex"
    input_wav: str | None = None  # a name in the input set; None: the worker writes its built-in 220 Hz input
    expected_input_sha256: str | None = None
    drain_s: float = 2.0
    tail_s: float = 0.0
    timeout_s: float = 30.0
    cleanup_timeout_s: float = 5.0
    max_frame_deficit: int = 4
    min_voiced_frames: int = 5
    minimum_audio_chunks: int = 2
    voiced_frame_rms_threshold: float = 1e-3
    max_client_rtf: float | None = None
    max_stream_rtf: float | None = None
    max_lag_drift_ms: float | None = None
    labels: dict = field(default_factory=dict)  # server_revision, server_hardware, free-form operator labels

    def to_dict(self) -> dict:
        data = asdict(self)
        data["sessions"], data["load_frames"] = list(self.sessions), list(self.load_frames)
        return data


@dataclass(frozen=True)
class Point:
    """One grid element × repetition; `id` is deterministic so a re-run finds the same directory."""

    id: str
    sessions: int
    load_frames: int
    repetition: int


def points(request: SweepRequest) -> list[Point]:
    """Points ordered by load frames, then session count, then repetition."""
    return [Point(f"n{n:02d}-f{frames}-r{rep}", n, frames, rep)
            for frames in request.load_frames for n in request.sessions for rep in range(request.repetitions)]


def new_sweep_id() -> str:
    return f"sw_{uuid.uuid4().hex[:16]}"


def driver_argv(request: SweepRequest, point: Point, input_wav: str, output_dir: str) -> list[str]:
    """The `h3batch duplex` arguments of one point (the worker runs the same configuration in-process).

    Every value rides in its option as `--name=value`: argparse reads a separate value that starts with `-` (a
    `tail_s` of -1e+16, a model or label `-x`) as an option and exits, which in the API would end the process
    instead of answering 400 invalid_sweep."""
    options = [("--url", request.url), ("--model", request.model), ("--input-wav", input_wav),
               ("--output-dir", output_dir), ("--sessions", point.sessions), ("--load-frames", point.load_frames),
               ("--drain-s", repr(request.drain_s)), ("--tail-s", repr(request.tail_s)),
               ("--timeout-s", repr(request.timeout_s)), ("--cleanup-timeout-s", repr(request.cleanup_timeout_s)),
               ("--max-frame-deficit", request.max_frame_deficit),
               ("--min-voiced-frames", request.min_voiced_frames),
               ("--minimum-audio-chunks", request.minimum_audio_chunks),
               ("--voiced-frame-rms-threshold", repr(request.voiced_frame_rms_threshold))]
    for flag, value in (("--max-client-rtf", request.max_client_rtf), ("--max-stream-rtf", request.max_stream_rtf),
                        ("--max-lag-drift-ms", request.max_lag_drift_ms)):
        if value is not None:
            options.append((flag, repr(value)))
    if request.expected_input_sha256:
        options.append(("--expected-input-sha256", request.expected_input_sha256))
    if request.labels.get("server_revision"):
        options.append(("--server-revision", request.labels["server_revision"]))
    if request.labels.get("server_hardware"):
        options.append(("--server-hardware", request.labels["server_hardware"]))
    return [f"{flag}={value}" for flag, value in options]


def _int_list(body: dict, key: str, default: tuple[int, ...] | None, low: int, high: int) -> tuple[int, ...]:
    value = body.get(key, list(default) if default is not None else None)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
        raise ValueError(f"`{key}` must be a non-empty list of integers, got {value!r}")
    if any(not low <= v <= high for v in value):
        raise ValueError(f"`{key}` values must be in [{low},{high}], got {value!r}")
    return tuple(sorted(set(value)))


def _number(body: dict, key: str, default, *, integer: bool = False, optional: bool = False):
    value = body.get(key, default)
    if value is None and optional:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or (not integer and not math.isfinite(value)):
        raise ValueError(f"`{key}` must be a finite {'integer' if integer else 'number'}, got {value!r}")
    return value if integer else float(value)


def parse_sweep_request(body: object) -> SweepRequest:
    """Validate a POST /sweeps body; ValueError names the field, what was expected and what arrived."""
    if not isinstance(body, dict):
        raise ValueError("the sweep request must be a JSON object")
    known = set(SweepRequest.__dataclass_fields__)
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"unknown sweep fields: {unknown}; expected some of {sorted(known)}")
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
        raise ValueError(f"`url` must be a ws:// or wss:// URL, got {url!r}")
    labels = body.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) and LABEL_RE.match(v)
                                               for k, v in labels.items()):
        raise ValueError("`labels` must map names to short strings of letters, digits and ._:/@+-")
    for key in ("model", "input_wav", "expected_input_sha256"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ValueError(f"`{key}` must be a string, got {body[key]!r}")
    if body.get("input_wav") is not None and not INPUT_NAME_RE.match(body["input_wav"]):
        raise ValueError(f"`input_wav` must name a WAV file of the sweep input set (letters, digits, ._- ending in "
                         f".wav, no path), got {body['input_wav']!r}")
    request = SweepRequest(
        url=url,
        sessions=_int_list(body, "sessions", None, 1, MAX_SESSIONS),
        load_frames=_int_list(body, "load_frames", (250,), 1, MAX_LOAD_FRAMES),
        repetitions=_number(body, "repetitions", 1, integer=True),
        model=body.get("model") or "reference-duplex",
        input_wav=body.get("input_wav"),
        expected_input_sha256=body.get("expected_input_sha256"),
        drain_s=_number(body, "drain_s", 2.0), tail_s=_number(body, "tail_s", 0.0),
        timeout_s=_number(body, "timeout_s", 30.0), cleanup_timeout_s=_number(body, "cleanup_timeout_s", 5.0),
        max_frame_deficit=_number(body, "max_frame_deficit", 4, integer=True),
        min_voiced_frames=_number(body, "min_voiced_frames", 5, integer=True),
        minimum_audio_chunks=_number(body, "minimum_audio_chunks", 2, integer=True),
        voiced_frame_rms_threshold=_number(body, "voiced_frame_rms_threshold", 1e-3),
        max_client_rtf=_number(body, "max_client_rtf", None, optional=True),
        max_stream_rtf=_number(body, "max_stream_rtf", None, optional=True),
        max_lag_drift_ms=_number(body, "max_lag_drift_ms", None, optional=True),
        labels=dict(labels))
    if not 1 <= request.repetitions <= 16:
        raise ValueError(f"`repetitions` must be in [1,16], got {request.repetitions}")
    grid = points(request)
    if len(grid) > MAX_POINTS:
        raise ValueError(f"a sweep may have at most {MAX_POINTS} points, this grid has {len(grid)}")
    # The driver's own rules (§12) on every point, with its messages.
    parser = build_parser()
    for point in grid:
        message = validation_error(parser.parse_args(driver_argv(request, point, "input.wav", "out")))
        if message is not None:
            raise ValueError(f"point {point.id}: {message}")
    return request
