"""The `h3batch` command: an explicit table of subcommands, each owned by one room.

Every entry imports its room only when it runs, so light commands (`api`, `duplex`, `--help`) never import torch.
Each room's entry point is `main(argv: list[str]) -> int`.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable[[list[str]], int]


def _build_tiny(argv: list[str]) -> int:
    from h3batch.worker.h3 import tiny_release
    return tiny_release.main(argv)


def _build_tiny_adapters(argv: list[str]) -> int:
    from h3batch.worker.h3 import tiny_adapters
    return tiny_adapters.main(argv)


def _check_release(argv: list[str]) -> int:
    from h3batch.worker.h3 import contract
    return contract.main(argv)


def _fetch_release(argv: list[str]) -> int:
    from h3batch.worker.h3 import release_ref
    return release_ref.main(argv)


def _memory_plan(argv: list[str]) -> int:
    from h3batch.worker.h3 import memory_plan
    return memory_plan.main(argv)


def _render(argv: list[str]) -> int:
    from h3batch.worker import render_cli
    return render_cli.main(argv)


def _api(argv: list[str]) -> int:
    from h3batch.api import serve
    return serve.main(argv)


def _submit(argv: list[str]) -> int:
    from h3batch.client import cli as client_cli
    return client_cli.main(argv)


def _worker(argv: list[str]) -> int:
    from h3batch.worker import run_worker
    return run_worker.main(argv)


def _demo(argv: list[str]) -> int:
    from h3batch.worker import demo
    return demo.main(argv)


def _serve(argv: list[str]) -> int:
    from h3batch.worker import serve
    return serve.main(argv)


def _duplex(argv: list[str]) -> int:
    from h3batch.loadrunner import duplex
    return duplex.main(argv)


def _duplex_server(argv: list[str]) -> int:
    from h3batch.loadrunner import server
    return server.main(argv)


def _sweep_worker(argv: list[str]) -> int:
    from h3batch.loadrunner import sweep_worker
    return sweep_worker.main(argv)


def _speech_wav(argv: list[str]) -> int:
    from h3batch.loadrunner import speech_wav
    return speech_wav.main(argv)


def _beat(argv: list[str]) -> int:
    from h3batch.loadrunner import beat
    return beat.main(argv)


COMMANDS: tuple[Command, ...] = (
    Command("build-tiny", "write the deterministic tiny release in the exact V2 (or --kind native) layout", _build_tiny),
    Command("build-tiny-adapters", "write deterministic tiny adapters (per-job LoRAs, the legacy FastH3 one)",
            _build_tiny_adapters),
    Command("check-release", "validate a release directory against the checkpoint contract", _check_release),
    Command("fetch-release", "fetch a Hub release (org/name@revision) into the HF cache, print its folder",
            _fetch_release),
    Command("memory-plan", "print where the models live per rank and the longest clip each GPU count serves",
            _memory_plan),
    Command("render", "render one prompt to an MP4 on this machine", _render),
    Command("api", "run the HTTP API", _api),
    Command("submit", "submit a prompt to a running API, show progress, download the MP4", _submit),
    Command("worker", "run a Celery worker (GPU `render` queue by default)", _worker),
    Command("demo", "end-to-end demo: API + worker + one job on the tiny release", _demo),
    Command("serve", "keep API + worker running locally", _serve),
    Command("duplex", "full-duplex speech load driver", _duplex),
    Command("duplex-server", "reference full-duplex speech server", _duplex_server),
    Command("speech-wav", "write the load runner's input speech.wav (espeak-ng, else synthesized)", _speech_wav),
    Command("sweep-worker", "run a Celery worker for the `loadrunner` sweep queue (no torch)", _sweep_worker),
    Command("beat", "run the single Celery beat scheduler for sweeps", _beat),
)
BY_NAME = {command.name: command for command in COMMANDS}


def usage() -> str:
    width = max(len(command.name) for command in COMMANDS)
    lines = ["usage: h3batch COMMAND [ARGS...]   (h3batch --version: the installed version)", "", "commands:"]
    lines += [f"  {command.name:<{width}}  {command.help}" for command in COMMANDS]
    return "\n".join(lines)


def version() -> str:
    """The installed distribution's version (pyproject.toml's, through the package metadata)."""
    from importlib.metadata import PackageNotFoundError  # noqa: PLC0415
    from importlib.metadata import version as dist_version  # noqa: PLC0415

    try:
        return dist_version("h3batch")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"h3batch {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    command = BY_NAME.get(name)
    if command is None:
        print(f"h3batch: unknown command {name!r} (try: {', '.join(BY_NAME)})", file=sys.stderr)
        return 2
    return int(command.run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
