"""indexed_scale_shift_: in place `x[r] <- x[r] * (1 + scale[i]) + shift[i]`, `i = indices[r]`.

Spec h3-model.md §5.1 (final layer, after `norm_out.norm`, with `indices = timestep_indices`). fp32 math with one
rounding at the store in both precision modes (§5.3 leaves this op generic; `precision` is still resolved and
checked so a bad knob fails here too). Private Triton kernel, launcher, torch reference, public function.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3batch.kernels import launch
from h3batch.kernels.backend import Backend, Precision, resolve_backend, resolve_precision
from h3batch.kernels.launch import block_config  # by name: benches and tests patch it per op
from h3batch.kernels.triton_math import indexed_program_row, round_to_bf16, row_start


@triton.jit
def _indexed_scale_shift_kernel(
    x_ptr,  # activations, read and overwritten; row (b, s) at b * stride_x_batch + s * stride_x_row
    shift_ptr,  # shift table [K, H]; row k at k * stride_shift_row, columns contiguous
    scale_ptr,  # scale table [K, H]; row k at k * stride_scale_row, columns contiguous
    indices_ptr,  # table row per sequence position [S], int32 or int64, contiguous
    seq_len,  # S: rows per batch item
    hidden,  # H: columns per row
    stride_x_batch, stride_x_row,  # x's strides in elements: batch item, row
    stride_shift_row, stride_scale_row,  # the tables' row strides in elements
    row_offset,  # first row of this launch (row chunking)
    OUT_BF16: tl.constexpr,  # x is bf16: round before the store
    NATIVE_CAST: tl.constexpr,  # compiled kernel: round with the hardware cast (the interpreter's truncates)
    BLOCK_SIZE: tl.constexpr,  # columns per chunk (power of two); the row is streamed in chunks
):
    # This program owns one row of x: row = row_offset + program id, i.e. batch item row // S, position row % S.
    _, batch, position, table_row = indexed_program_row(row_offset, seq_len, indices_ptr)
    x_row_ptr = row_start(x_ptr, batch, position, stride_x_batch, stride_x_row)

    for start in range(0, hidden, BLOCK_SIZE):
        columns = start + tl.arange(0, BLOCK_SIZE)
        mask = columns < hidden
        x = tl.load(x_row_ptr + columns, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + table_row * stride_shift_row + columns, mask=mask, other=0.0).to(tl.float32)
        scale = tl.load(scale_ptr + table_row * stride_scale_row + columns, mask=mask, other=0.0).to(tl.float32)
        out = x * (1.0 + scale) + shift
        if OUT_BF16:
            out = round_to_bf16(out, NATIVE_CAST)
        tl.store(x_row_ptr + columns, out, mask=mask)


def _launch(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, indices: torch.Tensor) -> None:
    rows, seq_len, stride_batch, stride_row = launch.rows_of(x)
    block, warps = block_config(x.shape[-1])
    launch.launch_rows(_indexed_scale_shift_kernel, rows, x.device,
                       x, shift, scale, indices, seq_len, x.shape[-1], stride_batch, stride_row,
                       shift.stride(0), scale.stride(0),
                       OUT_BF16=x.dtype == torch.bfloat16, BLOCK_SIZE=block, num_warps=warps)


def reference_indexed_scale_shift(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
                                  indices: torch.Tensor) -> torch.Tensor:
    """x * (1 + scale[i]) + shift[i] in fp32, one rounding to x's dtype; returns a new tensor."""
    return (x.float() * (1.0 + scale[indices].float()) + shift[indices].float()).to(x.dtype)


def indexed_scale_shift_(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, indices: torch.Tensor, *,
                         precision: Precision | str | None = None,
                         backend: Backend | str | None = None) -> torch.Tensor:
    """Indexed AdaLN affine written into x; returns x. x: [R, H] or [B, S, H]; shift, scale [K, H]; indices [S]."""
    launch.check_activation("x", x)
    launch.check_indexed_tables(x, indices, ("shift", shift), ("scale", scale))
    resolve_precision(precision, x)  # same semantics in every mode; resolved only to refuse bad values
    if resolve_backend(backend, x.device, _indexed_scale_shift_kernel) is Backend.TORCH:
        return x.copy_(reference_indexed_scale_shift(x, shift, scale, indices))
    if x.numel() > 0:
        _launch(x, shift, scale, indices)
    return x
