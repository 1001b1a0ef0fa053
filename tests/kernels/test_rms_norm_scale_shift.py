"""rms_norm_indexed_scale_shift: Triton vs torch reference in both precision modes, formulas, mode differences."""
from __future__ import annotations

import pytest
import torch

import h3batch.kernels.backend as backend
import h3batch.kernels.launch as launch
from h3batch.kernels import rms_norm_indexed_scale_shift
from tests.kernels.kernel_cases import CASES, assert_matches, make_inputs

EPS = 1e-6
MODES = [(torch.float32, "generic"), (torch.bfloat16, "generic"), (torch.bfloat16, "sm90_bf16_affine")]


def _call(t, mode, backend):
    return rms_norm_indexed_scale_shift(t["x"], t["weight"], t["shift"], t["scale"], t["indices"], EPS,
                                        precision=mode, backend=backend)


@pytest.mark.parametrize("dtype,mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_triton_matches_reference(device, case, dtype, mode):
    """The Triton kernel reproduces the torch reference of the same mode (fp32 1e-5, bf16 5e-2, rare 1-bit flips)."""
    t = make_inputs(case, dtype, device)
    out = _call(t, mode, "triton")
    assert out.shape == t["x"].shape and out.is_contiguous()
    assert_matches(out, _call(t, mode, "torch"), exact=False)


def test_fp32_reference_is_the_formula():
    """On CPU, fp32 inputs give exactly RMSNorm_w(x) * (1 + scale[i]) + shift[i] evaluated in fp32."""
    t = make_inputs(CASES[0], torch.float32, "cpu")
    x, i = t["x"], t["indices"]
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * t["weight"]
    expected = expected * (1 + t["scale"][i]) + t["shift"][i]
    assert torch.equal(_call(t, None, "torch"), expected)


def test_sm90_reference_is_eager_bf16():
    """The sm90 reference equals spec §5.4's eager formulas: n rounded to bf16, then bf16 ops that each round."""
    t = make_inputs(CASES[0], torch.bfloat16, "cpu")
    x, i = t["x"], t["indices"]
    n = (t["weight"].float() * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)))
    eager = n.to(torch.bfloat16) * (1.0 + t["scale"][i]) + t["shift"][i]  # bf16 tensors: every op rounds
    assert eager.dtype == torch.bfloat16
    assert torch.equal(_call(t, "sm90_bf16_affine", "torch"), eager)


def _rounding_probe(device: str) -> dict[str, torch.Tensor]:
    """A row whose n = 1.5 exactly, scale = 2^-8 (1 + scale is a bf16 tie), shift = 2^-8 (n + shift is a tie)."""
    hidden = 8
    x = torch.ones(1, hidden, dtype=torch.bfloat16, device=device)
    weight = torch.full((hidden,), 1.5, dtype=torch.float32, device=device)
    table = torch.full((1, hidden), 2.0**-8, dtype=torch.bfloat16, device=device)
    return {"x": x, "weight": weight, "shift": table, "scale": table.clone(),
            "indices": torch.zeros(1, dtype=torch.int64, device=device)}


def test_precision_modes_differ(device):
    """Generic gives bf16(1.5 * 1.00390625 + 0.00390625) = 1.5078125; sm90 rounds each step and gives 1.5."""
    t = _rounding_probe(device)
    generic = rms_norm_indexed_scale_shift(t["x"], t["weight"], t["shift"], t["scale"], t["indices"], 0.0,
                                           precision="generic", backend="triton")
    sm90 = rms_norm_indexed_scale_shift(t["x"], t["weight"], t["shift"], t["scale"], t["indices"], 0.0,
                                        precision="sm90_bf16_affine", backend="triton")
    assert torch.all(generic.float() == 1.5078125)
    assert torch.all(sm90.float() == 1.5)


def test_modes_differ_on_random_rows_and_kernel_follows_each(device):
    """On random bf16 rows the two modes disagree on many elements, and the kernel tracks each mode's reference."""
    t = make_inputs(CASES[0], torch.bfloat16, device)
    generic, sm90 = (_call(t, mode, "torch") for mode in ("generic", "sm90_bf16_affine"))
    differing = (generic != sm90).float().mean().item()
    assert differing > 0.05
    for mode, reference in (("generic", generic), ("sm90_bf16_affine", sm90)):
        kernel = _call(t, mode, "triton")
        # The kernel is far closer to its own mode than the other mode is.
        assert (kernel != reference).float().mean().item() < differing / 20


def test_automatic_precision_follows_the_predicate(monkeypatch):
    """precision=None picks sm90 exactly when the patched predicate says Hopper, for bf16 inputs only."""
    t = make_inputs(CASES[0], torch.bfloat16, "cpu")
    generic, sm90 = (_call(t, mode, "torch") for mode in ("generic", "sm90_bf16_affine"))
    assert torch.equal(_call(t, None, "torch"), generic)
    monkeypatch.setattr(backend, "is_sm90_device", lambda device: True)
    assert torch.equal(_call(t, None, "torch"), sm90)
    monkeypatch.setenv(backend.PRECISION_ENV, "generic")
    assert torch.equal(_call(t, None, "torch"), generic)
    t32 = make_inputs(CASES[0], torch.float32, "cpu")
    monkeypatch.delenv(backend.PRECISION_ENV)
    assert torch.equal(_call(t32, None, "torch"), _call(t32, "generic", "torch"))


def test_row_chunks_cover_every_row(device, monkeypatch):
    """With a 4-row chunk limit the launcher makes several launches with row offsets and still fills every row."""
    monkeypatch.setattr(launch, "MAX_ROWS_PER_LAUNCH", 4)
    monkeypatch.setattr(launch, "CUDA_MAX_GRID_ROWS", 4)
    t = make_inputs(CASES[2], torch.bfloat16, device)  # 2 x 9 = 18 rows -> 5 launches
    assert len(launch.launch_plan(18, torch.device(device))) == 5
    assert_matches(_call(t, "sm90_bf16_affine", "triton"), _call(t, "sm90_bf16_affine", "torch"), exact=False)
