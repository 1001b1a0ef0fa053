"""Triton device functions shared by the kernels: the program's row and table row, row addresses, explicit bf16
rounding, row RMS, RMSNorm + affine.

Why round explicitly: under TRITON_INTERPRET=1 (Triton 3.9, CPU) an fp32 -> bf16 conversion truncates instead of
rounding to nearest even, and arithmetic on bf16 values returns garbage; converting a value that bf16 already
represents exactly is exact on every backend. So every kernel computes in fp32 and calls `round_to_bf16` wherever
the semantics round (and before a bf16 store); the store then converts exactly, and the kernels are bit-exact
against the torch references on CPU and GPU alike.

`round_to_bf16` has two bodies chosen by the launcher (constexpr NATIVE_CAST): integer round-to-nearest-even on the
bit pattern for the interpreter, and the hardware conversion (`cvt.rn.bf16.f32`, also nearest-even: same results,
tested against torch) for compiled kernels. The integer body costs ~20 integer ops per rounding; with five roundings
per element in the SM90 path it made the RMS kernel ALU-bound on an H200 (0.65 ms instead of ~0.2 ms).

Rows are streamed in BLOCK_SIZE-column chunks (a loop when BLOCK_SIZE < H): few registers per program, so many
programs share an SM and keep enough loads in flight; the second pass over a row re-reads it from L2.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_row(row_offset, seq_len):
    """The row this program owns (row_offset + program id 0, as int64), its batch item row // S and position row % S."""
    row = tl.program_id(0).to(tl.int64) + row_offset
    return row, row // seq_len, row % seq_len


@triton.jit
def indexed_program_row(row_offset, seq_len, indices_ptr):
    """`program_row` plus the modulation-table row of its position: (row, batch, position, indices[position])."""
    row, batch, position = program_row(row_offset, seq_len)
    table_row = tl.load(indices_ptr + position).to(tl.int64)
    return row, batch, position, table_row


@triton.jit
def row_start(base_ptr, batch, position, stride_batch, stride_row):
    """Address of row (batch, position) of a [B, S, H] view: base + batch * stride_batch + position * stride_row."""
    return base_ptr + batch * stride_batch + position * stride_row


@triton.jit
def round_to_bf16(value, NATIVE_CAST: tl.constexpr):
    """fp32 -> fp32 holding the nearest bf16 value, ties to even (torch's rule); NaN stays NaN."""
    if NATIVE_CAST:
        return value.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    bits = value.to(tl.uint32, bitcast=True)
    # Adding 0x7FFF plus the lowest kept bit carries into bit 16 exactly when the dropped half is above (or at, for
    # an odd kept part) the midpoint; overflow past the largest finite bf16 lands on inf, as a cast does.
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(value != value, float("nan"), rounded.to(tl.float32, bitcast=True))


@triton.jit
def row_rstd(row_ptr, hidden, eps, BLOCK_SIZE: tl.constexpr):
    """rsqrt(sum(x^2) / H + eps) of one row (row_ptr: its first element, columns contiguous), fp32.

    Sums per column slot across chunks, then across slots: the gate+norm kernel accumulates in the same order, so
    both RMS ops normalize a bf16 row bit-identically.
    """
    squares = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, hidden, BLOCK_SIZE):
        columns = start + tl.arange(0, BLOCK_SIZE)
        x = tl.load(row_ptr + columns, mask=columns < hidden, other=0.0).to(tl.float32)
        squares += x * x
    return tl.rsqrt(tl.sum(squares, axis=0) / hidden + eps)


@triton.jit
def normalize_modulate(x, rstd, weight, shift, scale, SM90_BF16_AFFINE: tl.constexpr, NATIVE_CAST: tl.constexpr):
    """One chunk: (x * rstd * w) * (1 + scale) + shift, in the chosen precision mode.

    x, rstd, weight: fp32; shift, scale: the indexed table chunk as loaded (storage dtype; to fp32 here is exact).
    Returns fp32; in SM90 mode the values are already bf16 values.
    """
    normalized = x * rstd * weight
    shift = shift.to(tl.float32)
    scale = scale.to(tl.float32)
    if SM90_BF16_AFFINE:
        # Spec §5.3: n rounded to bf16, then eager-bf16 ops, each rounding: bf16(bf16(n * bf16(scale + 1)) + shift).
        normalized = round_to_bf16(normalized, NATIVE_CAST)
        factor = round_to_bf16(scale + 1.0, NATIVE_CAST)
        out = round_to_bf16(round_to_bf16(normalized * factor, NATIVE_CAST) + shift, NATIVE_CAST)
    else:
        out = normalized * (1.0 + scale) + shift
    return out
