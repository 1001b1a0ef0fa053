"""indexed_gate: `out[r] = x[r] + gate[i] * other[r]`, `i = indices[r]` (gated residual add, new tensor).

Spec h3-model.md §5.1 (used at §4.3 step 6.5). fp32 math with one rounding at the store in both precision modes
(§5.3 leaves this op generic; `precision` is still resolved and checked). Private Triton kernel, launcher, torch
reference, public function.
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
def _indexed_gate_kernel(
    out_ptr,  # output, contiguous [B*S, H] in x's dtype; row r at r * hidden
    x_ptr,  # residual stream; row (b, s) at b * stride_x_batch + s * stride_x_row, columns contiguous
    gate_ptr,  # gate table [K, H]; row k at k * stride_gate_row, columns contiguous
    other_ptr,  # branch output; row (b, s) at b * stride_other_batch + s * stride_other_row
    indices_ptr,  # table row per sequence position [S], int32 or int64, contiguous
    seq_len,  # S: rows per batch item
    hidden,  # H: columns per row
    stride_x_batch, stride_x_row,  # x's strides in elements: batch item, row
    stride_other_batch, stride_other_row,  # other's strides in elements: batch item, row
    stride_gate_row,  # gate table's row stride in elements
    row_offset,  # first row of this launch (row chunking)
    OUT_BF16: tl.constexpr,  # output is bf16: round before the store
    NATIVE_CAST: tl.constexpr,  # compiled kernel: round with the hardware cast (the interpreter's truncates)
    BLOCK_SIZE: tl.constexpr,  # columns per chunk (power of two); the row is streamed in chunks
):
    # This program owns one row: row = row_offset + program id, i.e. batch item row // S, position row % S.
    row, batch, position, table_row = indexed_program_row(row_offset, seq_len, indices_ptr)
    x_row_ptr = row_start(x_ptr, batch, position, stride_x_batch, stride_x_row)
    other_row_ptr = row_start(other_ptr, batch, position, stride_other_batch, stride_other_row)

    for start in range(0, hidden, BLOCK_SIZE):
        columns = start + tl.arange(0, BLOCK_SIZE)
        mask = columns < hidden
        x = tl.load(x_row_ptr + columns, mask=mask, other=0.0).to(tl.float32)
        other = tl.load(other_row_ptr + columns, mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(gate_ptr + table_row * stride_gate_row + columns, mask=mask, other=0.0).to(tl.float32)
        out = x + gate * other
        if OUT_BF16:
            out = round_to_bf16(out, NATIVE_CAST)
        tl.store(out_ptr + row * hidden + columns, out, mask=mask)


def _launch(x: torch.Tensor, gate: torch.Tensor, other: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    out = launch.new_rows(x)
    rows, seq_len, stride_x_batch, stride_x_row = launch.rows_of(x)
    _, _, stride_other_batch, stride_other_row = launch.rows_of(other)
    block, warps = block_config(x.shape[-1])
    launch.launch_rows(_indexed_gate_kernel, rows, x.device,
                       out, x, gate, other, indices, seq_len, x.shape[-1], stride_x_batch, stride_x_row,
                       stride_other_batch, stride_other_row, gate.stride(0),
                       OUT_BF16=x.dtype == torch.bfloat16, BLOCK_SIZE=block, num_warps=warps)
    return out


def reference_indexed_gate(x: torch.Tensor, gate: torch.Tensor, other: torch.Tensor,
                           indices: torch.Tensor) -> torch.Tensor:
    """x + gate[i] * other in fp32, one rounding to x's dtype."""
    return (x.float() + gate[indices].float() * other.float()).to(x.dtype)


def indexed_gate(x: torch.Tensor, gate: torch.Tensor, other: torch.Tensor, indices: torch.Tensor, *,
                 precision: Precision | str | None = None, backend: Backend | str | None = None) -> torch.Tensor:
    """Gated residual add; returns a new contiguous tensor. x, other: [R, H] or [B, S, H]; gate [K, H]; indices [S]."""
    launch.check_activation("x", x)
    launch.check_activation("other", other, like=x)
    launch.check_indexed_tables(x, indices, ("gate", gate))
    resolve_precision(precision, x)  # same semantics in every mode; resolved only to refuse bad values
    if resolve_backend(backend, x.device, _indexed_gate_kernel) is Backend.TORCH:
        return reference_indexed_gate(x, gate, other, indices)
    if x.numel() == 0:
        return launch.new_rows(x)
    return _launch(x, gate, other, indices)
