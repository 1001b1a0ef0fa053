"""indexed_scale_shift_: in place, bit-exact against the fp32-with-one-rounding reference in both modes."""
from __future__ import annotations

import pytest
import torch

from h3batch.kernels import indexed_scale_shift_
from tests.kernels.kernel_cases import CASES, INTERPRETER_IN_PROCESS, assert_matches, make_inputs

MODES = [(torch.float32, "generic"), (torch.bfloat16, "generic"), (torch.bfloat16, "sm90_bf16_affine")]


@pytest.mark.parametrize("dtype,mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_matches_reference(device, case, dtype, mode):
    """The kernel writes x in place (same storage, returns x) and equals the reference bit for bit."""
    t = make_inputs(case, dtype, device)
    x = t["x"].clone()
    returned = indexed_scale_shift_(x, t["shift"], t["scale"], t["indices"], precision=mode, backend="triton")
    assert returned is x
    expected = indexed_scale_shift_(t["x"].clone(), t["shift"], t["scale"], t["indices"], precision=mode,
                                    backend="torch")
    assert_matches(x, expected, exact=True)


def test_non_contiguous_rows_are_written_in_place(device):
    """A row-strided view is updated through its strides; the columns outside the view stay untouched."""
    t = make_inputs(CASES[0], torch.bfloat16, device)
    base = torch.cat([t["x"], t["x"]], dim=1)  # [R, 2H]; view the first H columns (row stride 2H)
    view = base[:, :336]
    expected = indexed_scale_shift_(view.clone(), t["shift"], t["scale"], t["indices"], backend="torch")
    indexed_scale_shift_(view, t["shift"], t["scale"], t["indices"], backend="triton")
    assert torch.equal(base[:, :336], expected)
    assert torch.equal(base[:, 336:], t["x"])


def test_fp32_inputs_follow_the_formula():
    """On CPU, fp32 inputs give exactly x * (1 + scale[i]) + shift[i] in fp32 (torch backend and interpreted kernel)."""
    t = make_inputs(CASES[0], torch.float32, "cpu")
    i = t["indices"]
    expected = t["x"] * (1 + t["scale"][i]) + t["shift"][i]
    for backend in ["torch"] + (["triton"] if INTERPRETER_IN_PROCESS else []):
        x = t["x"].clone()
        indexed_scale_shift_(x, t["shift"], t["scale"], i, backend=backend)
        assert torch.equal(x, expected), backend
