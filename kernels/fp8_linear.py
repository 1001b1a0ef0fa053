"""fp8_linear: ``x @ wᵀ`` with e4m3 operands and row-wise scales (the opt-in H3BATCH_PRECISION=fp8, issue 25).

The weight is quantized once (``quantize_rows``: one fp32 scale per output row, ``amax / 448``); the activation is
quantized per call, one scale per input row, by one Triton pass (``quantize_rows`` on CUDA: a row's amax, then the
scaled cast, reading the row twice from L2 instead of the five eager passes abs/amax/div/clamp/cast). The product is
``torch._scaled_mm`` (cuBLASLt e4m3 GEMM, fp32 accumulation, both scales applied in the epilogue, bf16 out).

Everywhere else (CPU, and the Triton interpreter) the same quantization runs in torch and the product is the fake-
quant reference: the e4m3 values dequantized to fp32, multiplied in fp32, rounded once to the input dtype. That is
the path the tiny-size CPU tests measure the error of; on CUDA the GEMM differs from it only in accumulation order.

Quantization, both paths: ``inv = 448 / max(amax, 1e-12)`` in fp32, ``q = e4m3(clamp(x · inv, ±448))`` (round to
nearest even), ``scale = amax' / 448`` with ``amax' = max(amax, 1e-12)``, so a zero row gives zeros, never NaN.
Written here rather than reused: torchao's float8 training stack does this with its own tensor subclass and
``torch.compile``; this model runs eager, so one small kernel and one library GEMM call are the whole of it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from h3batch.kernels.backend import Backend, resolve_backend

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
"""Largest finite e4m3fn value."""
AMAX_FLOOR = 1e-12
"""Smallest amax a scale is made from (all-zero rows give zeros; 448 / floor stays finite in fp32)."""
BLOCK_COLUMNS = 2048


@triton.jit
def _quantize_rows_kernel(
    q_ptr,  # [M, K] e4m3 out, contiguous
    scale_ptr,  # [M] fp32 out: amax / 448
    x_ptr,  # [M, K] in, row stride stride_row, columns contiguous
    cols, stride_row,
    FP8_MAX_C: tl.constexpr, AMAX_FLOOR_C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_row
    q_row = q_ptr + row * cols
    offsets = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, cols, BLOCK):
        columns = start + offsets
        x = tl.load(x_row + columns, mask=columns < cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    row_amax = tl.maximum(tl.max(amax, axis=0), AMAX_FLOOR_C)
    inv = FP8_MAX_C / row_amax
    tl.store(scale_ptr + row, row_amax / FP8_MAX_C)
    for start in range(0, cols, BLOCK):
        columns = start + offsets
        mask = columns < cols
        x = tl.load(x_row + columns, mask=mask, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x * inv, -FP8_MAX_C), FP8_MAX_C)
        tl.store(q_row + columns, q.to(tl.float8e4nv), mask=mask)


def reference_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, K] -> (e4m3 [M, K], fp32 scale [M, 1]) in torch: the weight path at load, and the CPU path."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR)
    q = (xf * (FP8_MAX / amax)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, amax / FP8_MAX


def _check_2d(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D [M, K] tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"{name}: expected dtype float32, bfloat16 or float16, got {x.dtype}")
    if x.shape[-1] and x.stride(-1) != 1:
        raise ValueError(f"{name}: columns must be contiguous (stride 1), got strides {x.stride()}")


def quantize_rows(x: torch.Tensor, *, backend: Backend | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise e4m3 quantization: [M, K] -> (q [M, K] float8_e4m3fn, scale [M, 1] fp32), x ≈ q · scale."""
    _check_2d("x", x)
    if resolve_backend(backend, x.device, _quantize_rows_kernel) is Backend.TORCH:
        return reference_quantize_rows(x)
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    if rows and cols:
        _quantize_rows_kernel[(rows,)](q, scale, x, cols, x.stride(0), FP8_MAX_C=FP8_MAX, AMAX_FLOOR_C=AMAX_FLOOR,
                                       BLOCK=min(BLOCK_COLUMNS, triton.next_power_of_2(cols)), num_warps=4)
    return q, scale


def scaled_mm_supported(device: torch.device) -> bool:
    """True where ``torch._scaled_mm`` has an e4m3 row-wise-scaled GEMM: CUDA of compute capability >= 8.9."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def reference_fp8_matmul(xq: torch.Tensor, x_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                         out_dtype: torch.dtype) -> torch.Tensor:
    """Fake-quant product: dequantize both to fp32, multiply in fp32, round once to `out_dtype`. [M, N]"""
    return ((xq.float() * x_scale) @ (wq.float() * w_scale).t()).to(out_dtype)


def fp8_linear(x: torch.Tensor, weight_fp8: torch.Tensor, weight_scale: torch.Tensor,
               bias: torch.Tensor | None = None, *, backend: Backend | str | None = None) -> torch.Tensor:
    """``x @ dequant(weight)ᵀ (+ bias)`` for x [..., K] (bf16/fp32), weight_fp8 [N, K] e4m3, weight_scale [N, 1] fp32.

    CUDA sm_89+: Triton row quantization + ``torch._scaled_mm`` (bf16 out; cast to x's dtype). Else the fake-quant
    reference. ``backend="torch"`` forces the reference on any device."""
    if weight_fp8.dtype != FP8_DTYPE or weight_fp8.dim() != 2:
        raise ValueError(f"weight_fp8: expected a 2-D float8_e4m3fn tensor, got {weight_fp8.dtype} "
                         f"{tuple(weight_fp8.shape)}")
    out_features, in_features = weight_fp8.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"x: last dim must be {in_features}, got {x.shape[-1]}")
    if weight_scale.shape != (out_features, 1) or weight_scale.dtype != torch.float32:
        raise ValueError(f"weight_scale: expected fp32 [{out_features}, 1], got {weight_scale.dtype} "
                         f"{tuple(weight_scale.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, in_features)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    choice = resolve_backend(backend, x.device, _quantize_rows_kernel)
    xq, x_scale = quantize_rows(x2, backend=choice)
    if choice is Backend.TRITON and scaled_mm_supported(x.device):
        out = torch._scaled_mm(xq, weight_fp8.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1),
                               out_dtype=torch.bfloat16)
        if out.dtype != x.dtype:
            out = out.to(x.dtype)
    else:
        out = reference_fp8_matmul(xq, x_scale, weight_fp8, weight_scale, x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*lead, out_features)
