"""Release-room fixtures: one tiny release (+ its hub cache) per session, copied when a test mutates it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from h3batch.worker.h3.tiny_release import TinyRelease, build_tiny_release

SEED = 0


@pytest.fixture(scope="session", autouse=True)
def hub_offline():
    """Resolve everything from the local cache: this machine has no Hub access, and tests must not try."""
    import huggingface_hub.constants as hub_constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(hub_constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, hub_offline) -> TinyRelease:
    """The tiny release built once; tests must not modify it (use `release_copy` / `cache_copy`)."""
    base = tmp_path_factory.mktemp("tiny")
    return build_tiny_release(base / "release", base / "hf-cache", seed=SEED)


@pytest.fixture
def release_copy(tiny, tmp_path) -> Path:
    """A private, mutable copy of the tiny release directory."""
    return Path(shutil.copytree(tiny.release_dir, tmp_path / "release"))


@pytest.fixture
def cache_copy(tiny, tmp_path) -> Path:
    """A private, mutable copy of the tiny hub cache (symlinks kept as symlinks)."""
    return Path(shutil.copytree(tiny.hf_cache, tmp_path / "hf-cache", symlinks=True))
