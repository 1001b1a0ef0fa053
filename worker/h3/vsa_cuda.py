"""Fast VSA-H3 (spec h3-model.md §10) for CUDA: PyTorch FlexAttention over the padded tile buffer, coarse branch aside.

Same signature and math as the dense-mask reference `h3batch.worker.h3.vsa.vsa_attention_reference` (neither
module imports the other; both take their `VsaPlan` from `vsa_plan.py`). The reference builds an [S, S] token mask,
this path never materialises anything larger than the [B, H, n, n] tile lists. Steps per call:

1. Tile: gather q, k, v (packed rows, [B, S, H, D]) into the padded buffer [B, 64·n, H, D] of the plan (tile i owns
   slots [64i, 64i+64), valid rows first, pad slots zero) and sum each tile in fp32 in the same pass (tile means with
   true sizes). On CUDA one Triton kernel per tensor (`_tile_and_mean_kernel`); on CPU plain torch.
2. Scores q̄·k̄ᵀ/√D (fp32) and the same `torch.topk` over the video key tiles as the reference's `block_map`, turned
   straight into FlexAttention's KV block lists (`kv_lists_from_scores`): per query tile, every prefix key tile plus its
   top-k video tiles; prefix query tiles list every tile. No dense [B, H, n, n] map is sorted on the CUDA path.
3. Fine branch: FlexAttention with a `BlockMask` from those lists (64×64 sparse blocks = one VSA tile each way).
   Kept tiles of exactly 64 rows go in the *full* lists (no mask evaluated); kept partial tiles (segment ends, edge
   cubes) in the *partial* lists, where the mask drops pad slots. The kernel is compiled once per geometry (static
   shapes; the lists are tensor inputs, so a new top-k never recompiles).
4. Coarse branch in torch (fp32 softmax over all n tile scores, v̄ mix, cast to the input dtype), then
   O = O_fine + G ⊙ O_coarse[tile(row)] gathered back to packed row order: on CUDA one Triton kernel
   (`_combine_kernel`, the reference's two bf16 roundings), on CPU plain torch.

The two Triton kernels exist because their eager torch equivalents (index_copy + a strided sum; index_select + two
gathers + mul + add) moved each tensor 2–3 times: on an H200 at the 4.4 s geometry (S = 32,740, 56 heads) tiling went
2.3 → 0.8 ms and the combine 1.7 → 0.6 ms; building the lists from top-k instead of argsorting the n×n map went
2.9 → 0.7 ms. What remains is the FlexAttention kernel itself (~17.5 of ~20.3 ms; docs/performance.md).

Why FlexAttention and not a kernel of our own: its Triton template already is a block-sparse FlashAttention-2 style
kernel fed by exactly the per-query-block KV index lists VSA needs (the same structure as fastvideo-kernel's Triton
fallback), it handles the pad mask in partial blocks only, and it is maintained with PyTorch. Its sparse block must
equal the VSA tile (64) so that a query tile's list is its own, which pins the kernel's BLOCK_M/BLOCK_N to 64
(`DEFAULT_KERNEL_OPTIONS`); the H100 default of BLOCK_M = 128 would be refused by the template.

Mask semantics: in eager mode (CPU, tests) FlexAttention ignores the block lists and evaluates the mask function on
every (query, key) pair, so that mask encodes the whole rule (tile map lookup and pad slots). Compiled (CUDA) kernels
evaluate it only inside partial blocks, where the tile map is true by construction, so the CUDA mask only checks pad
slots; it is built once per geometry and reused, which keeps torch.compile from seeing a new function every call.

If a plan is dense (k = Nv, sparsity 0) the fine branch is plain `scaled_dot_product_attention` on the packed rows.
"""
from __future__ import annotations

import functools
import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from h3batch.worker.h3.vsa_plan import TILE_TOKENS, VsaPlan, block_map

DEFAULT_KERNEL_OPTIONS: Mapping[str, Any] = {
    "BLOCK_M": TILE_TOKENS,  # must divide the 64-row sparse block (one VSA tile)
    "BLOCK_N": TILE_TOKENS,
    "num_warps": 4,
    "num_stages": 3,
    "USE_TMA": True,  # H200: 17.5 ms vs 18.2 without, at the 4.4 s geometry (the template drops it where unusable)
    "ROWS_GUARANTEED_SAFE": True,  # every query sees ≥ 1 real key (tile 0 is always kept and never empty)
}
"""Triton meta-parameters of the compiled FlexAttention kernel (H200-measured; see docs/performance.md)."""

COMPILE_RECOMPILE_LIMIT = 64
"""Distinct geometries (plus batch sizes) the compiled kernel may specialise for before dynamo gives up."""


@dataclass(frozen=True, eq=False)
class TiledGeometry:
    """Device-side index tensors of one `VsaPlan` (cached per plan and device)."""

    untile: torch.Tensor  # long [S]: padded slot of each packed row
    slot_source: torch.Tensor  # int32 [64·n]: packed row held by each slot, −1 for pads
    row_tile: torch.Tensor  # long [S]: tile of each packed row
    pad_slots: torch.Tensor  # long [64·n − S]: slots holding no row
    valid_slot: torch.Tensor  # bool [64·n]: slot holds a row
    tile_sizes: torch.Tensor  # fp32 [n]: true rows per tile
    full_tile: torch.Tensor  # bool [n]: tile holds exactly 64 rows
    num_tiles: int
    num_slots: int
    # Static parts of the KV block lists, per kind (index 0 partial tiles, 1 full tiles):
    prefix_ids: tuple[torch.Tensor, torch.Tensor]  # int32: prefix tiles of that kind (every video query keeps them)
    every_ids: tuple[torch.Tensor, torch.Tensor]  # int32 [n]: all tiles of that kind, zero-padded (prefix queries)
    every_count: tuple[int, int]


@functools.lru_cache(maxsize=32)
def tiled_geometry(plan: VsaPlan, device: torch.device) -> TiledGeometry:
    """Index tensors of `plan` on `device` (plans hash by identity and are themselves cached per geometry)."""
    n = plan.num_tiles
    slots = TILE_TOKENS * n
    valid = torch.zeros(slots, dtype=torch.bool)
    valid[plan.untile] = True
    sizes = plan.variable_block_sizes
    source = torch.full((slots,), -1, dtype=torch.int32)
    source[plan.untile] = torch.arange(plan.sequence_length, dtype=torch.int32)
    full = sizes == TILE_TOKENS
    tile_ids = torch.arange(n, dtype=torch.int32)
    prefix_ids, every_ids, every_count = [], [], []
    for kind in (~full, full):
        prefix_ids.append(tile_ids[: plan.num_prefix_tiles][kind[: plan.num_prefix_tiles]].to(device))
        every = tile_ids[kind]
        every_ids.append(torch.cat([every, torch.zeros(n - every.numel(), dtype=torch.int32)]).to(device))
        every_count.append(every.numel())
    return TiledGeometry(
        prefix_ids=tuple(prefix_ids),
        every_ids=tuple(every_ids),
        every_count=tuple(every_count),
        untile=plan.untile.to(device),
        slot_source=source.to(device),
        row_tile=plan.row_tile.to(device),
        pad_slots=torch.nonzero(~valid).flatten().to(device),
        valid_slot=valid.to(device),
        tile_sizes=sizes.to(device=device, dtype=torch.float32),
        full_tile=full.to(device),
        num_tiles=n,
        num_slots=slots,
    )


def to_tiles(x: torch.Tensor, geo: TiledGeometry) -> torch.Tensor:
    """Packed rows [B, S, H, D] → padded tile buffer [B, 64·n, H, D] (pad slots zero). Torch version (CPU path)."""
    out = x.new_empty((x.shape[0], geo.num_slots, *x.shape[2:]))
    out[:, geo.pad_slots] = 0
    out.index_copy_(1, geo.untile, x)
    return out


def tile_means(tiled: torch.Tensor, geo: TiledGeometry) -> torch.Tensor:
    """Per-tile means of a padded buffer [B, 64·n, H, D] over true rows (pads are zero), fp32 → [B, H, n, D]."""
    b, _, heads, dim = tiled.shape
    sums = tiled.view(b, geo.num_tiles, TILE_TOKENS, heads, dim).sum(2, dtype=torch.float32)  # [B, n, H, D]
    return (sums / geo.tile_sizes[:, None, None]).transpose(1, 2)


@triton.jit
def _tile_and_mean_kernel(
    tiled_ptr,  # out: padded buffer [B, 64·n, H, D] (HEAD_MAJOR: [B, H, 64·n, D]), contiguous, x's dtype
    mean_ptr,  # out: fp32 tile means [B, H, n, D], contiguous
    x_ptr,  # in: packed rows; element (b, s, h, d) at b*stride_xb + s*stride_xs + h*stride_xh + d
    source_ptr,  # in: int32 [64·n], packed row held by each slot, −1 for a pad slot
    size_ptr,  # in: fp32 [n], true rows per tile
    num_tiles,  # n
    heads,  # H
    stride_xb,
    stride_xs,
    stride_xh,
    TILE: tl.constexpr,  # 64 slots per tile
    HEAD_DIM: tl.constexpr,  # D (power of two)
    HEAD_MAJOR: tl.constexpr,  # write tiled as [B, H, 64·n, D] (fastvideo-kernel's layout) instead of [B, 64·n, H, D]
):
    # This program owns one (tile, head, batch item): it copies the tile's 64 slots × D channels into the padded
    # buffer (zeros at pad slots) and writes their fp32 column sums divided by the tile's true size.
    tile = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    slots = (tile * TILE + tl.arange(0, TILE)).to(tl.int64)
    source = tl.load(source_ptr + slots)
    valid = source >= 0
    rows = tl.where(valid, source, 0).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    x = tl.load(x_ptr + batch * stride_xb + rows[:, None] * stride_xs + head * stride_xh + dims[None, :],
                mask=valid[:, None], other=0.0)
    plane = batch * heads + head
    if HEAD_MAJOR:
        tiled_rows = plane * num_tiles * TILE + slots  # row index in [B·H·64n, D]
    else:
        tiled_rows = (batch * num_tiles * TILE + slots) * heads + head  # row index in [B·64n·H, D]
    tl.store(tiled_ptr + tiled_rows[:, None] * HEAD_DIM + dims[None, :], x)
    mean = tl.sum(x.to(tl.float32), axis=0) / tl.load(size_ptr + tile)
    tl.store(mean_ptr + (plane * num_tiles + tile) * HEAD_DIM + dims, mean)


@triton.jit
def _round_to_bf16(value, NATIVE_CAST: tl.constexpr):
    """fp32 → fp32 holding the nearest bf16 value (ties to even); NaN stays NaN.

    Compiled kernels use the hardware conversion; under TRITON_INTERPRET=1 (CPU tests) Triton's fp32 → bf16 cast
    truncates, so there the rounding is done on the bit pattern: adding 0x7FFF plus the lowest kept bit carries into
    bit 16 exactly when the dropped half is above the midpoint, or at it with an odd kept part.
    """
    if NATIVE_CAST:
        return value.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
    bits = value.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(value != value, value, rounded.to(tl.float32, bitcast=True))


@triton.jit
def _combine_kernel(
    out_ptr,  # out: [B, S, H, D], contiguous, fine's dtype
    fine_ptr,  # in: fine branch over padded slots; (b, slot, h, d) at b*stride_fb + slot*stride_fs + h*stride_fh + d
    gate_ptr,  # in: gate rows; (b, s, h, d) at b*stride_gb + s*stride_gs + h*stride_gh + d
    coarse_ptr,  # in: coarse branch per tile [B, H, n, D], contiguous, fine's dtype
    untile_ptr,  # in: int64 [S], padded slot of each packed row
    row_tile_ptr,  # in: int64 [S], tile of each packed row
    seq_len,  # S
    num_tiles,  # n
    heads,  # H
    stride_fb,
    stride_fs,
    stride_fh,
    stride_gb,
    stride_gs,
    stride_gh,
    ROUND_BF16: tl.constexpr,  # round gate·coarse to bf16 before the add, as eager bf16 does
    NATIVE_CAST: tl.constexpr,  # compiled kernel (hardware rounding) vs CPU interpreter (bit-pattern rounding)
    BLOCK_R: tl.constexpr,  # packed rows per program
    HEAD_DIM: tl.constexpr,  # D (power of two)
):
    # This program owns packed rows [r0, r0 + BLOCK_R) of one (head, batch item):
    # out[b, r, h] = fine[b, untile[r], h] + gate[b, r, h] ⊙ coarse[b, h, tile(r)].
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    in_range = rows < seq_len
    rows64 = rows.to(tl.int64)
    slot = tl.load(untile_ptr + rows64, mask=in_range, other=0)
    tile = tl.load(row_tile_ptr + rows64, mask=in_range, other=0)
    dims = tl.arange(0, HEAD_DIM)
    mask = in_range[:, None]
    fine = tl.load(fine_ptr + batch * stride_fb + slot[:, None] * stride_fs + head * stride_fh + dims[None, :],
                   mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + batch * stride_gb + rows64[:, None] * stride_gs + head * stride_gh + dims[None, :],
                   mask=mask, other=0.0).to(tl.float32)
    coarse = tl.load(coarse_ptr + ((batch * heads + head) * num_tiles + tile[:, None]) * HEAD_DIM + dims[None, :],
                     mask=mask, other=0.0).to(tl.float32)
    mixed = gate * coarse
    if ROUND_BF16:  # explicit ties-to-even rounding (exact on GPU and in the CPU interpreter alike)
        mixed = _round_to_bf16(mixed, NATIVE_CAST)
    out = fine + mixed
    if ROUND_BF16:
        out = _round_to_bf16(out, NATIVE_CAST)
    out_rows = (batch * seq_len + rows64) * heads + head
    tl.store(out_ptr + out_rows[:, None] * HEAD_DIM + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def _check_head_dim(dim: int) -> None:
    if dim < 16 or dim & (dim - 1):
        raise ValueError(f"VSA CUDA kernels: expected head_dim a power of two ≥ 16, got {dim}")


def tile_rows(x: torch.Tensor, geo: TiledGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows [B, S, H, D] → (padded buffer [B, 64·n, H, D] with zero pads, fp32 tile means [B, H, n, D])."""
    if not x.is_cuda:
        tiled = to_tiles(x, geo)
        return tiled, tile_means(tiled, geo)
    return launch_tile_and_mean(x, geo)


def launch_tile_and_mean(x: torch.Tensor, geo: TiledGeometry,
                         head_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`tile_rows` through the Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1 in tests).

    head_major: the padded buffer as [B, H, 64·n, D] (the compiled VSA kernel's input, `vsa_tk.tile_rows_bhsd`)
    instead of FlexAttention's [B, 64·n, H, D]; the means are [B, H, n, D] either way.
    """
    b, _, heads, dim = x.shape
    _check_head_dim(dim)
    if x.stride(3) != 1:
        x = x.contiguous()
    tiled_shape = (b, heads, geo.num_slots, dim) if head_major else (b, geo.num_slots, heads, dim)
    tiled = x.new_empty(tiled_shape)
    means = torch.empty((b, heads, geo.num_tiles, dim), dtype=torch.float32, device=x.device)
    _tile_and_mean_kernel[(geo.num_tiles, heads, b)](
        tiled, means, x, geo.slot_source, geo.tile_sizes, geo.num_tiles, heads,
        x.stride(0), x.stride(1), x.stride(2), TILE=TILE_TOKENS, HEAD_DIM=dim, HEAD_MAJOR=head_major, num_warps=4,
    )
    return tiled, means


def combine(fine_tiled: torch.Tensor, gate: torch.Tensor, coarse: torch.Tensor, geo: TiledGeometry) -> torch.Tensor:
    """fine [B, 64·n, H, D] (padded), gate [B, S, H, D], coarse [B, H, n, D] → fine[untile] + gate ⊙ coarse[tile]."""
    if not fine_tiled.is_cuda:
        coarse_rows = coarse.transpose(1, 2).index_select(1, geo.row_tile)  # [B, S, H, D]
        return fine_tiled.index_select(1, geo.untile) + gate * coarse_rows
    return launch_combine(fine_tiled, gate, coarse, geo)


def launch_combine(fine_tiled: torch.Tensor, gate: torch.Tensor, coarse: torch.Tensor,
                   geo: TiledGeometry) -> torch.Tensor:
    """`combine` through the Triton kernel (CUDA, or CPU tensors under TRITON_INTERPRET=1 in tests)."""
    b, rows, heads, dim = gate.shape
    _check_head_dim(dim)
    if fine_tiled.stride(3) != 1:
        fine_tiled = fine_tiled.contiguous()
    if gate.stride(3) != 1:
        gate = gate.contiguous()
    coarse = coarse.contiguous()
    out = torch.empty((b, rows, heads, dim), dtype=fine_tiled.dtype, device=gate.device)
    block_r = 32
    _combine_kernel[(triton.cdiv(rows, block_r), heads, b)](
        out, fine_tiled, gate, coarse, geo.untile, geo.row_tile, rows, geo.num_tiles, heads,
        fine_tiled.stride(0), fine_tiled.stride(1), fine_tiled.stride(2),
        gate.stride(0), gate.stride(1), gate.stride(2),
        ROUND_BF16=fine_tiled.dtype == torch.bfloat16, NATIVE_CAST=fine_tiled.is_cuda, BLOCK_R=block_r, HEAD_DIM=dim,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out


def kv_block_lists(keep: torch.Tensor, geo: TiledGeometry) -> tuple[torch.Tensor, ...]:
    """Split a tile map bool [B, H, n, n] into FlexAttention's (partial, full) KV block lists.

    Returns (partial_num int32 [B,H,n], partial_idx int32 [B,H,n,n], full_num, full_idx): the kept key tiles of
    each query tile that are partial (need the pad mask) and full (64 real rows, no mask), each list in ascending
    tile order and padded with unused indices after its count. General (any map); the CUDA path uses
    `kv_lists_from_scores`, which gives the same lists without sorting an n×n map.
    """
    lists = []
    for part in (keep & ~geo.full_tile, keep & geo.full_tile):
        count = part.sum(-1, dtype=torch.int32)
        order = torch.argsort(part.to(torch.int16), dim=-1, descending=True, stable=True).to(torch.int32)
        lists += [count, order]
    return tuple(lists)


def kv_lists_from_scores(scores: torch.Tensor, plan: VsaPlan, geo: TiledGeometry) -> tuple[torch.Tensor, ...]:
    """(partial_num, partial_idx, full_num, full_idx) of the VSA tile map of `scores` fp32 [B, H, n, n] (§10.2.3).

    Video query tiles: the prefix key tiles plus the top-k video key tiles (`torch.topk` exactly as the reference's
    `block_map`); prefix query tiles: every tile. The top-k indices are split by kind with a stable partition
    (cumsum ranks + one scatter): no sort of an n×n map and no host synchronisation. Entries past a count are unused.
    """
    b, heads, n, _ = scores.shape
    p, k = plan.num_prefix_tiles, plan.top_k
    chosen = torch.topk(scores[..., p:], k, dim=-1).indices + p  # int64 [B, H, n, k]
    chosen_full = geo.full_tile[chosen]
    lists = []
    for kind in (0, 1):  # 0: partial tiles (pad mask), 1: full tiles
        mine = chosen_full if kind else ~chosen_full
        mine_i = mine.to(torch.int32)
        count = mine_i.sum(-1, keepdim=True, dtype=torch.int32)  # [B, H, n, 1]
        rank = torch.where(mine, mine_i.cumsum(-1) - 1, (1 - mine_i).cumsum(-1) - 1 + count)  # this kind first
        ordered = torch.empty_like(chosen, dtype=torch.int32).scatter_(-1, rank.long(), chosen.to(torch.int32))
        prefix = geo.prefix_ids[kind]
        m = prefix.numel()
        idx = torch.zeros((b, heads, n, n), dtype=torch.int32, device=scores.device)
        idx[..., :m] = prefix
        idx[..., m : m + k] = ordered
        idx[:, :, :p] = geo.every_ids[kind]  # prefix query tiles attend to every tile
        num = count.squeeze(-1) + m
        num[:, :, :p] = geo.every_count[kind]
        lists += [num.contiguous(), idx]
    return tuple(lists)


_FROM_KV_BLOCKS_HAS_Q_FLAG = "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters


def build_block_mask(lists: tuple[torch.Tensor, ...], geo: TiledGeometry, mask_mod) -> BlockMask:
    """BlockMask over the padded buffer (64×64 sparse blocks) from (partial_num, partial_idx, full_num, full_idx)."""
    partial_num, partial_idx, full_num, full_idx = lists
    extra = {"compute_q_blocks": False} if _FROM_KV_BLOCKS_HAS_Q_FLAG else {}  # forward only: no transposed lists
    return BlockMask.from_kv_blocks(
        partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=TILE_TOKENS, mask_mod=mask_mod,
        seq_lengths=(geo.num_slots, geo.num_slots), **extra,
    )


@functools.lru_cache(maxsize=32)
def _pad_mask_mod(geo: TiledGeometry):
    """Compiled-kernel mask (partial blocks only): drop pad key slots. One function object per geometry."""
    valid = geo.valid_slot

    def pad_mask(b, h, q_idx, kv_idx):
        return valid[kv_idx]

    return pad_mask


def _eager_mask_mod(keep: torch.Tensor, geo: TiledGeometry):
    """Eager mask (every pair): the tile map at (query tile, key tile) and a real key slot."""
    valid = geo.valid_slot

    def tile_mask(b, h, q_idx, kv_idx):
        return keep[b, h, q_idx // TILE_TOKENS, kv_idx // TILE_TOKENS] & valid[kv_idx]

    return tile_mask


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    """`torch.compile(flex_attention)`, made once; dynamo specialises it per geometry (static shapes)."""
    import torch._dynamo

    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), COMPILE_RECOMPILE_LIMIT))
    return torch.compile(flex_attention, dynamic=False, fullgraph=True)


def fine_attention(
    qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, lists: tuple[torch.Tensor, ...], geo: TiledGeometry, *,
    keep: torch.Tensor | None = None, kernel_options: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """Block-sparse attention over padded buffers [B, 64·n, H, D]; → [B, 64·n, H, D] (pad-slot rows unspecified).

    lists: KV block lists (`kv_lists_from_scores` / `kv_block_lists`). CUDA: the compiled kernel reads only the
    lists. CPU: eager FlexAttention evaluates the mask on every pair, so it needs the tile map `keep` [B, H, n, n].
    """
    scale = 1.0 / math.sqrt(qt.shape[-1])
    q, k, v = (t.transpose(1, 2) for t in (qt, kt, vt))  # [B, H, 64·n, D] views, no copy
    if qt.is_cuda:
        block_mask = build_block_mask(lists, geo, _pad_mask_mod(geo))
        options = dict(DEFAULT_KERNEL_OPTIONS if kernel_options is None else kernel_options)
        out = _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale, kernel_options=options)
    else:
        if keep is None:
            raise ValueError("fine_attention on CPU (eager FlexAttention) needs the tile map `keep` [B, H, n, n]")
        block_mask = build_block_mask(lists, geo, _eager_mask_mod(keep, geo))
        with warnings.catch_warnings():  # eager on CPU is intended here (tests at tiny sizes)
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            out = flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    return out.transpose(1, 2)


def _check_inputs(q, k, v, gate, plan: VsaPlan) -> None:
    if q.ndim != 4 or q.shape[1] != plan.sequence_length:
        raise ValueError(
            f"q: expected [B, S={plan.sequence_length}, heads, head_dim] for the VSA plan (prefix "
            f"{plan.prefix_segments}, video grid {plan.video_grid}), got {tuple(q.shape)}"
        )
    for name, x in (("k", k), ("v", v), ("gate", gate)):
        if x.shape != q.shape:
            raise ValueError(f"{name}: expected the shape of q {tuple(q.shape)}, got {tuple(x.shape)}")
        if x.device != q.device or x.dtype != q.dtype:
            raise ValueError(f"{name}: expected {q.dtype} on {q.device} like q, got {x.dtype} on {x.device}")


def vsa_attention_cuda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, plan: VsaPlan, *,
    kernel_options: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """VSA-H3 attention, fast path: O = O_fine + gate ⊙ O_coarse[tile(row)] (the contract of the reference).

    q, k (after QK-norm and RoPE), v, gate: [B, S, heads, head_dim] in packed row order; returns the same shape and
    dtype. Built for CUDA (compiled FlexAttention); on CPU it runs eager FlexAttention (tests only, O(S²) memory).
    """
    _check_inputs(q, k, v, gate, plan)
    geo = tiled_geometry(plan, q.device)
    (qt, q_mean), (kt, k_mean), (vt, v_mean) = (tile_rows(t, geo) for t in (q, k, v))  # [B,64n,H,D], fp32 [B,H,n,D]
    scores = q_mean @ k_mean.transpose(-1, -2) / math.sqrt(q.shape[-1])  # fp32 [B, H, n, n]
    coarse = (torch.softmax(scores, dim=-1) @ v_mean).to(q.dtype)  # [B, H, n, D]

    if plan.is_dense:
        fine = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=1.0 / math.sqrt(q.shape[-1])
        ).transpose(1, 2)  # [B, S, H, D]
        return fine + gate * coarse.transpose(1, 2).index_select(1, geo.row_tile)

    lists = kv_lists_from_scores(scores, plan, geo)
    keep = None if q.is_cuda else block_map(scores, plan)  # eager FlexAttention needs the full tile map
    fine_tiled = fine_attention(qt, kt, vt, lists, geo, keep=keep, kernel_options=kernel_options)
    return combine(fine_tiled, gate, coarse, geo)
