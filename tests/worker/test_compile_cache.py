"""H3BATCH_COMPILE_CACHE (worker/compile_cache.py): the Inductor and Triton caches go under the configured directory,
so a restarted worker finds what the last one compiled; an unusable directory is refused naming the setting."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3batch.worker import compile_cache

# A worker's start order: Settings, then configure, then the first compile (here one small torch.compile on the CPU).
COMPILE = """
import torch
from h3batch.settings import Settings
from h3batch.worker import compile_cache
compile_cache.configure(Settings.from_env().compile_cache)
f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
print(float(f(torch.ones(16)).sum()))
"""


def test_configure_points_both_caches_under_the_directory(tmp_path):
    env: dict[str, str] = {}
    values = compile_cache.configure(tmp_path / "cc", env)
    assert env == values == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cc" / "inductor"),
                             "TRITON_CACHE_DIR": str(tmp_path / "cc" / "triton")}
    assert (tmp_path / "cc" / "inductor").is_dir() and (tmp_path / "cc" / "triton").is_dir()
    assert compile_cache.configure(None, env) == {}  # unset: the libraries' own defaults stay


def test_an_unusable_directory_is_refused_naming_the_setting(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="H3BATCH_COMPILE_CACHE: cannot use"):
        compile_cache.configure(blocker, {})


def test_a_compile_lands_in_the_cache_and_a_restart_reuses_it(tmp_path):
    """Two processes, one cache: the first writes Inductor's compiled code under <dir>/inductor; the second starts
    with it there and adds no new compiled module (a cache hit)."""
    cache = tmp_path / "cc"
    env = {**os.environ, "H3BATCH_COMPILE_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TRITON_CACHE_DIR", None)

    def run() -> set[Path]:
        done = subprocess.run([sys.executable, "-P", "-c", COMPILE], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return {p for p in (cache / "inductor").rglob("*.py")}

    first = run()
    assert first, "the first process compiled nothing into the cache"
    second = run()
    assert second == first
