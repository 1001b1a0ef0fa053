"""Loadrunner fixtures: the §13 two-frame WAV. The helpers the tests import by name live in `harness.py`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.loadrunner.harness import write_wav


@pytest.fixture
def fixture_wav(tmp_path) -> Path:
    """The §13 input: 3 840 int16 samples of 2000 (two 80 ms frames), 24 kHz mono 16-bit."""
    return write_wav(tmp_path / "input.wav", np.full(3840, 2000))
