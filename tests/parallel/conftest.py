"""Fixtures for the sequence-parallel tests: one tiny release per session, rank processes on gloo (CPU)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from h3batch.worker.h3.tiny_release import build_tiny_release


@pytest.fixture(scope="session")
def tiny_release(tmp_path_factory) -> Path:
    """The tiny FastH3 V2 release (DiT config T2: 4 heads) with its sibling hf-cache."""
    base = tmp_path_factory.mktemp("parallel")
    return build_tiny_release(base / "release", base / "hf-cache").release_dir


@pytest.fixture(autouse=True)
def _two_threads():
    """Keep the test process on the 2 shared CPU cores (rank processes use one thread each)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(previous)
