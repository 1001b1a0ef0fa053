"""kernels/fp8_linear.py: the row quantizer (Triton vs its torch reference) and the e4m3 linear (H3BATCH_PRECISION=fp8).

The quantizer must give the reference's e4m3 bytes and scales exactly; the linear's CUDA path (torch._scaled_mm)
must match the fake-quant reference within fp32-accumulation-order noise, and both stay within the e4m3 error of
the bf16 product. Fresh random inputs each case; a zero row must give zeros, never NaN.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from h3batch.kernels.fp8_linear import (
    FP8_DTYPE,
    FP8_MAX,
    fp8_linear,
    quantize_rows,
    reference_fp8_matmul,
    reference_quantize_rows,
    scaled_mm_supported,
)

SM89 = torch.cuda.is_available() and scaled_mm_supported(torch.device("cuda"))


def _rows(rows: int, cols: int, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 2, rows)[:, None]  # row scales over 5 decades
    x[1] = 0.0  # an all-zero row
    return x.to(torch.bfloat16).to(device)


def test_reference_quantization_round_trips_within_e4m3_precision():
    x = _rows(7, 300, "cpu", seed=1)
    q, scale = reference_quantize_rows(x)
    assert q.dtype == FP8_DTYPE and scale.shape == (7, 1) and scale.dtype == torch.float32
    back = q.float() * scale
    assert torch.isfinite(back).all() and torch.equal(back[1], torch.zeros(300))
    # Every row's largest element maps to ±448 and its relative error stays under e4m3's half ulp (2^-4).
    assert torch.allclose(q.float().abs().amax(-1)[[0, 2, 3, 4, 5, 6]], torch.full((6,), FP8_MAX))
    err = (back - x.float()).abs()
    assert (err <= x.float().abs() * 2**-4 + scale * 2**-9 * 1.01).all()


def test_triton_quantizer_gives_the_reference_bytes(device):
    if device == "cpu":
        pytest.skip("Triton's CPU interpreter rounds fp32 -> float8e4nv wrongly (1.965 -> 1.0, 168 -> 176 where "
                    "torch and the hardware give 2.0, 160): the compiled kernel is checked on CUDA")
    x = _rows(5, 5000, device, seed=2)  # wider than one 2048-column block: the amax loop crosses blocks
    q, scale = quantize_rows(x, backend="triton")
    ref_q, ref_scale = reference_quantize_rows(x)
    assert torch.equal(scale.cpu(), ref_scale.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.cpu().view(torch.uint8))


def test_fp8_linear_reference_is_close_to_the_bf16_product():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 33, 256, generator=g).to(torch.bfloat16)
    w = (torch.randn(96, 256, generator=g) * 256**-0.5).to(torch.bfloat16)
    wq, ws = reference_quantize_rows(w)
    got = fp8_linear(x, wq, ws)  # CPU: the fake-quant reference
    assert got.shape == (2, 33, 96) and got.dtype == torch.bfloat16
    ref = F.linear(x.float(), w.float())
    rel = float((got.float() - ref).norm() / ref.norm())
    assert 1e-2 < rel < 1e-1  # e4m3 operands (3 mantissa bits each): a few percent, not the bf16 product itself


def test_fp8_linear_refuses_a_bf16_weight():
    with pytest.raises(ValueError, match="weight_fp8"):
        fp8_linear(torch.zeros(2, 16), torch.zeros(8, 16), torch.ones(8, 1))


@pytest.mark.skipif(not SM89, reason="needs a CUDA GPU of compute capability >= 8.9 (e4m3 torch._scaled_mm)")
def test_scaled_mm_path_matches_the_fake_quant_reference_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(1, 1000, 1024, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(768, 1024, device="cuda", generator=g) * 1024**-0.5).to(torch.bfloat16)
    wq, ws = quantize_rows(w)
    out = torch.full((1, 1000, 768), float("nan"), device="cuda", dtype=torch.bfloat16)
    out.copy_(fp8_linear(x, wq, ws))
    xq, xs = quantize_rows(x.view(-1, 1024))
    ref = reference_fp8_matmul(xq, xs, wq, ws, torch.float32).view(1, 1000, 768)
    assert torch.isfinite(out).all()
    rel = float((out.float() - ref).norm() / ref.norm())
    assert rel < 4e-3  # same e4m3 operands; bf16 output rounding and accumulation order only
