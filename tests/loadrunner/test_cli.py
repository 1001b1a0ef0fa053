"""Driver command line (§12): the invalid-configuration matrix and exit statuses, through real subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3batch.loadrunner.config import parse_config
from tests.loadrunner.harness import REPO_ROOT, common_args, start_server_process, stop_process, write_wav

BASE = ["--model", "m", "--input-wav", "x.wav", "--sessions", "2"]


LOAD_RANGE = "load mode requires sessions in [1,64] and load-frames in [1,10000]"
NOT_FINITE = "must be finite and non-negative (timeout must be positive)"  # after the underscore name
COUNTS = "frame-deficit must be non-negative; voiced frames and audio chunks must be positive"


@pytest.mark.parametrize("flags,message", [
    *((["--sessions", value], LOAD_RANGE) for value in ("0", "65")),
    *((["--load-frames", value], LOAD_RANGE) for value in ("0", "10001")),
    (["--drain-s", "nan"], f"drain_s {NOT_FINITE}"),
    (["--tail-s", "-1"], f"tail_s {NOT_FINITE}"),
    *((["--timeout-s", value], f"timeout_s {NOT_FINITE}") for value in ("0", "inf")),
    *((["--cleanup-timeout-s", value], f"cleanup_timeout_s {NOT_FINITE}") for value in ("0", "nan")),
    (["--max-client-rtf", "-1"], "max-client-rtf must be finite and positive"),
    *((["--max-stream-rtf", value], "max-stream-rtf must be finite and positive") for value in ("0", "nan")),
    *((["--max-lag-drift-ms", value], "max-lag-drift-ms must be finite and non-negative") for value in ("-1", "inf")),
    *(([flag, value], COUNTS) for flag, value in (("--max-frame-deficit", "-1"), ("--minimum-audio-chunks", "0"),
                                                  ("--min-voiced-frames", "0"))),
    (["--voiced-frame-rms-threshold", "nan"], "voiced-frame-rms-threshold must be finite and non-negative"),
])
def test_invalid_load_configuration(flags, message, capsys):
    """Each §12 rejection exits 2 with usage and its exact message on stderr."""
    with pytest.raises(SystemExit) as info:
        parse_config(BASE + flags)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and err.rstrip().endswith(f"error: {message}")


def test_defaults():
    """Defaults follow §12, including the relative ./duplex-results output directory."""
    c = parse_config(["--model", "m", "--input-wav", "x.wav"])
    assert (c.output_dir, c.url, c.voice, c.tail_s, c.drain_s, c.timeout_s, c.cleanup_timeout_s) == (
        "./duplex-results", "ws://127.0.0.1:8099/v1/realtime?duplex=1", "NATF2.pt", 2.0, 2.0, 180.0, 5.0)
    assert (c.max_frame_deficit, c.min_voiced_frames, c.minimum_audio_chunks, c.load_frames) == (4, 5, 2, 1000)
    assert c.voiced_frame_rms_threshold == 1e-3 and c.max_client_rtf is None


def test_lifecycle_skips_load_validation():
    """Load validation runs only with --sessions: lifecycle accepts --drain-s nan at parse time."""
    assert parse_config(["--model", "m", "--input-wav", "x.wav", "--drain-s", "nan"]).sessions is None


def driver(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "h3batch.loadrunner.duplex", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd or REPO_ROOT, env=dict(os.environ))


@pytest.fixture(scope="module")
def fixture_servers():
    """A `success` and a `silent` reference server, each in its own `h3batch duplex-server` process."""
    procs = {mode: start_server_process(["--mode", mode, "--port", "0"], via_h3batch=True)
             for mode in ("success", "silent")}
    yield {mode: url for mode, (_, url) in procs.items()}
    for proc, _ in procs.values():
        stop_process(proc)


def test_exit_status_ok_and_not_ok(fixture_servers, fixture_wav, tmp_path):
    """`python -m h3batch.loadrunner.duplex` exits 0 for an ok report, 1 for a not-ok one; both print the report."""
    ok = driver(common_args(fixture_wav, tmp_path / "a", fixture_servers["success"]))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True
    bad = driver(common_args(fixture_wav, tmp_path / "b", fixture_servers["silent"]))
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["ok"] is False and (tmp_path / "b" / "load-result.json").exists()


def test_exit_status_failures(fixture_servers, fixture_wav, tmp_path):
    """An existing report, a SHA mismatch (one line, no traceback) exit 1; a bad argument exits 2."""
    url = fixture_servers["success"]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "load-result.json").write_text("previous measurement")
    exists = driver(common_args(fixture_wav, tmp_path / "c", url))
    assert exists.returncode == 1 and "FileExistsError" in exists.stderr and "Traceback" not in exists.stderr
    mismatch = driver(common_args(fixture_wav, tmp_path / "d", url) + ["--expected-input-sha256", "0" * 64])
    assert mismatch.returncode == 1 and "input WAV SHA-256 mismatch" in mismatch.stderr
    assert not (tmp_path / "d" / "load-result.json").exists()
    bad = driver(common_args(fixture_wav, tmp_path / "e", url) + ["--sessions", "65"])
    assert bad.returncode == 2 and bad.stderr.rstrip().endswith(
        "load mode requires sessions in [1,64] and load-frames in [1,10000]")


def test_default_output_dir_is_relative(fixture_servers, fixture_wav, tmp_path):
    """Without --output-dir the report lands in ./duplex-results under the working directory."""
    args = [a for a in common_args(fixture_wav, tmp_path, fixture_servers["success"])]
    i = args.index("--output-dir")
    del args[i:i + 2]
    result = driver(args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "duplex-results" / "load-result.json").exists()


def test_h3batch_routes_duplex(fixture_servers, fixture_wav, tmp_path):
    """`h3batch duplex` reaches the same driver through h3batch/cli.py."""
    h3batch = Path(sys.executable).parent / "h3batch"
    result = subprocess.run([str(h3batch), "duplex", *common_args(fixture_wav, tmp_path / "o",
                                                                   fixture_servers["success"])],
                            capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr




@pytest.mark.parametrize("slots,status", [(2, 0), (3, 1)])
def test_lifecycle_exit_status(tmp_path, slots, status):
    """Lifecycle mode exits 0 on a 2-slot server; on a 3-slot server the N+1 probe times out and it exits 1."""
    import numpy as np

    t = np.arange(5 * 1920) / 24000
    wav = write_wav(tmp_path / "tone.wav", np.round(0.3 * np.sin(2 * np.pi * 220 * t) * 32767))
    proc, url = start_server_process(["--port", "0", "--max-sessions", str(slots)], via_h3batch=True)
    try:
        result = driver(["--url", url, "--model", "m", "--input-wav", str(wav), "--output-dir",
                         str(tmp_path / "life"), "--tail-s", "0", "--drain-s", "0.3", "--timeout-s", "2"])
    finally:
        stop_process(proc)
    assert result.returncode == status, result.stderr
    if status == 0:
        assert json.loads(result.stdout)["ok"] is True and (tmp_path / "life" / "result.json").exists()
    else:
        assert result.stderr.strip() == "h3batch duplex: TimeoutError: Timed out waiting for error"
