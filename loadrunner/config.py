"""Driver configuration (spec §12): the argparse parser, its validation, and the frozen `DriverConfig`.

Stdlib only, so the API can validate sweep points with the driver's own rules without
importing numpy.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

DEFAULT_URL = "ws://127.0.0.1:8099/v1/realtime?duplex=1"
DEFAULT_OUTPUT_DIR = "./duplex-results"
DEFAULT_VOICE = "NATF2.pt"
DEFAULT_PERSONA = "You are a concise and helpful assistant."
DEFAULT_SECONDARY_PERSONA = "You are a calm and precise assistant."
DEFAULT_REPLACEMENT_PERSONA = "You are a cheerful travel assistant."
MAX_SESSIONS = 64
MAX_LOAD_FRAMES = 10_000


@dataclass(frozen=True)
class DriverConfig:
    """Every setting of one driver run; `sessions is None` selects lifecycle mode."""

    model: str
    input_wav: str
    url: str = DEFAULT_URL
    expected_input_sha256: str | None = None
    output_dir: str = DEFAULT_OUTPUT_DIR
    voice: str = DEFAULT_VOICE
    persona: str = DEFAULT_PERSONA
    secondary_persona: str = DEFAULT_SECONDARY_PERSONA
    replacement_persona: str = DEFAULT_REPLACEMENT_PERSONA
    tail_s: float = 2.0
    drain_s: float = 2.0
    timeout_s: float = 180.0
    cleanup_timeout_s: float = 5.0
    max_frame_deficit: int = 4
    voiced_frame_rms_threshold: float = 1e-3
    min_voiced_frames: int = 5
    minimum_audio_chunks: int = 2
    replacement_frames: int = 0
    sessions: int | None = None
    load_frames: int = 1000
    max_client_rtf: float | None = None
    max_stream_rtf: float | None = None
    max_lag_drift_ms: float | None = None
    server_revision: str | None = None
    server_hardware: str | None = None

    @property
    def acceptance(self):
        """The §6 thresholds as an `AcceptanceConfig` (imported here so this module stays stdlib-only for the API)."""
        from h3batch.loadrunner.acceptance import AcceptanceConfig  # noqa: PLC0415

        return AcceptanceConfig(max_frame_deficit=self.max_frame_deficit, min_voiced_frames=self.min_voiced_frames,
                                minimum_audio_chunks=self.minimum_audio_chunks,
                                voiced_frame_rms_threshold=self.voiced_frame_rms_threshold)


def build_parser() -> argparse.ArgumentParser:
    # Spec §12 asks for argparse's usage + message on a parser error (exit 2), unlike the other h3batch commands.
    p = argparse.ArgumentParser(prog="h3batch duplex", description="Full-duplex Realtime lifecycle / paced load driver.")
    p.add_argument("--url", default=DEFAULT_URL, help="base WebSocket URL (duplex, model, autostart are set)")
    p.add_argument("--model", required=True, help="model name for the query and session.model")
    p.add_argument("--input-wav", required=True, help="input audio (WAV, resampled to 24 kHz mono)")
    p.add_argument("--expected-input-sha256", default=None, help="abort before any session on a digest mismatch")
    p.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR, help="artifacts / load-result.json")
    p.add_argument("--voice", default=DEFAULT_VOICE)
    p.add_argument("--persona", default=DEFAULT_PERSONA)
    p.add_argument("--secondary-persona", default=DEFAULT_SECONDARY_PERSONA)
    p.add_argument("--replacement-persona", default=DEFAULT_REPLACEMENT_PERSONA)
    p.add_argument("--tail-s", type=float, default=2.0, help="seconds of zeros appended to the input")
    p.add_argument("--drain-s", type=float, default=2.0, help="fixed window after the last send")
    p.add_argument("--timeout-s", type=float, default=180.0, help="bound of each wait and each send")
    p.add_argument("--cleanup-timeout-s", type=float, default=5.0, help="load: close+ack budget and close bound")
    p.add_argument("--max-frame-deficit", type=int, default=4)
    p.add_argument("--voiced-frame-rms-threshold", type=float, default=1e-3)
    p.add_argument("--min-voiced-frames", type=int, default=5)
    p.add_argument("--minimum-audio-chunks", type=int, default=2)
    p.add_argument("--replacement-frames", type=int, default=0, help="lifecycle: frames after slot reuse (0 = all)")
    p.add_argument("--sessions", type=int, default=None, help="select paced load mode with N sessions (1-64)")
    p.add_argument("--load-frames", type=int, default=1000, help="load: frames per session, no looping")
    p.add_argument("--max-client-rtf", type=float, default=None)
    p.add_argument("--max-stream-rtf", type=float, default=None)
    p.add_argument("--max-lag-drift-ms", type=float, default=None)
    p.add_argument("--server-revision", default=None, help="operator label, not verified")
    p.add_argument("--server-hardware", default=None, help="operator label, not verified")
    return p


def validation_error(args: argparse.Namespace) -> str | None:
    """The first §12 load-mode validation message that applies, or None. Only runs with --sessions."""
    if args.sessions is None:
        return None
    if not (1 <= args.sessions <= MAX_SESSIONS and 1 <= args.load_frames <= MAX_LOAD_FRAMES):
        return "load mode requires sessions in [1,64] and load-frames in [1,10000]"
    for name in ("timeout_s", "cleanup_timeout_s", "drain_s", "tail_s"):
        value = getattr(args, name)
        positive = name in ("timeout_s", "cleanup_timeout_s")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            return f"{name} must be finite and non-negative (timeout must be positive)"
    if args.max_client_rtf is not None and not (math.isfinite(args.max_client_rtf) and args.max_client_rtf > 0):
        return "max-client-rtf must be finite and positive"
    if args.max_stream_rtf is not None and not (math.isfinite(args.max_stream_rtf) and args.max_stream_rtf > 0):
        return "max-stream-rtf must be finite and positive"
    if args.max_lag_drift_ms is not None and not (math.isfinite(args.max_lag_drift_ms)
                                                  and args.max_lag_drift_ms >= 0):
        return "max-lag-drift-ms must be finite and non-negative"
    if args.max_frame_deficit < 0 or args.min_voiced_frames < 1 or args.minimum_audio_chunks < 1:
        return "frame-deficit must be non-negative; voiced frames and audio chunks must be positive"
    if not (math.isfinite(args.voiced_frame_rms_threshold) and args.voiced_frame_rms_threshold >= 0):
        return "voiced-frame-rms-threshold must be finite and non-negative"
    return None


def parse_config(argv: list[str]) -> DriverConfig:
    """Parse and validate; any argument error prints one line `h3batch duplex: MESSAGE` on stderr and exits 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    message = validation_error(args)
    if message is not None:
        parser.error(message)
    return DriverConfig(**vars(args))
