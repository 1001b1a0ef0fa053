"""Reference server configuration: the frozen `ServerConfig`, the `h3batch duplex-server` parser and its validation.

The same shape as the driver's `config`: flags parsed once at the edge, checked in one place, handed on as a
dataclass that the server, its connections and sessions read.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from h3batch.cli_args import OneLineArgumentParser
from h3batch.loadrunner.config import parse_checked
from h3batch.loadrunner.fault_modes import FixtureMode
from h3batch.loadrunner.server_protocol import MAX_PENDING_INPUT_BYTES, Content

REALTIME = "realtime"
MODES = [REALTIME, *(m.value for m in FixtureMode)]


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


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="h3batch duplex-server", description="Reference full-duplex Realtime server.")
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


def validation_error(args: argparse.Namespace) -> str | None:
    """The first range check the parsed flags fail, as the message the command line prints, or None."""
    if not 0 <= args.port <= 65535:
        return f"--port must be in [0, 65535], got {args.port}"
    if args.max_sessions < 1:
        return f"--max-sessions must be at least 1, got {args.max_sessions}"
    if args.initial_chunk_frames < 1 or args.chunk_frames < 1:
        return "--initial-chunk-frames and --chunk-frames must be at least 1"
    for name in ("processing_delay_ms", "frame_cost_ms", "jitter_ms", "first_message_timeout_s", "idle_timeout_s",
                 "idle_ttl_s", "disconnect_grace_s"):
        value = getattr(args, name)
        if not 0 <= value < float("inf"):
            return f"--{name.replace('_', '-')} must be finite and non-negative, got {value}"
    if not 0 < args.slowdown < float("inf"):
        return f"--slowdown must be finite and positive, got {args.slowdown}"
    if not 0 < args.reaper_interval_s < float("inf"):
        return f"--reaper-interval-s must be finite and positive, got {args.reaper_interval_s}"
    for name in ("warmup_frames", "cleanup_failures"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must be at least 0, got {getattr(args, name)}"
    if args.max_pending_input_bytes < 1:
        return f"--max-pending-input-bytes must be at least 1, got {args.max_pending_input_bytes}"
    return None


def parse_config(argv: list[str]) -> ServerConfig:
    """Parse and validate; any argument error prints one line `h3batch duplex-server: MESSAGE` and exits 2."""
    args = parse_checked(build_parser(), argv, validation_error)
    return ServerConfig(**{**vars(args), "content": Content(args.content)})
