"""`h3batch` subcommands.

Each subcommand lives in the room that owns it and exposes `main(argv) -> int`; this module only routes, importing
the target lazily so that light commands (`api`, `duplex`) never import torch.
"""
from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help). Every module defines `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "build-tiny": ("worker.h3.tiny_release", "write the deterministic tiny release in the exact V2 layout"),
    "check-release": ("worker.h3.contract", "validate a release directory against the checkpoint contract"),
    "render": ("worker.render_cli", "render one prompt to an MP4 on this machine"),
    "api": ("api.serve", "run the HTTP API"),
    "submit": ("api.client_cli", "submit a prompt to a running API, show progress, download the MP4"),
    "worker": ("worker.run_worker", "run a Celery worker (GPU `render` queue by default)"),
    "demo": ("worker.demo", "end-to-end demo: API + worker + one job on the tiny release"),
    "serve": ("worker.serve", "keep API + worker running locally"),
    "duplex": ("loadrunner.duplex", "full-duplex speech load driver"),
    "duplex-server": ("loadrunner.server", "reference full-duplex speech server"),
    "sweep-worker": ("loadrunner.sweep_worker", "run a Celery worker for the `loadrunner` sweep queue (no torch)"),
    "beat": ("loadrunner.beat", "run the single Celery beat scheduler for sweeps"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: h3batch COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"h3batch: unknown command {name!r} (try: {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)
