"""indexed_gate: x + gate[i] * other, bit-exact against the fp32-with-one-rounding reference."""
from __future__ import annotations

import pytest
import torch

from h3batch.kernels import indexed_gate
from tests.kernels.kernel_cases import CASES, INTERPRETER_IN_PROCESS, assert_matches, make_inputs

MODES = [(torch.float32, "generic"), (torch.bfloat16, "generic"), (torch.bfloat16, "sm90_bf16_affine")]


@pytest.mark.parametrize("dtype,mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_matches_reference(device, case, dtype, mode):
    """The kernel returns a new contiguous tensor equal to the reference bit for bit."""
    t = make_inputs(case, dtype, device)
    out = indexed_gate(t["x"], t["gate"], t["branch"], t["indices"], precision=mode, backend="triton")
    assert out.is_contiguous() and (out.numel() == 0 or out.data_ptr() != t["x"].data_ptr())
    expected = indexed_gate(t["x"], t["gate"], t["branch"], t["indices"], precision=mode, backend="torch")
    assert_matches(out, expected, exact=True)


def test_fp32_inputs_follow_the_formula():
    """On CPU, fp32 inputs give exactly x + gate[i] * other in fp32 (torch backend and interpreted kernel)."""
    t = make_inputs(CASES[0], torch.float32, "cpu")
    i = t["indices"]
    expected = t["x"] + t["gate"][i] * t["branch"]
    for backend in ["torch"] + (["triton"] if INTERPRETER_IN_PROCESS else []):
        assert torch.equal(indexed_gate(t["x"], t["gate"], t["branch"], i, backend=backend), expected), backend
