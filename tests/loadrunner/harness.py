"""Loadrunner test harness: in-process and subprocess reference servers, a WAV writer, the common driver arguments.

Plain functions imported by name (`from tests.loadrunner.harness import ...`); the pytest fixtures built on them
live in `conftest.py`.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from h3batch.loadrunner.config import parse_config
from h3batch.loadrunner.load import run_load
from h3batch.loadrunner.server import DuplexServer, ServerConfig

# One constant scales every wall-clock bound in these tests (websockets' tests call theirs MS).
TIME_SCALE = 1.0
# A run that must end by itself (its own timeouts) is given this long before the test calls it hung: far above what
# any loaded machine takes, so the bound never samples speed.
HANG_GUARD_S = 60.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def write_wav(path: Path, samples: np.ndarray, rate: int = 24_000, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(samples.astype({1: "u1", 2: "<i2", 4: "<i4"}[width]).tobytes())
    return path


def common_args(wav: Path, out_dir: Path, url: str, sessions: int | None = 2) -> list[str]:
    args = ["--url", url, "--model", "fixture-only", "--input-wav", str(wav), "--output-dir", str(out_dir),
            "--load-frames", "2", "--tail-s", "0", "--drain-s", "0.04", "--timeout-s", "3",
            "--cleanup-timeout-s", "1", "--min-voiced-frames", "1", "--minimum-audio-chunks", "1",
            "--max-frame-deficit", "0"]
    return args + (["--sessions", str(sessions)] if sessions is not None else [])


async def run_against_server(mode: str, wav: Path, out_dir: Path, sessions: int, extra: list[str] = (),
                             **server_settings) -> tuple[dict, DuplexServer, float]:
    """Run load mode against an in-process reference server; returns (report, server, wall seconds)."""
    async with DuplexServer(ServerConfig(mode=mode, **server_settings)) as server:
        config = parse_config(common_args(wav, out_dir, server.url, sessions) + list(extra))
        loop = asyncio.get_running_loop()
        began = loop.time()
        report = await run_load(config)
        elapsed = loop.time() - began
        await wait_closed(server)
    return report, server, elapsed


async def wait_closed(server: DuplexServer, timeout: float = 2.0) -> None:
    """Give server handlers a moment to observe the client's close; returns as soon as all are closed."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not all(c.closed for c in server.connections) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


def start_server_process(args: list[str], timeout: float = 20.0, via_h3batch: bool = False):
    """Start `python -m h3batch.loadrunner.server ARGS` (or `h3batch duplex-server ARGS`) and return (process, url)
    once it prints its listening line."""
    command = ([str(Path(sys.executable).parent / "h3batch"), "duplex-server"] if via_h3batch
               else [sys.executable, "-P", "-m", "h3batch.loadrunner.server"])
    proc = subprocess.Popen([*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT)
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline()
    if "listening on " not in line or time.monotonic() > deadline:
        proc.kill()
        pytest.fail(f"duplex-server did not start: {line!r} {proc.stderr.read()!r}")
    return proc, line.split("listening on ")[1].split()[0]


def stop_process(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except Exception:
        proc.kill()
        proc.wait()
