"""indexed_gate_rms_norm_scale_shift: Triton vs reference, the bf16 residual boundary, spec §5.5 Hopper reference."""
from __future__ import annotations

import pytest
import torch

from h3batch.kernels import indexed_gate_rms_norm_scale_shift, rms_norm_indexed_scale_shift
from tests.kernels.kernel_cases import BF16_TOL, CASES, assert_matches, make_inputs

EPS = 1e-6
MODES = [(torch.float32, "generic"), (torch.bfloat16, "generic"), (torch.bfloat16, "sm90_bf16_affine")]


def _call(t, mode, backend):
    return indexed_gate_rms_norm_scale_shift(t["x"], t["gate"], t["branch"], t["weight"], t["shift"], t["scale"],
                                             t["indices"], EPS, precision=mode, backend=backend)


@pytest.mark.parametrize("dtype,mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_matches_reference(device, case, dtype, mode):
    """residual_out is bit-exact; modulated matches the reference of the same mode (1e-5 / 5e-2)."""
    t = make_inputs(case, dtype, device)
    residual_out, modulated = _call(t, mode, "triton")
    ref_residual, ref_modulated = _call(t, mode, "torch")
    assert_matches(residual_out, ref_residual, exact=True)
    assert_matches(modulated, ref_modulated, exact=False)


def test_fp32_inputs_keep_u_in_fp32_and_follow_the_formula():
    """fp32 inputs: residual_out = residual + gate[i] * branch unrounded (input dtype); modulated = fp32 formula on it."""
    t = make_inputs(CASES[0], torch.float32, "cpu")
    i = t["indices"]
    u = t["x"] + t["gate"][i] * t["branch"]
    expected = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + EPS) * t["weight"]
    expected = expected * (1 + t["scale"][i]) + t["shift"][i]
    residual_out, modulated = _call(t, None, "torch")
    assert residual_out.dtype == torch.float32
    assert torch.equal(residual_out, u)
    assert torch.equal(modulated, expected)


def test_fp32_triton_keeps_u_in_fp32(device):
    """The Triton kernel follows the same rule: fp32 residual_out is bit-equal to the unrounded fp32 sum."""
    t = make_inputs(CASES[0], torch.float32, device)
    i = t["indices"]
    residual_out, _ = _call(t, "generic", "triton")
    assert torch.equal(residual_out, t["x"] + t["gate"][i] * t["branch"])


def test_bf16_inputs_round_u_to_bf16():
    """bf16 inputs: u is rounded to bf16 once, the value the unfused model keeps in its residual stream."""
    t = make_inputs(CASES[0], torch.bfloat16, "cpu")
    i = t["indices"]
    u = (t["x"].float() + t["gate"][i].float() * t["branch"].float()).to(torch.bfloat16)
    residual_out, _ = _call(t, None, "torch")
    assert torch.equal(residual_out, u)


@pytest.mark.parametrize("mode", ["generic", "sm90_bf16_affine"])
def test_residual_boundary_is_bit_equal(device, mode):
    """Spec §5.5 (RNG 17, rows 11, 4 conditions): modulated equals the RMS op applied to residual_out, bit for bit."""
    torch.manual_seed(17)
    hidden = 3072 if device == "cuda" else 336  # the interpreter is slow: scaled-down width on CPU
    residual, gate, branch, shift, scale = (torch.randn(n, hidden, dtype=torch.bfloat16, device=device)
                                            for n in (11, 4, 11, 4, 4))
    weight = torch.randn(hidden, dtype=torch.bfloat16, device=device)
    indices = torch.arange(11, device=device) % 4
    residual_out, modulated = indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale,
                                                                indices, EPS, precision=mode, backend="triton")
    again = rms_norm_indexed_scale_shift(residual_out, weight, shift, scale, indices, EPS, precision=mode,
                                         backend="triton")
    assert torch.equal(modulated, again)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="spec §5.5 Hopper reference needs a CUDA device of compute capability 9.x")
def test_hopper_reference():
    """Spec §5.5: RNG 42, rows 128, H 3072, 4 conditions; automatic dispatch vs the §5.4 eager formulas at 5e-2."""
    torch.manual_seed(42)
    residual, gate, branch, weight, shift, scale = (torch.randn(n, 3072, dtype=torch.bfloat16, device="cuda")
                                                    for n in (128, 4, 128, 1, 4, 4))
    weight = weight[0]
    indices = torch.arange(128, device="cuda") % 4
    residual_out, modulated = indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale,
                                                                indices, EPS)
    expected_residual = (residual + gate[indices] * branch).to(torch.bfloat16)
    x = expected_residual.float()
    n = (weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))).to(torch.bfloat16)
    expected = (n * (1.0 + scale[indices]) + shift[indices]).to(torch.bfloat16)
    torch.testing.assert_close(residual_out, expected_residual, atol=BF16_TOL, rtol=BF16_TOL)
    torch.testing.assert_close(modulated, expected, atol=BF16_TOL, rtol=BF16_TOL)
