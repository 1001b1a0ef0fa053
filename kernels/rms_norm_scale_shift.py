"""rms_norm_indexed_scale_shift: `out[r] = RMSNorm_w(x[r]) * (1 + scale[i]) + shift[i]`, `i = indices[r]`.

Spec h3-model.md §5.1 (used at §4.3 step 6.2). Private Triton kernel, launcher, torch reference, and the public
dispatching function; precision modes are described in `h3batch.kernels.backend`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3batch.kernels import launch
from h3batch.kernels.backend import Backend, Precision, resolve_backend, resolve_precision
from h3batch.kernels.launch import block_config  # by name: benches and tests patch it per op
from h3batch.kernels.triton_math import indexed_program_row, normalize_modulate, round_to_bf16, row_rstd, row_start


@triton.jit
def _rms_norm_indexed_scale_shift_kernel(
    out_ptr,  # output, contiguous [B*S, H] in x's dtype; row r at r * hidden
    x_ptr,  # input activations; row (b, s) at b * stride_x_batch + s * stride_x_row, columns contiguous
    weight_ptr,  # RMSNorm weight [H], fp32 or bf16, contiguous
    shift_ptr,  # shift table [K, H]; row k at k * stride_shift_row, columns contiguous
    scale_ptr,  # scale table [K, H]; row k at k * stride_scale_row, columns contiguous
    indices_ptr,  # table row per sequence position [S], int32 or int64, contiguous
    seq_len,  # S: rows per batch item (the indices repeat for every batch item)
    hidden,  # H: columns per row
    stride_x_batch, stride_x_row,  # x's strides in elements: batch item, row
    stride_shift_row, stride_scale_row,  # the tables' row strides in elements
    row_offset,  # first row of this launch (row chunking)
    eps,
    SM90_BF16_AFFINE: tl.constexpr,  # spec §5.3 rounding instead of fp32 with one rounding
    OUT_BF16: tl.constexpr,  # round the result to bf16 before the store (the store then converts exactly)
    NATIVE_CAST: tl.constexpr,  # compiled kernel: round with the hardware cast (the interpreter's truncates)
    BLOCK_SIZE: tl.constexpr,  # columns per chunk (power of two)
    RESIDENT_CHUNKS: tl.constexpr,  # 1..4: the whole row stays in registers (one read); 0: stream it twice
):
    # This program owns one row of x: row = row_offset + program id, i.e. batch item row // S, position row % S.
    row, batch, position, table_row = indexed_program_row(row_offset, seq_len, indices_ptr)
    x_row_ptr = row_start(x_ptr, batch, position, stride_x_batch, stride_x_row)
    out_row_ptr = out_ptr + row * hidden
    shift_row_ptr = shift_ptr + table_row * stride_shift_row
    scale_row_ptr = scale_ptr + table_row * stride_scale_row

    if RESIDENT_CHUNKS > 0:
        # Rows of up to 4 chunks (H <= 8192, e.g. 5376 = 3 chunks of 2048) are read once and kept in registers: the
        # streamed variant's second read of the row (from L2) cost ~10% of copy bandwidth on an H200. Squares are
        # summed per column slot chunk by chunk, the order row_rstd uses, so results are bit-identical to it.
        x0 = _load_row_chunk(x_row_ptr, 0, hidden, BLOCK_SIZE)
        squares = x0 * x0
        if RESIDENT_CHUNKS > 1:
            x1 = _load_row_chunk(x_row_ptr, BLOCK_SIZE, hidden, BLOCK_SIZE)
            squares += x1 * x1
        if RESIDENT_CHUNKS > 2:
            x2 = _load_row_chunk(x_row_ptr, 2 * BLOCK_SIZE, hidden, BLOCK_SIZE)
            squares += x2 * x2
        if RESIDENT_CHUNKS > 3:
            x3 = _load_row_chunk(x_row_ptr, 3 * BLOCK_SIZE, hidden, BLOCK_SIZE)
            squares += x3 * x3
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / hidden + eps)
        _modulate_store_chunk(out_row_ptr, x0, 0, rstd, weight_ptr, shift_row_ptr, scale_row_ptr, hidden,
                              SM90_BF16_AFFINE, OUT_BF16, NATIVE_CAST, BLOCK_SIZE)
        if RESIDENT_CHUNKS > 1:
            _modulate_store_chunk(out_row_ptr, x1, BLOCK_SIZE, rstd, weight_ptr, shift_row_ptr, scale_row_ptr,
                                  hidden, SM90_BF16_AFFINE, OUT_BF16, NATIVE_CAST, BLOCK_SIZE)
        if RESIDENT_CHUNKS > 2:
            _modulate_store_chunk(out_row_ptr, x2, 2 * BLOCK_SIZE, rstd, weight_ptr, shift_row_ptr, scale_row_ptr,
                                  hidden, SM90_BF16_AFFINE, OUT_BF16, NATIVE_CAST, BLOCK_SIZE)
        if RESIDENT_CHUNKS > 3:
            _modulate_store_chunk(out_row_ptr, x3, 3 * BLOCK_SIZE, rstd, weight_ptr, shift_row_ptr, scale_row_ptr,
                                  hidden, SM90_BF16_AFFINE, OUT_BF16, NATIVE_CAST, BLOCK_SIZE)
    else:
        rstd = row_rstd(x_row_ptr, hidden, eps, BLOCK_SIZE)
        for start in range(0, hidden, BLOCK_SIZE):  # second pass over the row: normalize, modulate, store
            x = _load_row_chunk(x_row_ptr, start, hidden, BLOCK_SIZE)
            _modulate_store_chunk(out_row_ptr, x, start, rstd, weight_ptr, shift_row_ptr, scale_row_ptr, hidden,
                                  SM90_BF16_AFFINE, OUT_BF16, NATIVE_CAST, BLOCK_SIZE)


@triton.jit
def _load_row_chunk(row_ptr, start, hidden, BLOCK_SIZE: tl.constexpr):
    """Columns [start, start + BLOCK_SIZE) of one row as fp32 (zeros past the row's end)."""
    columns = start + tl.arange(0, BLOCK_SIZE)
    return tl.load(row_ptr + columns, mask=columns < hidden, other=0.0).to(tl.float32)


@triton.jit
def _modulate_store_chunk(out_row_ptr, x, start, rstd, weight_ptr, shift_row_ptr, scale_row_ptr, hidden,
                          SM90_BF16_AFFINE: tl.constexpr, OUT_BF16: tl.constexpr, NATIVE_CAST: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr):
    """Normalize one fp32 chunk, apply the indexed affine, round if needed and store it."""
    columns = start + tl.arange(0, BLOCK_SIZE)
    mask = columns < hidden
    # No cache hints here: evict_first/evict_last measured 4-7% slower for this op on an H200.
    weight = tl.load(weight_ptr + columns, mask=mask, other=0.0).to(tl.float32)
    shift = tl.load(shift_row_ptr + columns, mask=mask, other=0.0)
    scale = tl.load(scale_row_ptr + columns, mask=mask, other=0.0)
    out = normalize_modulate(x, rstd, weight, shift, scale, SM90_BF16_AFFINE, NATIVE_CAST)
    if OUT_BF16 and not SM90_BF16_AFFINE:  # SM90 results are bf16 values already
        out = round_to_bf16(out, NATIVE_CAST)
    tl.store(out_row_ptr + columns, out, mask=mask)


MAX_RESIDENT_CHUNKS = 4
"""Rows of at most this many chunks are held in registers (one read of x); longer rows are streamed twice."""


def resident_chunks(hidden: int, block: int) -> int:
    """RESIDENT_CHUNKS for a row of `hidden` columns in `block`-column chunks (0 = stream)."""
    chunks = -(-hidden // block)
    return chunks if chunks <= MAX_RESIDENT_CHUNKS else 0


def _launch(x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, indices: torch.Tensor,
            eps: float, precision: Precision) -> torch.Tensor:
    out = launch.new_rows(x)
    rows, seq_len, stride_batch, stride_row = launch.rows_of(x)
    hidden = x.shape[-1]
    block, warps = block_config(hidden)
    launch.launch_rows(_rms_norm_indexed_scale_shift_kernel, rows, x.device,
                       out, x, weight, shift, scale, indices, seq_len, hidden, stride_batch, stride_row,
                       shift.stride(0), scale.stride(0), eps=float(eps),
                       SM90_BF16_AFFINE=precision is Precision.SM90_BF16_AFFINE, OUT_BF16=x.dtype == torch.bfloat16,
                       BLOCK_SIZE=block, RESIDENT_CHUNKS=resident_chunks(hidden, block), num_warps=warps)
    return out


def round_bf16(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest bf16 (ties to even, as torch casts) -> back to fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


def reference_rms_norm_indexed_scale_shift(x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor,
                                           scale: torch.Tensor, indices: torch.Tensor, eps: float,
                                           precision: Precision) -> torch.Tensor:
    """Eager torch semantics of the op in the given mode (also the CPU path): fp32 RMSNorm of x, then the affine.

    The gate+norm op's reference normalizes its `residual_out` with this function (the spec's residual boundary).
    """
    u = x.float()
    variance = (u * u).sum(-1, keepdim=True) / u.shape[-1]
    normalized = u * torch.rsqrt(variance + eps) * weight.float()
    shift_rows, scale_rows = shift[indices].float(), scale[indices].float()
    if precision is Precision.GENERIC:
        out = normalized * (1.0 + scale_rows) + shift_rows
    else:
        # SM90_BF16_AFFINE: n rounded to bf16, then each bf16 op rounds (eager bf16: (scale + 1), n * that, + shift).
        normalized = round_bf16(normalized)
        out = round_bf16(round_bf16(normalized * round_bf16(scale_rows + 1.0)) + shift_rows)
    return out.to(x.dtype)


def rms_norm_indexed_scale_shift(x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
                                 indices: torch.Tensor, eps: float, *, precision: Precision | str | None = None,
                                 backend: Backend | str | None = None) -> torch.Tensor:
    """RMSNorm then indexed AdaLN affine; returns a new contiguous tensor shaped like x.

    x: [R, H] or [B, S, H]; weight [H]; shift, scale [K, H] (row views allowed); indices [S] in [0, K).
    """
    launch.check_activation("x", x)
    launch.check_weight(weight, x)
    launch.check_indexed_tables(x, indices, ("shift", shift), ("scale", scale))
    launch.check_eps(eps)
    mode = resolve_precision(precision, x)
    if resolve_backend(backend, x.device, _rms_norm_indexed_scale_shift_kernel) is Backend.TORCH:
        return reference_rms_norm_indexed_scale_shift(x, weight, shift, scale, indices, eps, mode)
    if x.numel() == 0:
        return launch.new_rows(x)
    return _launch(x, weight, shift, scale, indices, eps, mode)
