"""indexed_gate_rms_norm_scale_shift: gated residual update, then RMSNorm and indexed AdaLN affine, in one kernel.

Spec h3-model.md §5.1 (used at §4.3 step 6.4): `u = residual + gate[i] * branch`, `residual_out = bf16(u)`,
`modulated = RMSNorm_w(bf16(u)) * (1 + scale[i]) + shift[i]`, `i = indices[r]`. `u` is rounded to the residual's
dtype in every precision mode and on every backend: bf16 for the model's bf16 residual stream (the case that runs in
production, identical to vllm-omni's GPU kernel), no rounding for fp32 inputs. vllm-omni's GPU kernel hard-codes the
bf16 round trip even for fp32 inputs while its CPU fallback rounds to the input dtype (spec §5.2); h3batch uses the
fallback's rule everywhere so one model gives one answer on every backend, and the fp32 DiT matches the fp32
diffusers oracle exactly. Private Triton kernel, launcher, torch reference and the public dispatching function.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3batch.kernels import launch
from h3batch.kernels.backend import Backend, Precision, resolve_backend, resolve_precision
from h3batch.kernels.launch import block_config  # by name: benches and tests patch it per op
from h3batch.kernels.rms_norm_scale_shift import reference_rms_norm_indexed_scale_shift
from h3batch.kernels.triton_math import indexed_program_row, normalize_modulate, round_to_bf16, row_start


@triton.jit
def _indexed_gate_rms_norm_scale_shift_kernel(
    residual_out_ptr,  # output u, contiguous [B*S, H] in residual's dtype; row r at r * hidden
    modulated_ptr,  # output, contiguous [B*S, H] in residual's dtype; row r at r * hidden
    residual_ptr,  # residual stream; row (b, s) at b * stride_residual_batch + s * stride_residual_row
    gate_ptr,  # gate table [K, H]; row k at k * stride_gate_row, columns contiguous
    branch_ptr,  # branch output (attention / FFN); row (b, s) at b * stride_branch_batch + s * stride_branch_row
    weight_ptr,  # RMSNorm weight [H], fp32 or bf16, contiguous
    shift_ptr,  # shift table [K, H]; row k at k * stride_shift_row
    scale_ptr,  # scale table [K, H]; row k at k * stride_scale_row
    indices_ptr,  # table row per sequence position [S], int32 or int64, contiguous
    seq_len,  # S: rows per batch item
    hidden,  # H: columns per row
    stride_residual_batch, stride_residual_row,  # residual's strides in elements: batch item, row
    stride_branch_batch, stride_branch_row,  # branch's strides in elements: batch item, row
    stride_gate_row, stride_shift_row, stride_scale_row,  # the tables' row strides in elements
    row_offset,  # first row of this launch (row chunking)
    eps,
    SM90_BF16_AFFINE: tl.constexpr,  # spec §5.3 rounding of the normalized part
    OUT_BF16: tl.constexpr,  # residual is bf16: round u and `modulated` before their stores
    NATIVE_CAST: tl.constexpr,  # compiled kernel: round with the hardware cast (the interpreter's truncates)
    BLOCK_SIZE: tl.constexpr,  # columns per chunk (power of two); the row is streamed in chunks
):
    # This program owns one row: row = row_offset + program id, i.e. batch item row // S, position row % S.
    row, batch, position, table_row = indexed_program_row(row_offset, seq_len, indices_ptr)
    residual_row_ptr = row_start(residual_ptr, batch, position, stride_residual_batch, stride_residual_row)
    branch_row_ptr = row_start(branch_ptr, batch, position, stride_branch_batch, stride_branch_row)
    out_row_ptr = residual_out_ptr + row * hidden

    # Pass 1: u = residual + gate * branch in the residual's dtype (bf16-rounded for bf16); store it and sum its
    # squares in the same chunk order as row_rstd, so `modulated` is bit-identical to the RMS op applied to
    # residual_out. Cache hints (evict_last on what pass 2 re-reads and on the tables, evict_first on the rest)
    # measured ~2% faster here.
    squares = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for start in range(0, hidden, BLOCK_SIZE):
        columns = start + tl.arange(0, BLOCK_SIZE)
        mask = columns < hidden
        residual = tl.load(residual_row_ptr + columns, mask=mask, other=0.0, eviction_policy="evict_first")
        branch = tl.load(branch_row_ptr + columns, mask=mask, other=0.0, eviction_policy="evict_first")
        gate = tl.load(gate_ptr + table_row * stride_gate_row + columns, mask=mask, other=0.0,
                       eviction_policy="evict_last")
        updated = residual.to(tl.float32) + gate.to(tl.float32) * branch.to(tl.float32)
        if OUT_BF16:
            updated = round_to_bf16(updated, NATIVE_CAST)
        tl.store(out_row_ptr + columns, updated, mask=mask, eviction_policy="evict_last")  # re-read in pass 2
        squares += updated * updated
    rstd = tl.rsqrt(tl.sum(squares, axis=0) / hidden + eps)
    tl.debug_barrier()  # pass 2 re-reads residual_out written by other threads of this program

    # Pass 2: normalize the stored u (re-read from L2), modulate, store.
    for start in range(0, hidden, BLOCK_SIZE):
        columns = start + tl.arange(0, BLOCK_SIZE)
        mask = columns < hidden
        updated = tl.load(out_row_ptr + columns, mask=mask, other=0.0, eviction_policy="evict_first")
        updated = updated.to(tl.float32)
        weight = tl.load(weight_ptr + columns, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        shift = tl.load(shift_ptr + table_row * stride_shift_row + columns, mask=mask, other=0.0,
                        eviction_policy="evict_last")
        scale = tl.load(scale_ptr + table_row * stride_scale_row + columns, mask=mask, other=0.0,
                        eviction_policy="evict_last")
        out = normalize_modulate(updated, rstd, weight, shift, scale, SM90_BF16_AFFINE, NATIVE_CAST)
        if OUT_BF16 and not SM90_BF16_AFFINE:  # SM90 results are bf16 values already
            out = round_to_bf16(out, NATIVE_CAST)
        tl.store(modulated_ptr + row * hidden + columns, out, mask=mask, eviction_policy="evict_first")


def _launch(residual, gate, branch, weight, shift, scale, indices, eps, precision):
    residual_out, modulated = launch.new_rows(residual), launch.new_rows(residual)
    rows, seq_len, stride_residual_batch, stride_residual_row = launch.rows_of(residual)
    _, _, stride_branch_batch, stride_branch_row = launch.rows_of(branch)
    hidden = residual.shape[-1]
    block, warps = block_config(hidden)
    launch.launch_rows(_indexed_gate_rms_norm_scale_shift_kernel, rows, residual.device,
                       residual_out, modulated, residual, gate, branch, weight, shift, scale, indices, seq_len, hidden,
                       stride_residual_batch, stride_residual_row, stride_branch_batch, stride_branch_row,
                       gate.stride(0), shift.stride(0), scale.stride(0), eps=float(eps),
                       SM90_BF16_AFFINE=precision is Precision.SM90_BF16_AFFINE,
                       OUT_BF16=residual.dtype == torch.bfloat16, BLOCK_SIZE=block, num_warps=warps)
    return residual_out, modulated


def reference_indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale, indices, eps,
                                                precision: Precision) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager torch semantics of the op in the given mode (also the CPU path): `u` in the residual's dtype, then the
    RMS op's reference on it."""
    residual_out = (residual.float() + gate[indices].float() * branch.float()).to(residual.dtype)
    return residual_out, reference_rms_norm_indexed_scale_shift(residual_out, weight, shift, scale, indices, eps,
                                                                precision)


def indexed_gate_rms_norm_scale_shift(residual: torch.Tensor, gate: torch.Tensor, branch: torch.Tensor,
                                      weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor,
                                      indices: torch.Tensor, eps: float, *, precision: Precision | str | None = None,
                                      backend: Backend | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (residual_out, modulated), both new contiguous tensors shaped like residual.

    residual, branch: [R, H] or [B, S, H]; gate, shift, scale: [K, H] (row views allowed); weight [H];
    indices [S] in [0, K).
    """
    launch.check_activation("residual", residual)
    launch.check_activation("branch", branch, like=residual)
    launch.check_weight(weight, residual)
    launch.check_indexed_tables(residual, indices, ("gate", gate), ("shift", shift), ("scale", scale))
    launch.check_eps(eps)
    mode = resolve_precision(precision, residual)
    if resolve_backend(backend, residual.device, _indexed_gate_rms_norm_scale_shift_kernel) is Backend.TORCH:
        return reference_indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale, indices,
                                                           eps, mode)
    if residual.numel() == 0:
        return launch.new_rows(residual), launch.new_rows(residual)
    return _launch(residual, gate, branch, weight, shift, scale, indices, eps, mode)
