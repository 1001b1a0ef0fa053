"""Triton device functions shared by the modulation kernels: explicit bf16 rounding and RMSNorm + affine.

Why round by hand: under TRITON_INTERPRET=1 (Triton 3.9, CPU) an fp32 -> bf16 conversion truncates instead of
rounding to nearest even, and arithmetic on bf16 values returns garbage; converting a value that bf16 already
represents exactly is exact on every backend. So every kernel computes in fp32 and calls `round_to_bf16` wherever
the semantics round (and before a bf16 store). On a GPU it costs a few integer ops per element of a memory-bound
kernel, and makes the kernels bit-exact against the torch references on CPU and GPU alike.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_bf16(value):
    """fp32 -> fp32 holding the nearest bf16 value, ties to even (torch's rule); NaN stays NaN."""
    bits = value.to(tl.uint32, bitcast=True)
    # Adding 0x7FFF plus the lowest kept bit carries into bit 16 exactly when the dropped half is above (or at, for
    # an odd kept part) the midpoint; overflow past the largest finite bf16 lands on inf, as a cast does.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(value != value, float("nan"), rounded.to(tl.float32, bitcast=True))


@triton.jit
def rms_norm_modulate(u, weight, shift, scale, mask, hidden, eps, SM90_BF16_AFFINE: tl.constexpr):
    """One row: RMSNorm_w(u) * (1 + scale) + shift in fp32; the affine in the chosen precision mode.

    u, weight: fp32 [BLOCK_SIZE] (masked columns hold 0); shift, scale: the indexed table row as loaded (storage
    dtype, converted to fp32 here: exact). Returns fp32 values; in SM90 mode they are already bf16 values.
    """
    variance = tl.sum(u * u, axis=0) / hidden
    normalized = u * tl.rsqrt(variance + eps) * weight
    shift = shift.to(tl.float32)
    scale = scale.to(tl.float32)
    if SM90_BF16_AFFINE:
        # Spec §5.3: n rounded to bf16, then eager-bf16 ops, each rounding: bf16(bf16(n * bf16(scale + 1)) + shift).
        normalized = round_to_bf16(normalized)
        out = round_to_bf16(round_to_bf16(normalized * round_to_bf16(scale + 1.0)) + shift)
    else:
        out = normalized * (1.0 + scale) + shift
    return tl.where(mask, out, 0.0)
