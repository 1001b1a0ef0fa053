"""triton_math: `round_to_bf16` in both bodies against torch's cast, and why the integer body exists."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from h3batch.kernels.triton_math import round_to_bf16


@triton.jit
def _round_kernel(src_ptr,  # fp32 [N] values to round
                  dst_ptr,  # fp32 [N] rounded values (exact bf16 values)
                  N: tl.constexpr, NATIVE_CAST: tl.constexpr):
    # One program owns the whole (tiny) vector.
    offsets = tl.arange(0, N)
    tl.store(dst_ptr + offsets, round_to_bf16(tl.load(src_ptr + offsets), NATIVE_CAST))


def _rounding_inputs(device: str) -> torch.Tensor:
    """Ties, carries, overflow, subnormals, signed zero, inf, NaN, then random bit patterns (fp32 [4096])."""
    special = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0x3F7FFFFF, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,
                            0x00008000, 0x00018000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001],
                           dtype=torch.int64).to(torch.int32).view(torch.float32)
    bits = torch.randint(-2**31, 2**31 - 1, (4096 - special.numel(),), generator=torch.Generator().manual_seed(3),
                         dtype=torch.int64).to(torch.int32)
    return torch.cat([special, bits.view(torch.float32)]).to(device)


def _assert_equal_with_nan(actual: torch.Tensor, expected: torch.Tensor) -> None:
    nan = expected.isnan()
    assert torch.equal(actual.isnan(), nan)
    assert torch.equal(actual[~nan], expected[~nan])


@pytest.mark.parametrize("native_cast", [False, True])
def test_kernel_rounding_matches_torch_cast(device, native_cast):
    """round_to_bf16 equals torch's fp32 -> bf16 cast (nearest even) in both bodies (integer and hardware cast)."""
    if device == "cpu" and native_cast:
        pytest.skip("the interpreter's cast truncates: covered by test_interpreter_cast_truncates")
    values = _rounding_inputs(device)
    out = torch.empty_like(values)
    _round_kernel[(1,)](values, out, N=values.numel(), NATIVE_CAST=native_cast)
    _assert_equal_with_nan(out, values.to(torch.bfloat16).float())


def test_interpreter_cast_truncates(device):
    """Why the integer body exists: in the interpreter a plain fp32 -> bf16 cast truncates normal numbers (and
    mangles subnormals, which the integer body and bf16 loads/stores of normal values never meet)."""
    if device != "cpu":
        pytest.skip("compiled kernels round correctly with the hardware cast (test_kernel_rounding_matches_torch_cast)")
    values = _rounding_inputs(device)
    out = torch.empty_like(values)
    _round_kernel[(1,)](values, out, N=values.numel(), NATIVE_CAST=True)
    truncated = (values.view(torch.int32) & ~0xFFFF).view(torch.float32)
    normal = values.isfinite() & (values.abs() >= torch.finfo(torch.float32).tiny)
    assert torch.equal(out[normal], truncated[normal])
    assert not torch.equal(out[normal], values[normal].to(torch.bfloat16).float())
