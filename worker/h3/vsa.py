"""Video Sparse Attention for H3 (VSA-H3, spec h3-model.md §10): the dense-mask reference attention.

The tiling plan (`VsaPlan`, 64-row tiles, the top-k `block_map`) lives in `worker/h3/vsa_plan.py`. Fine branch: each
query row attends to the rows of the tiles its query tile keeps. A gated coarse branch adds, per tile, the softmax over
all tile scores applied to the tile-mean values.

`vsa_attention_reference` here is the readable reference: it builds the full token mask and runs masked softmax
attention in fp32, on any device. The fast CUDA path (`worker/h3/vsa_cuda.py`, block-sparse FlexAttention over the
padded tile buffer, see `to_tiles`) is tested against it; the DiT's `AttentionCore` picks between them by device.
"""
from __future__ import annotations

import math

import torch

from h3batch.worker.h3.vsa_plan import TILE_TOKENS, VsaPlan, block_map

# Tensors are [B, S, heads, head_dim] in packed row order unless noted.


def _check_rows(name: str, x: torch.Tensor, plan: VsaPlan) -> None:
    if x.ndim != 4 or x.shape[1] != plan.sequence_length:
        raise ValueError(
            f"{name}: expected [B, S={plan.sequence_length}, heads, head_dim] for the VSA plan "
            f"(prefix {plan.prefix_segments}, video grid {plan.video_grid}), got {tuple(x.shape)}"
        )


def to_tiles(x: torch.Tensor, plan: VsaPlan) -> torch.Tensor:
    """Packed rows [B, S, H, D] → padded tile buffer [B, 64·n, H, D]; pad slots are zero."""
    _check_rows("rows", x, plan)
    out = x.new_zeros((x.shape[0], TILE_TOKENS * plan.num_tiles, *x.shape[2:]))
    out[:, plan.untile.to(x.device)] = x
    return out


def from_tiles(tiled: torch.Tensor, plan: VsaPlan) -> torch.Tensor:
    """Padded tile buffer [B, 64·n, H, D] → packed rows [B, S, H, D]; inverse of `to_tiles` on real slots."""
    if tiled.ndim != 4 or tiled.shape[1] != TILE_TOKENS * plan.num_tiles:
        raise ValueError(f"tiled: expected [B, {TILE_TOKENS * plan.num_tiles}, heads, head_dim], "
                         f"got {tuple(tiled.shape)}")
    return tiled[:, plan.untile.to(tiled.device)]


def tile_means(x: torch.Tensor, plan: VsaPlan) -> torch.Tensor:
    """Per-tile mean over the tile's true rows, fp32: [B, S, H, D] → [B, H, n, D]."""
    _check_rows("rows", x, plan)
    b, _, heads, dim = x.shape
    sums = torch.zeros((b, plan.num_tiles, heads, dim), dtype=torch.float32, device=x.device)
    sums.index_add_(1, plan.row_tile.to(x.device), x.to(torch.float32))
    sizes = plan.variable_block_sizes.to(device=x.device, dtype=torch.float32)
    return (sums / sizes[:, None, None]).transpose(1, 2)


def tile_scores(q: torch.Tensor, k: torch.Tensor, plan: VsaPlan) -> torch.Tensor:
    """S_ij = q̄_i·k̄_j/√head_dim in fp32: [B, H, n, n]."""
    return tile_means(q, plan) @ tile_means(k, plan).transpose(-1, -2) / math.sqrt(q.shape[-1])


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q·kᵀ/√d [masked])·v in fp32; [B, S, H, D] in, fp32 [B, H, S, D] out; mask bool [B, H, S, S]."""
    qf, kf, vf = (t.to(torch.float32).transpose(1, 2) for t in (q, k, v))  # [B, H, S, D]
    logits = qf @ kf.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, S, S]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1) @ vf


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Plain non-causal attention over all rows, computed in fp32: [B, S, H, D] → [B, S, H, D] in q's dtype."""
    if not (q.shape == k.shape == v.shape) or q.ndim != 4:
        raise ValueError(f"q, k, v: expected equal [B, S, heads, head_dim] shapes, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    return _masked_attention(q, k, v, None).transpose(1, 2).to(q.dtype)


def vsa_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
                            plan: VsaPlan) -> torch.Tensor:
    """Dense-mask reference of VSA-H3 on any device (the CPU path and the oracle of the CUDA kernel)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("gate", gate)):
        _check_rows(name, x, plan)
        if x.shape != q.shape:
            raise ValueError(f"{name}: expected the shape of q {tuple(q.shape)}, got {tuple(x.shape)}")
    row_tile = plan.row_tile.to(q.device)

    scores = tile_scores(q, k, plan)  # fp32 [B, H, n, n]
    keep = block_map(scores, plan)  # bool [B, H, n, n]
    token_mask = None if plan.is_dense else keep[:, :, row_tile][:, :, :, row_tile]  # [B, H, S, S]
    fine = _masked_attention(q, k, v, token_mask).transpose(1, 2).to(q.dtype)  # [B, S, H, D]

    # Coarse branch: every tile attends to every tile mean, unmasked, fp32, then cast to the input dtype.
    coarse = torch.softmax(scores, dim=-1) @ tile_means(v, plan)  # [B, H, n, D]
    coarse_rows = coarse.to(q.dtype)[:, :, row_tile].transpose(1, 2)  # [B, S, H, D]
    return fine + gate * coarse_rows
