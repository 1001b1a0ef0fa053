"""Native-release fixtures: one tiny native MiniMax-H3 release per session (tests must not modify it)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from h3batch.worker.h3.tiny_release import TinyRelease, build_tiny_native_release


@pytest.fixture(scope="session")
def native(tmp_path_factory) -> TinyRelease:
    """The tiny native release built once (seed 0)."""
    return build_tiny_native_release(tmp_path_factory.mktemp("native") / "release", seed=0)


@pytest.fixture
def native_copy(native, tmp_path) -> Path:
    """A private, mutable copy of the tiny native release."""
    return Path(shutil.copytree(native.release_dir, tmp_path / "release"))


@pytest.fixture(scope="session")
def tiny_v2(tmp_path_factory) -> Path:
    """A tiny V2 release (with its hub cache beside it), to show what a V2 worker refuses."""
    from h3batch.worker.h3.tiny_release import build_tiny_release

    base = tmp_path_factory.mktemp("v2")
    return build_tiny_release(base / "release", base / "hf-cache").release_dir
