"""Reference server settings (`server_config`): defaults, flags, range checks and the one-line argument errors."""
from __future__ import annotations

import subprocess
import sys

import pytest

from h3batch.loadrunner.server_config import ServerConfig, parse_config
from tests.loadrunner.harness import REPO_ROOT


def test_lifecycle_defaults_and_flags(capsys):
    """§3.7: defaults idle_ttl 300 s, grace 30 s, reaper 5 s, warm-up off; the CLI sets each and rejects bad values
    with one error line."""
    defaults = parse_config([])
    assert (defaults.idle_ttl_s, defaults.disconnect_grace_s, defaults.reaper_interval_s, defaults.warmup_frames,
            defaults.idle_timeout_s, defaults.cleanup_failures) == (300.0, 30.0, 5.0, 0, 300.0, 0)
    assert defaults == ServerConfig(port=8099)
    set_ = parse_config(["--idle-ttl-s", "1", "--disconnect-grace-s", "2", "--reaper-interval-s", "0.5",
                         "--warmup-frames", "3", "--max-pending-input-bytes", "1000", "--cleanup-failures", "1"])
    assert (set_.idle_ttl_s, set_.disconnect_grace_s, set_.reaper_interval_s, set_.warmup_frames,
            set_.max_pending_input_bytes, set_.cleanup_failures) == (1.0, 2.0, 0.5, 3, 1000, 1)
    with pytest.raises(SystemExit) as info:
        parse_config(["--reaper-interval-s", "0"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (
        "h3batch duplex-server: --reaper-interval-s must be finite and positive, got 0.0\n")

def test_server_rejects_bad_arguments():
    """The reference server exits 2 with one error line for an unknown mode."""
    result = subprocess.run([sys.executable, "-P", "-m", "h3batch.loadrunner.server", "--mode", "nope"], capture_output=True,
                            text=True, timeout=30, cwd=REPO_ROOT)
    assert result.returncode == 2 and result.stderr.startswith("h3batch duplex-server: argument --mode: ")
    assert "invalid choice: 'nope'" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("flags,message", [
    (["--port", "65536"], "--port must be in [0, 65535], got 65536"),
    (["--max-sessions", "0"], "--max-sessions must be at least 1, got 0"),
    (["--chunk-frames", "0"], "--initial-chunk-frames and --chunk-frames must be at least 1"),
    (["--jitter-ms", "-1"], "--jitter-ms must be finite and non-negative, got -1.0"),
    (["--disconnect-grace-s", "inf"], "--disconnect-grace-s must be finite and non-negative, got inf"),
    (["--slowdown", "0"], "--slowdown must be finite and positive, got 0.0"),
    (["--warmup-frames", "-1"], "--warmup-frames must be at least 0, got -1"),
    (["--max-pending-input-bytes", "0"], "--max-pending-input-bytes must be at least 1, got 0"),
])
def test_range_checks_exit_2_with_one_line(flags, message, capsys):
    """Each out-of-range flag exits 2 with its message as the only line on stderr."""
    with pytest.raises(SystemExit) as info:
        parse_config(flags)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"h3batch duplex-server: {message}\n"
