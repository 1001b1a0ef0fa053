"""Kernel test fixtures: the device a Triton kernel runs on, and clean knob env vars (setup in kernel_cases)."""
from __future__ import annotations

import pytest

from tests.kernels.kernel_cases import CUDA, INTERPRETER_IN_PROCESS

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(
        not INTERPRETER_IN_PROCESS,
        reason="CUDA host (kernels compile here), or triton was imported before TRITON_INTERPRET could be set: "
               "the interpreter cases then run in test_interpreter_subprocess.py")),
    pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA device for compiled Triton")),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Where the Triton kernel runs: cpu (interpreter) or cuda (compiled)."""
    return request.param


@pytest.fixture(autouse=True)
def _no_knob_env(monkeypatch):
    """Tests start with the precision/backend env knobs unset."""
    monkeypatch.delenv("H3BATCH_MODULATION_PRECISION", raising=False)
    monkeypatch.delenv("H3BATCH_KERNEL_BACKEND", raising=False)
