"""swiglu: ``silu(gate) * up`` from fc1's packed output ``[..., 2F]`` (gate = first half, up = second half).

Spec h3-model.md §4.3 (SwiGLU: fc1 -> silu(g) * u -> fc2, native gate-first layout). Eager torch runs silu and the
product as two kernels plus the chunk views and writes an [S, F] temporary in between (~2.5 ms per DiT block at
S = 32,740, F = 14,336); this kernel reads g and u once and writes the product once.

Semantics are the eager ones: ``F.silu`` computes ``g / (1 + exp(-g))`` in fp32 and rounds to bf16, then the bf16
product rounds again. fp32 inputs skip both roundings. Compiled kernels use libdevice ``expf`` and IEEE division (the
functions torch's CUDA silu calls), so they can be bit-exact with eager CUDA; the CPU interpreter has no libdevice
and uses ``tl.exp`` (numpy's), which may differ from torch's vectorized CPU exp in the last fp32 bit and so, on rare
ties, by one bf16 ulp. Written by hand, not taken from a library: the public fused SwiGLU kernels (Liger's, vLLM's
``silu_and_mul``) compute silu(g) * u in fp32 with one rounding, not this model's two.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra import libdevice

from h3batch.kernels.backend import Backend, resolve_backend
from h3batch.kernels.launch import check_dtype, launch_rows, rows_of
from h3batch.kernels.triton_math import program_row, round_to_bf16, row_start

BLOCK_COLUMNS = 1024
"""Output columns per program: 8 bf16 per thread (16-byte loads) at 4 warps."""


@triton.jit
def _swiglu_kernel(
    out_ptr,  # output [B*S, F] contiguous in the input's dtype
    fc1_ptr,  # fc1 output; row (b, s) at b * stride_batch + s * stride_row, columns [gate (F) | up (F)]
    seq_len,  # S: rows per batch item
    ffn,  # F: output columns
    stride_batch, stride_row,  # fc1 output's strides in elements: batch item, row
    row_offset,  # first row of this launch (row chunking)
    ROUND_BF16: tl.constexpr,  # bf16 semantics: silu rounds, the product rounds
    NATIVE_CAST: tl.constexpr,  # compiled kernel: hardware rounding, libdevice expf and IEEE division
    BLOCK_SIZE: tl.constexpr,  # output columns per program (power of two)
):
    # This program owns columns [pid1 * BLOCK_SIZE, +BLOCK_SIZE) of one row: row = row_offset + program id 0.
    row, batch, position = program_row(row_offset, seq_len)
    columns = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = columns < ffn
    in_row_ptr = row_start(fc1_ptr, batch, position, stride_batch, stride_row)
    gate = tl.load(in_row_ptr + columns, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(in_row_ptr + ffn + columns, mask=mask, other=0.0).to(tl.float32)
    if NATIVE_CAST:
        silu = libdevice.div_rn(gate, 1.0 + libdevice.exp(-gate))
    else:
        silu = gate / (1.0 + tl.exp(-gate))
    if ROUND_BF16:
        silu = round_to_bf16(silu, NATIVE_CAST)
        out = round_to_bf16(silu * up, NATIVE_CAST)
    else:
        out = silu * up
    tl.store(out_ptr + row * ffn + columns, out, mask=mask)


def _check(fc1_out: torch.Tensor) -> None:
    if not isinstance(fc1_out, torch.Tensor) or fc1_out.dim() not in (2, 3):
        raise ValueError(f"fc1_out: expected a 2-D [R, 2F] or 3-D [B, S, 2F] tensor, got "
                         f"{tuple(fc1_out.shape) if isinstance(fc1_out, torch.Tensor) else type(fc1_out).__name__}")
    check_dtype("fc1_out", fc1_out)
    if fc1_out.shape[-1] % 2 or fc1_out.shape[-1] == 0:
        raise ValueError(f"fc1_out: last dim must be 2F (gate | up) with F >= 1, got {fc1_out.shape[-1]}")
    if fc1_out.stride(-1) != 1:
        raise ValueError(f"fc1_out: columns must be contiguous (stride 1), got strides {fc1_out.stride()}")


def reference_swiglu(fc1_out: torch.Tensor) -> torch.Tensor:
    """The model's eager path (also the CPU path): ``silu(gate) * up`` in the input's dtype."""
    gate, up = fc1_out.chunk(2, dim=-1)
    return F.silu(gate) * up


def _launch(fc1_out: torch.Tensor) -> torch.Tensor:
    ffn = fc1_out.shape[-1] // 2
    out = torch.empty((*fc1_out.shape[:-1], ffn), dtype=fc1_out.dtype, device=fc1_out.device)
    rows, seq_len, stride_batch, stride_row = rows_of(fc1_out)
    if rows == 0:
        return out
    block = min(BLOCK_COLUMNS, triton.next_power_of_2(ffn))
    launch_rows(_swiglu_kernel, rows, fc1_out.device, out, fc1_out, seq_len, ffn, stride_batch, stride_row,
                grid_columns=triton.cdiv(ffn, block), ROUND_BF16=fc1_out.dtype == torch.bfloat16,
                BLOCK_SIZE=block, num_warps=max(1, min(4, block // 256)))
    return out


def swiglu(fc1_out: torch.Tensor, *, backend: Backend | str | None = None) -> torch.Tensor:
    """``silu(fc1_out[..., :F]) * fc1_out[..., F:]``: [R, 2F] or [B, S, 2F] -> contiguous [..., F].

    ``backend``: None (env H3BATCH_KERNEL_BACKEND, else triton on CUDA / torch on CPU), "triton" or "torch".
    """
    _check(fc1_out)
    if resolve_backend(backend, fc1_out.device, _swiglu_kernel) is Backend.TORCH:
        return reference_swiglu(fc1_out)
    return _launch(fc1_out)
