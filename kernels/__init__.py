"""Fused AdaLN modulation ops for the h3batch DiT (spec h3-model.md §5).

Temporary state: PyTorch reference implementations only; the Triton path lands behind the same functions.
"""
from __future__ import annotations

import torch


def _f(t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _rms(x32: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rms_norm_indexed_scale_shift(x, weight, shift, scale, indices, eps, *, precision=None, backend=None):
    """out[r] = RMSNorm_w(x[r]) * (1 + scale[indices[r]]) + shift[indices[r]] (fp32 math, one rounding)."""
    n = _rms(_f(x), weight, eps)
    return (n * (1.0 + _f(scale)[indices]) + _f(shift)[indices]).to(x.dtype)


def indexed_gate_rms_norm_scale_shift(residual, gate, branch, weight, shift, scale, indices, eps, *,
                                      precision=None, backend=None):
    """u = residual + gate[i] * branch; returns (bf16-rounded u, modulated RMSNorm of it)."""
    u = (_f(residual) + _f(gate)[indices] * _f(branch)).to(torch.bfloat16).to(residual.dtype)
    return u, rms_norm_indexed_scale_shift(u, weight, shift, scale, indices, eps)


def indexed_scale_shift_(x, shift, scale, indices, *, precision=None, backend=None):
    """x[r] <- x[r] * (1 + scale[indices[r]]) + shift[indices[r]], in place; returns x."""
    x.copy_((_f(x) * (1.0 + _f(scale)[indices]) + _f(shift)[indices]).to(x.dtype))
    return x


def indexed_gate(x, gate, other, indices, *, precision=None, backend=None):
    """Returns x + gate[indices[r]] * other (new tensor)."""
    return (_f(x) + _f(gate)[indices] * _f(other)).to(x.dtype)


__all__ = ["indexed_gate_rms_norm_scale_shift", "indexed_scale_shift_", "indexed_gate", "rms_norm_indexed_scale_shift"]
