"""VSA-H3 tiling plan (spec h3-model.md §10.1): which tile every packed row falls in, and which tiles a query keeps.

The packed sequence is cut into tiles of at most 64 rows: the prefix segments (text L, audio 2A) into runs of 64 that
never straddle a segment, the video token grid (T, Hl/2, Wl/2) into (4,4,4) cubes enumerated t → h → w with partial
edge cubes. Each video query tile attends to every prefix tile plus the top-k video tiles by mean-q·mean-k score
(k = ⌈0.2·Nv⌉ for V2); prefix query tiles attend densely (`block_map`).

Plain data and index math on CPU tensors, shared by the dense-mask reference (`worker/h3/vsa.py`) and the
FlexAttention path (`worker/h3/vsa_cuda.py`); it imports neither.

Tiling is written by hand because the public implementations (FastVideo's H3 backend, fastvideo-kernel) bind it to
CUDA kernels, a fixed 256-token tile and their own sequence-parallel plumbing; what carries over is the math.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

TILE_TOKENS = 64
VIDEO_TILE_SHAPE = (4, 4, 4)  # (t, h, w) tokens per full video tile; 4·4·4 = 64
V2_SPARSITY = 0.8


def top_k_video_tiles(num_video_tiles: int, sparsity: float) -> int:
    """k = max(1, min(⌈(1 − sparsity)·Nv⌉, Nv)), in float64 (1 − 0.8 = 0.19999999999999996)."""
    return max(1, min(math.ceil((1.0 - sparsity) * num_video_tiles), num_video_tiles))


@dataclass(frozen=True, eq=False)
class VsaPlan:
    """Tiling of one request geometry (rows in packed order: prefix segments, then video raster t → h → w).

    Tile i owns padded slots [64·i, 64·i + 64); its valid rows come first. CPU tensors; built once per geometry.
    """

    prefix_segments: tuple[int, ...]  # non-empty prefix segments in row order, e.g. (L, 2A)
    video_grid: tuple[int, int, int]  # (T, Hl/2, Wl/2)
    sparsity: float
    tile_sizes: tuple[int, ...]  # variable_block_sizes: prefix tiles, then video tiles
    num_prefix_tiles: int  # P
    num_video_tiles: int  # Nv
    top_k: int  # video key tiles kept per video query tile
    row_tile: torch.Tensor  # long [S]: tile of every packed row
    untile: torch.Tensor  # long [S]: padded slot of every packed row

    @property
    def num_tiles(self) -> int:
        """n = P + Nv."""
        return len(self.tile_sizes)

    @property
    def sequence_length(self) -> int:
        return self.row_tile.numel()

    @property
    def prefix_rows(self) -> int:
        return sum(self.prefix_segments)

    @property
    def is_dense(self) -> bool:
        """k = Nv: every tile sees every tile, so the fine branch is plain dense attention."""
        return self.top_k == self.num_video_tiles

    @property
    def variable_block_sizes(self) -> torch.Tensor:
        """long [n]: true row count of every tile (the kernels' `variable_block_sizes`)."""
        return torch.tensor(self.tile_sizes, dtype=torch.long)


def _axis_tiles(length: int, tile: int) -> list[int]:
    """Sizes of the tiles cutting one axis: full tiles, then a partial one of `length − tile·(count − 1)`."""
    count = -(-length // tile)
    return [min(tile, length - tile * i) for i in range(count)]


def _is_count(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def build_vsa_plan(
    prefix_segments: tuple[int, ...], video_grid: tuple[int, int, int], sparsity: float = V2_SPARSITY
) -> VsaPlan:
    """Tile a packed sequence (cached per geometry). Raises ValueError for a geometry VSA cannot tile.

    prefix_segments: row counts of the non-video segments in order, (L, 2A) for T2VA; zero-length ones are dropped.
    video_grid: (T, Hl/2, Wl/2), every dimension ≥ 1 (VSA has no meaning without video rows; never falls back).
    """
    # Validate before the cache: lru_cache would treat 4.0 like 4 and hand back a plan built for ints.
    prefix_segments, video_grid = tuple(prefix_segments), tuple(video_grid)
    if not all(_is_count(s, 0) for s in prefix_segments):
        raise ValueError(f"VSA prefix segments: expected non-negative integer row counts, got {prefix_segments}")
    if len(video_grid) != 3 or not all(_is_count(d, 1) for d in video_grid):
        raise ValueError(
            f"VSA video grid: expected (T, Hl/2, Wl/2) with every dimension ≥ 1 (a request with video rows), "
            f"got {video_grid}"
        )
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity < 1.0:
        raise ValueError(f"VSA sparsity: expected a number in [0, 1), got {sparsity!r}")
    return _build_vsa_plan(tuple(s for s in prefix_segments if s > 0), video_grid, float(sparsity))


@functools.lru_cache(maxsize=64)
def _build_vsa_plan(segments: tuple[int, ...], video_grid: tuple[int, int, int], sparsity: float) -> VsaPlan:
    # 1. Prefix: each segment in runs of 64; a tile never straddles two segments.
    prefix_tiles: list[int] = []
    prefix_tile_of_row, prefix_pos_in_tile = [], []
    for length in segments:
        rows = torch.arange(length)
        prefix_tile_of_row.append(len(prefix_tiles) + rows // TILE_TOKENS)
        prefix_pos_in_tile.append(rows % TILE_TOKENS)
        prefix_tiles += _axis_tiles(length, TILE_TOKENS)
    num_prefix = len(prefix_tiles)

    # 2. Video: (4,4,4) cubes, tiles enumerated t → h → w, tokens raster inside each (partial) cube.
    t, h, w = video_grid
    ct, ch, cw = VIDEO_TILE_SHAPE
    sizes_t, sizes_h, sizes_w = _axis_tiles(t, ct), _axis_tiles(h, ch), _axis_tiles(w, cw)
    video_tiles = [st * sh * sw for st in sizes_t for sh in sizes_h for sw in sizes_w]
    f, y, x = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")  # raster rows
    f, y, x = f.reshape(-1), y.reshape(-1), x.reshape(-1)
    tile_h = torch.tensor(sizes_h)[y // ch]  # true extent of each row's tile along h and w
    tile_w = torch.tensor(sizes_w)[x // cw]
    video_tile_of_row = num_prefix + ((f // ct) * len(sizes_h) + y // ch) * len(sizes_w) + x // cw
    video_pos_in_tile = ((f % ct) * tile_h + y % ch) * tile_w + x % cw

    row_tile = torch.cat(prefix_tile_of_row + [video_tile_of_row])
    pos_in_tile = torch.cat(prefix_pos_in_tile + [video_pos_in_tile])
    tile_sizes = tuple(prefix_tiles + video_tiles)
    plan = VsaPlan(
        prefix_segments=segments,
        video_grid=video_grid,
        sparsity=sparsity,
        tile_sizes=tile_sizes,
        num_prefix_tiles=num_prefix,
        num_video_tiles=len(video_tiles),
        top_k=top_k_video_tiles(len(video_tiles), sparsity),
        row_tile=row_tile,
        untile=row_tile * TILE_TOKENS + pos_in_tile,
    )
    _check_plan(plan, pos_in_tile)
    return plan


def _check_plan(plan: VsaPlan, pos_in_tile: torch.Tensor) -> None:
    """§10.1.3 invariants: sizes in (0, 64], sum = S, untile injective and never a pad slot."""
    seq = plan.prefix_rows + math.prod(plan.video_grid)
    if not all(0 < s <= TILE_TOKENS for s in plan.tile_sizes):
        raise ValueError(f"VSA tile sizes: expected every size in (0, {TILE_TOKENS}], got {plan.tile_sizes}")
    if sum(plan.tile_sizes) != seq or plan.sequence_length != seq:
        raise ValueError(f"VSA tiles: expected sizes summing to S={seq}, got {sum(plan.tile_sizes)}")
    if torch.unique(plan.untile).numel() != seq:
        raise ValueError("VSA untile map: expected one distinct slot per row, found collisions")
    if bool((pos_in_tile >= plan.variable_block_sizes[plan.row_tile]).any()):
        raise ValueError("VSA untile map: a row landed on a pad slot")


def vsa_plan_for_layout(layout, sparsity: float = V2_SPARSITY) -> VsaPlan:
    """The plan of a `packing.PackedLayout` (prefix (L, 2A), its video grid), checked against its S."""
    plan = build_vsa_plan(tuple(layout.prefix_segments), tuple(layout.video_grid), sparsity)
    if plan.sequence_length != layout.sequence_length:
        raise ValueError(
            f"VSA plan: layout has S={layout.sequence_length} rows but its segments and video grid tile "
            f"{plan.sequence_length}"
        )
    return plan


def vsa_plan_for_request(geometry, text_rows: int, sparsity: float = V2_SPARSITY) -> VsaPlan:
    """The plan of a T2VA request: prefix segments (L, 2A) and video grid (T, Hl/2, Wl/2) of `RequestGeometry`."""
    return build_vsa_plan((text_rows, geometry.audio_rows), tuple(geometry.patch_grid), sparsity)


def block_map(scores: torch.Tensor, plan: VsaPlan) -> torch.Tensor:
    """Which key tiles each query tile attends to, bool [B, H, n, n], from tile scores [B, H, n, n] (§10.2.3).

    Every query tile keeps all prefix key tiles and its top-k video key tiles; prefix query tiles keep all.
    """
    if plan.is_dense:
        return torch.ones_like(scores, dtype=torch.bool)
    p = plan.num_prefix_tiles
    keep = torch.zeros_like(scores, dtype=torch.bool)
    keep[..., :p] = True
    chosen = torch.topk(scores[..., p:], plan.top_k, dim=-1).indices  # [B, H, n, k]
    keep[..., p:].scatter_(-1, chosen, True)
    keep[:, :, :p, :] = True
    return keep
