"""The `h3batch` command table's papercuts: `--version`, help texts that end where their sentence ends."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*H3BATCH, *args], capture_output=True, text=True, timeout=120)


def test_version_prints_the_installed_version():
    """`h3batch --version` (and -V) prints the distribution's version and exits 0; the usage names the flag."""
    for flag in ("--version", "-V"):
        done = run(flag)
        assert done.returncode == 0 and done.stdout.strip() == f"h3batch {version('h3batch')}", done
    assert "--version" in run("--help").stdout


def test_memory_plan_help_is_not_cut_off():
    """The description is the docstring's whole first paragraph, not its first line cut mid-sentence."""
    done = run("memory-plan", "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0
    assert "the GPU memory left, and the largest clip each configuration serves (`max_rows`," in text
    assert "video rows). options:" in text
