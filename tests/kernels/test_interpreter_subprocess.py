"""Runs the CPU interpreter cases in a fresh process when this one imported triton before TRITON_INTERPRET was set."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.kernels.kernel_cases import CUDA, INTERPRETER_IN_PROCESS, REPO, SUBPROCESS_ENV


@pytest.mark.skipif(CUDA or INTERPRETER_IN_PROCESS or os.environ.get(SUBPROCESS_ENV) == "1",
                    reason="the interpreter cases already run in this process (or this is a CUDA host)")
def test_interpreter_cases_pass_in_a_fresh_process():
    """A child `pytest tests/kernels` with TRITON_INTERPRET=1 from the start passes (Triton vs reference on CPU)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", SUBPROCESS_ENV: "1"}
    child = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
