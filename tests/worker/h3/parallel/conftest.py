"""Fixtures for the sequence-parallel tests: one tiny release per session, rank processes on gloo (CPU)."""
from __future__ import annotations

from pathlib import Path

import pytest

from h3batch.worker.h3.tiny_release import build_tiny_release


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory) -> Path:
    """The tiny FastH3 V2 release (DiT config T2: 4 heads) with its sibling hf-cache."""
    base = tmp_path_factory.mktemp("parallel")
    return build_tiny_release(base / "release", base / "hf-cache").release_dir
