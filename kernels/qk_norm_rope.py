"""qk_norm_rope: per-head RMSNorm of q and k plus partial rotate-half RoPE, read straight from the packed qkv output.

Spec h3-model.md §4.3 (attention: qkv_proj -> per-head q/k RMSNorm -> RoPE on channels [0, 6n) -> core). The eager
path runs ~10 elementwise kernels over q and k (RMSNorm, the cos/sin casts, cat, neg, three muls/adds, cat) and
moves ~4 GB per DiT block at S = 32,740; this kernel reads each q/k element once and writes it once.

Semantics are the eager ones, rounding where eager bf16 rounds (each op's result is a bf16 tensor):

* RMSNorm (``nn.RMSNorm`` / ``F.rms_norm``): fp32 sum of squares over the head, ``n = bf16((x * rstd) * w)`` with
  the weight upcast to fp32; one rounding.
* RoPE on channels ``c < W`` (W = 6n, half = W / 2): cos and sin rounded to bf16 first (the model casts the fp32
  tables), ``y = bf16(bf16(n * cos) + bf16(rot(n) * sin))`` with ``rot(n)[c] = -n[c + half]`` for ``c < half`` and
  ``n[c - half]`` above; channels ``c >= W`` are ``n`` unchanged.

fp32 inputs skip every rounding (fp32 eager math). Products of bf16 values are exact in fp32 and every later step
rounds, so the RoPE part is bit-exact against eager torch on CPU and GPU; the RMSNorm part can differ by one bf16
ulp on rare elements where the fp32 sum of squares is accumulated in another order (torch's CPU and CUDA kernels each
have their own). Written by hand, not taken from a library: the public fused versions (vLLM's, FlashInfer's) do not
round like this model's eager bf16 path and do not take the partial 3-axis rotary layout.

Returns q and k as contiguous ``[B, S, heads, hd]`` tensors (views into one ``[2, B, S, heads, hd]`` buffer), the
layout ``AttentionCore`` takes; v stays a view of the qkv output.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from h3batch.kernels.backend import Backend, resolve_backend
from h3batch.kernels.launch import check_dtype, check_eps, launch_rows
from h3batch.kernels.triton_math import program_row, round_to_bf16

MAX_ELEMENTS_PER_PROGRAM = 1024
"""Heads per program are chosen so one program holds at most this many channels (8 heads of 128 for H3)."""


@triton.jit
def _qk_norm_rope_kernel(
    out_ptr,  # output [2, B*S, heads * hd] contiguous in qkv's dtype: q rows, then k rows
    qkv_ptr,  # packed projection; row (b, s) at b * stride_qkv_batch + s * stride_qkv_row, columns [Q | K | V]
    q_weight_ptr,  # q RMSNorm weight [hd], contiguous, fp32 or bf16
    k_weight_ptr,  # k RMSNorm weight [hd], contiguous, fp32 or bf16
    cos_ptr,  # RoPE cos table [S, W]; row s at s * stride_rope_row, columns contiguous (unused without ROPE_WIDTH)
    sin_ptr,  # RoPE sin table [S, W], same strides as cos
    seq_len,  # S: rows per batch item (the tables are shared by the batch items)
    rows,  # B * S
    heads,  # heads of q (and of k)
    head_dim,  # hd
    stride_qkv_batch,
    stride_qkv_row,
    stride_rope_row,
    row_offset,  # first row of this launch (row chunking)
    eps,
    ROPE_WIDTH: tl.constexpr,  # W: channels [0, W) of each head rotate; 0 = no RoPE
    ROUND_BF16: tl.constexpr,  # bf16 semantics: round where eager bf16 rounds
    NATIVE_CAST: tl.constexpr,  # compiled kernel: round with the hardware cast (the interpreter's truncates)
    HEADS_BLOCK: tl.constexpr,  # heads per program (power of two)
    HEAD_BLOCK: tl.constexpr,  # channels per head rounded up to a power of two
):
    # This program owns HEADS_BLOCK heads of one row of q (axis 1 even) or k (odd): row = row_offset + program id 0.
    row, batch, position = program_row(row_offset, seq_len)
    which = tl.program_id(1) % 2  # 0 = q, 1 = k
    first_head = (tl.program_id(1) // 2) * HEADS_BLOCK
    inner = heads * head_dim

    head = first_head + tl.arange(0, HEADS_BLOCK)  # [HB]
    channel = tl.arange(0, HEAD_BLOCK)  # [HD]
    valid = (head[:, None] < heads) & (channel[None, :] < head_dim)  # [HB, HD]
    in_ptr = qkv_ptr + batch * stride_qkv_batch + position * stride_qkv_row + which * inner + head[:, None] * head_dim
    x = tl.load(in_ptr + channel[None, :], mask=valid, other=0.0).to(tl.float32)

    # RMSNorm over each head's channels (fp32), weight in fp32, one rounding.
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / head_dim + eps)  # [HB]
    if which == 0:
        weight = tl.load(q_weight_ptr + channel, mask=channel < head_dim, other=0.0).to(tl.float32)
    else:
        weight = tl.load(k_weight_ptr + channel, mask=channel < head_dim, other=0.0).to(tl.float32)
    normed = x * rstd[:, None] * weight[None, :]
    if ROUND_BF16:
        normed = round_to_bf16(normed, NATIVE_CAST)

    out = normed
    if ROPE_WIDTH > 0:
        half = ROPE_WIDTH // 2
        rotary = channel < ROPE_WIDTH
        # rot(n)[c] = -n[c + half] (c < half), n[c - half] (half <= c < W): the partner channel is re-read (L1 hit)
        # and normalized the same way, so it is the same bf16 value the eager cat sees.
        partner = tl.where(channel < half, channel + half, channel - half)
        partner_mask = valid & rotary[None, :]
        partner_x = tl.load(in_ptr + partner[None, :], mask=partner_mask, other=0.0).to(tl.float32)
        if which == 0:
            partner_weight = tl.load(q_weight_ptr + partner, mask=rotary, other=0.0).to(tl.float32)
        else:
            partner_weight = tl.load(k_weight_ptr + partner, mask=rotary, other=0.0).to(tl.float32)
        partner_normed = partner_x * rstd[:, None] * partner_weight[None, :]
        if ROUND_BF16:
            partner_normed = round_to_bf16(partner_normed, NATIVE_CAST)
        rotated = tl.where(channel < half, -partner_normed, partner_normed)
        cos = tl.load(cos_ptr + position * stride_rope_row + channel, mask=rotary, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + position * stride_rope_row + channel, mask=rotary, other=0.0).to(tl.float32)
        if ROUND_BF16:
            cos = round_to_bf16(cos, NATIVE_CAST)
            sin = round_to_bf16(sin, NATIVE_CAST)
            first = round_to_bf16(normed * cos[None, :], NATIVE_CAST)
            second = round_to_bf16(rotated * sin[None, :], NATIVE_CAST)
            roped = round_to_bf16(first + second, NATIVE_CAST)
        else:
            roped = normed * cos[None, :] + rotated * sin[None, :]
        out = tl.where(rotary[None, :], roped, normed)

    out_row_ptr = out_ptr + (which * rows + row) * inner + head[:, None] * head_dim
    tl.store(out_row_ptr + channel[None, :], out, mask=valid)


def _check(qkv: torch.Tensor, head_dim: int, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
           rope: tuple[torch.Tensor, torch.Tensor] | None) -> int:
    """Validate the arguments; returns the head count."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 3:
        raise ValueError(f"qkv: expected a 3-D [B, S, 3 * heads * hd] tensor, got "
                         f"{tuple(qkv.shape) if isinstance(qkv, torch.Tensor) else type(qkv).__name__}")
    check_dtype("qkv", qkv)
    if not isinstance(head_dim, int) or head_dim < 1 or qkv.shape[-1] % (3 * head_dim):
        raise ValueError(f"head_dim: expected a positive int dividing qkv's last dim / 3 = {qkv.shape[-1] / 3}, "
                         f"got {head_dim!r}")
    if qkv.shape[-1] > 1 and qkv.stride(-1) != 1:
        raise ValueError(f"qkv: columns must be contiguous (stride 1), got strides {qkv.stride()}")
    for name, weight in (("q_weight", q_weight), ("k_weight", k_weight)):
        if not isinstance(weight, torch.Tensor) or weight.shape != (head_dim,):
            raise ValueError(f"{name}: expected shape ({head_dim},), got "
                             f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
        if weight.device != qkv.device or not weight.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor on {qkv.device}, got {weight.device} "
                             f"strides {weight.stride()}")
    check_eps(eps)
    if rope is not None:
        cos, sin = rope
        width = cos.shape[-1] if cos.dim() == 2 else -1
        if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != qkv.shape[1]:
            raise ValueError(f"rope: expected cos and sin of shape [S = {qkv.shape[1]}, W], got "
                             f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        if width % 2 or not 0 < width <= head_dim:
            raise ValueError(f"rope: width W must be even and in (0, head_dim = {head_dim}], got {width}")
        if cos.device != qkv.device or sin.device != qkv.device:
            raise ValueError(f"rope: expected tables on {qkv.device}, got {cos.device} and {sin.device}")
        if cos.stride(-1) != 1 or sin.stride() != cos.stride():
            raise ValueError(f"rope: tables need contiguous columns and equal strides, got {cos.stride()} and "
                             f"{sin.stride()}")
    return qkv.shape[-1] // (3 * head_dim)


def reference_qk_norm_rope(qkv: torch.Tensor, head_dim: int, q_weight: torch.Tensor, k_weight: torch.Tensor,
                           eps: float, rope: tuple[torch.Tensor, torch.Tensor] | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's eager path (also the CPU path): ``F.rms_norm`` per head, then rotate-half RoPE in qkv's dtype."""
    batch, rows, _ = qkv.shape
    q, k, _ = qkv.unflatten(-1, (3, -1, head_dim)).unbind(2)  # each [B, S, heads, hd]
    q = F.rms_norm(q, (head_dim,), q_weight, eps)
    k = F.rms_norm(k, (head_dim,), k_weight, eps)
    if rope is None:
        return q, k
    cos, sin = (table.to(qkv.dtype)[None, :, None, :] for table in rope)  # [1, S, 1, W]
    width = cos.shape[-1]
    half = width // 2

    def rotate(t: torch.Tensor) -> torch.Tensor:
        head, tail = t[..., :width], t[..., width:]
        turned = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
        return torch.cat((head * cos + turned * sin, tail), dim=-1)

    return rotate(q), rotate(k)


def _launch(qkv: torch.Tensor, head_dim: int, heads: int, q_weight: torch.Tensor, k_weight: torch.Tensor,
            eps: float, rope: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seq_len, _ = qkv.shape
    out = torch.empty((2, batch, seq_len, heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    rows = batch * seq_len
    if rows == 0:
        return out[0], out[1]
    head_block = triton.next_power_of_2(head_dim)
    heads_block = max(1, min(triton.next_power_of_2(heads), MAX_ELEMENTS_PER_PROGRAM // head_block))
    warps = max(1, min(8, heads_block * head_block // 256))
    cos, sin = rope if rope is not None else (qkv, qkv)  # unread without ROPE_WIDTH
    width = rope[0].shape[-1] if rope is not None else 0
    launch_rows(_qk_norm_rope_kernel, rows, qkv.device,
                out, qkv, q_weight, k_weight, cos, sin, seq_len, rows, heads, head_dim,
                qkv.stride(0), qkv.stride(1), cos.stride(0) if rope is not None else 0, eps=float(eps),
                grid_columns=2 * triton.cdiv(heads, heads_block),  # (q, k) x head groups
                ROPE_WIDTH=width, ROUND_BF16=qkv.dtype == torch.bfloat16, HEADS_BLOCK=heads_block,
                HEAD_BLOCK=head_block, num_warps=warps)
    return out[0], out[1]


def qk_norm_rope(qkv: torch.Tensor, head_dim: int, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 rope: tuple[torch.Tensor, torch.Tensor] | None = None, *, backend: Backend | str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q and k, then RoPE on channels [0, W) when ``rope = (cos, sin)`` is given.

    qkv: [B, S, 3 * heads * hd], columns [Q | K | V], row strides free; q_weight, k_weight: [hd]; cos, sin: [S, W]
    (fp32 in the model; rounded to qkv's dtype first). Returns (q, k), each [B, S, heads, hd] contiguous.
    ``backend``: None (env H3BATCH_KERNEL_BACKEND, else triton on CUDA / torch on CPU), "triton" or "torch".
    """
    heads = _check(qkv, head_dim, q_weight, k_weight, eps, rope)
    if resolve_backend(backend, qkv.device, _qk_norm_rope_kernel) is Backend.TORCH:
        return reference_qk_norm_rope(qkv, head_dim, q_weight, k_weight, eps, rope)
    return _launch(qkv, head_dim, heads, q_weight, k_weight, eps, rope)
