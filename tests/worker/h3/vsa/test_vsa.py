"""h3batch.worker.h3.vsa_plan and .vsa: §10 VSA-H3 tiling plan (§13.19) and the dense-mask reference (§13.20)."""
from __future__ import annotations

import math

import pytest
import torch

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3.packing import build_packed_layout
from h3batch.worker.h3.vsa import (
    dense_attention,
    from_tiles,
    tile_means,
    tile_scores,
    to_tiles,
    vsa_attention_reference,
)
from h3batch.worker.h3.vsa_plan import (
    TILE_TOKENS,
    block_map,
    build_vsa_plan,
    top_k_video_tiles,
    vsa_plan_for_layout,
    vsa_plan_for_request,
)

# §7 table, VSA columns: (geometry, L) → P, Nv, k.
SPEC_TABLE = [
    (RequestGeometry(1344, 768, 4.4), 30, (7, 528, 106)),
    (RequestGeometry(1344, 768, 5), 30, (8, 660, 132)),
    (RequestGeometry.from_frames(1344, 768, 209), 30, (12, 1056, 212)),
    (RequestGeometry(768, 768, 5), 30, (8, 360, 72)),
    (RequestGeometry(768, 1344, 10.125), 30, (14, 1188, 238)),
    (RequestGeometry(1344, 768, 15), 30, (20, 1782, 357)),
    (RequestGeometry.from_frames(256, 128, 22, check_duration_window=False), 12, (3, 4, 1)),
]


def tiny_plan(sparsity: float = 0.8):
    geometry = RequestGeometry.from_frames(256, 128, 22, check_duration_window=False)
    return vsa_plan_for_layout(build_packed_layout(12, geometry), sparsity)


def random_qkvg(plan, batch=2, heads=2, dim=16, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, plan.sequence_length, heads, dim, generator=gen).to(dtype) for _ in range(4)]


@pytest.mark.parametrize("geometry, text_rows, expected", SPEC_TABLE)
def test_plan_counts_match_spec_table(geometry, text_rows, expected):
    """P, Nv and k of every §7 example match; sizes lie in (0, 64], sum to S, and untile is injective."""
    plan = vsa_plan_for_request(geometry, text_rows)
    assert (plan.num_prefix_tiles, plan.num_video_tiles, plan.top_k) == expected
    assert plan.num_tiles == expected[0] + expected[1]
    assert all(0 < size <= TILE_TOKENS for size in plan.tile_sizes)
    assert sum(plan.tile_sizes) == plan.sequence_length == geometry.sequence_rows(text_rows)
    assert torch.unique(plan.untile).numel() == plan.sequence_length


def test_four_point_four_second_example_tiles():
    """1344×768, 4.4 s, L 30: prefix [30] + [64×5, 36], video (32,24,42) in 8×6×11 tiles, last w-tile 32, n 535."""
    plan = vsa_plan_for_request(RequestGeometry(1344, 768, 4.4), 30)
    assert plan.tile_sizes[:7] == (30, 64, 64, 64, 64, 64, 36)
    assert plan.video_grid == (32, 24, 42)
    video_sizes = plan.tile_sizes[7:]
    assert len(video_sizes) == 8 * 6 * 11 == 528 and plan.num_tiles == 535
    assert video_sizes[10] == 32 and video_sizes[:10] == (64,) * 10  # w-tile 10 is 2 columns wide
    assert sorted(set(video_sizes)) == [32, 64]


def test_tiny_example_tiles():
    """256×128, 22 frames, L 12: P 3 ([12] + [64, 10]), video sizes [64, 64, 48, 48], k 1, S 310."""
    plan = tiny_plan()
    assert plan.tile_sizes == (12, 64, 10, 64, 64, 48, 48)
    assert (plan.num_prefix_tiles, plan.num_video_tiles, plan.top_k, plan.sequence_length) == (3, 4, 1, 310)
    assert plan.variable_block_sizes.tolist() == list(plan.tile_sizes)


@pytest.mark.parametrize("prefix, grid", [((5, 0, 70), (5, 6, 9)), ((64,), (4, 4, 4)), ((1,), (1, 1, 1)),
                                          ((130, 2), (9, 3, 5))])
def test_untile_matches_brute_force(prefix, grid):
    """Row → slot equals a loop-by-loop construction: segment runs of 64, cubes t → h → w, raster inside a cube."""
    plan = build_vsa_plan(prefix, grid, 0.8)
    expected_slots, sizes = [], []
    for length in [s for s in prefix if s]:
        for start in range(0, length, 64):
            tile = len(sizes)
            size = min(64, length - start)
            sizes.append(size)
            expected_slots += [64 * tile + i for i in range(size)]
    t, h, w = grid
    tiles = {}
    for tt in range(math.ceil(t / 4)):
        for th in range(math.ceil(h / 4)):
            for tw in range(math.ceil(w / 4)):
                members = [(f, y, x) for f in range(4 * tt, min(t, 4 * tt + 4))
                           for y in range(4 * th, min(h, 4 * th + 4)) for x in range(4 * tw, min(w, 4 * tw + 4))]
                tiles[(tt, th, tw)] = (len(sizes), members)
                sizes.append(len(members))
    for f in range(t):
        for y in range(h):
            for x in range(w):
                tile, members = tiles[(f // 4, y // 4, x // 4)]
                expected_slots.append(64 * tile + members.index((f, y, x)))
    assert plan.tile_sizes == tuple(sizes)
    assert plan.untile.tolist() == expected_slots
    assert (plan.row_tile == plan.untile // 64).all()


def test_top_k_formula():
    """k = max(1, min(⌈(1 − 0.8)·Nv⌉, Nv)) equals ⌈Nv/5⌉ for Nv < 5000, and sparsity 0 keeps every tile."""
    assert 1.0 - 0.8 == 0.19999999999999996
    for nv in range(1, 5000):
        assert top_k_video_tiles(nv, 0.8) == -(-nv // 5)
        assert top_k_video_tiles(nv, 0.0) == nv
    assert top_k_video_tiles(3, 0.99) == 1


def test_plan_is_cached_per_geometry():
    """Building the plan twice for one geometry returns the same cached object."""
    geometry = RequestGeometry(768, 768, 5)
    assert vsa_plan_for_request(geometry, 30) is vsa_plan_for_request(RequestGeometry(768, 768, 5.0), 30)
    assert vsa_plan_for_request(geometry, 30) is not vsa_plan_for_request(geometry, 31)


@pytest.mark.parametrize(
    "prefix, grid, match",
    [
        ((12, 74), (0, 4, 8), "video grid"),
        ((12, 74), (7, 4), "video grid"),
        ((12, 74), (7, 4.0, 8), "video grid"),
        ((12, -1), (7, 4, 8), "prefix segments"),
    ],
)
def test_untileable_geometry_raises(prefix, grid, match):
    """Geometries without a proper video grid (no video rows, wrong rank, bad counts) raise ValueError."""
    with pytest.raises(ValueError, match=match):
        build_vsa_plan(prefix, grid)


def test_bad_sparsity_raises():
    """Sparsity must lie in [0, 1)."""
    for sparsity in (1.0, -0.1, "0.8"):
        with pytest.raises(ValueError, match="sparsity"):
            build_vsa_plan((12, 74), (7, 4, 8), sparsity)


def test_rows_not_matching_plan_raise():
    """q/k/v/gate whose row count is not the plan's S (grid and rows disagree) raise ValueError naming S."""
    plan = tiny_plan()
    q, k, v, g = random_qkvg(plan)
    with pytest.raises(ValueError, match=r"S=310"):
        vsa_attention_reference(q[:, :-1], k[:, :-1], v[:, :-1], g[:, :-1], plan)
    with pytest.raises(ValueError, match="gate"):
        vsa_attention_reference(q, k, v, g[..., :8], plan)

    class WrongLayout:  # a layout claiming more rows than its segments and grid hold
        prefix_segments, video_grid, sequence_length = (12, 74), (7, 4, 8), 311

    with pytest.raises(ValueError, match="S=311"):
        vsa_plan_for_layout(WrongLayout())


def test_to_tiles_round_trip_and_zero_pads():
    """to_tiles puts each row in its slot with zero pad slots; from_tiles inverts it."""
    plan = tiny_plan()
    x = torch.randn(1, plan.sequence_length, 2, 4)
    tiled = to_tiles(x, plan)
    assert tiled.shape == (1, 64 * plan.num_tiles, 2, 4)
    assert torch.equal(from_tiles(tiled, plan), x)
    pad = torch.ones(64 * plan.num_tiles, dtype=torch.bool)
    pad[plan.untile] = False
    assert pad.sum().item() == 64 * plan.num_tiles - plan.sequence_length
    assert not tiled[:, pad].any()


def test_tile_means_use_true_sizes():
    """Tile means divide by the tile's true row count (a 10-row or 48-row tile is not averaged over 64)."""
    plan = tiny_plan()
    x = torch.ones(1, plan.sequence_length, 1, 3)
    means = tile_means(x, plan)
    assert means.shape == (1, 1, plan.num_tiles, 3)
    assert torch.equal(means, torch.ones_like(means))


def test_sparsity_zero_zero_gate_equals_dense():
    """With k = Nv (sparsity 0) and a zero gate VSA equals dense attention in fp32 to ≤ 1e-6."""
    plan = tiny_plan(sparsity=0.0)
    assert plan.is_dense and plan.top_k == plan.num_video_tiles
    q, k, v, _ = random_qkvg(plan, seed=1)
    out = vsa_attention_reference(q, k, v, torch.zeros_like(q), plan)
    assert (out - dense_attention(q, k, v)).abs().max().item() <= 1e-6


def coarse_by_hand(q, k, v, plan):
    """O_c[b, h, i] = Σ_j softmax_j(q̄_i·k̄_j/√d)·v̄_j, with tile means taken row by row in loops; [B, H, n, D]."""
    dim = q.shape[-1]
    members = [[] for _ in range(plan.num_tiles)]
    for row, tile in enumerate(plan.row_tile.tolist()):
        members[tile].append(row)

    def means(x):  # [B, S, H, D] → [B, H, n, D]
        return torch.stack([x[:, rows].mean(dim=1) for rows in members], dim=1).transpose(1, 2)

    qm, km, vm = means(q), means(k), means(v)
    weights = torch.softmax(qm @ km.transpose(-1, -2) / math.sqrt(dim), dim=-1)
    return weights @ vm


def test_zero_gate_removes_coarse_branch_exactly():
    """Zero gate gives exactly the fine branch; a random gate adds exactly gate ⊙ O_c[tile(row)] (hand-computed)."""
    plan = tiny_plan()
    q, k, v, gate = random_qkvg(plan, seed=2)
    fine_only = vsa_attention_reference(q, k, v, torch.zeros_like(gate), plan)
    gated = vsa_attention_reference(q, k, v, gate, plan)
    coarse = coarse_by_hand(q, k, v, plan)  # [B, H, n, D]
    coarse_rows = coarse[:, :, plan.row_tile].transpose(1, 2)  # [B, S, H, D]
    assert (gated - fine_only - gate * coarse_rows).abs().max().item() <= 1e-5
    assert (gated - fine_only).abs().max().item() > 1e-2  # the coarse branch is really there


def hand_built_case():
    """Prefix 5 rows, video grid (4, 8, 8) → tiles [5] + four 64-row cubes; k = 1 (sparsity 0.8).

    Keys of video tile j are e_j, prefix keys e_7; queries of video tile i are e_perm(i), so q̄_i·k̄_j peaks
    at j = perm(i) and the top-1 video tile of query tile i is perm(i).
    """
    plan = build_vsa_plan((5,), (4, 8, 8), 0.8)
    perm = [2, 0, 3, 1]
    dim, seq = 8, plan.sequence_length
    q, k = torch.zeros(1, seq, 1, dim), torch.zeros(1, seq, 1, dim)
    for row, tile in enumerate(plan.row_tile.tolist()):
        if tile == 0:
            k[0, row, 0, 7] = 1.0
            q[0, row, 0, 6] = 1.0
        else:
            k[0, row, 0, tile - 1] = 1.0
            q[0, row, 0, perm[tile - 1]] = 1.0
    v = torch.randn(1, seq, 1, dim, generator=torch.Generator().manual_seed(5))
    return plan, perm, q, k, v


def test_block_map_keeps_exactly_the_expected_tiles():
    """Each video query tile keeps the prefix tile and its top-1 video tile; the prefix query tile keeps all."""
    plan, perm, q, k, _ = hand_built_case()
    assert (plan.num_prefix_tiles, plan.num_video_tiles, plan.top_k) == (1, 4, 1)
    keep = block_map(tile_scores(q, k, plan), plan)[0, 0]
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[0, :] = True
    expected[:, 0] = True
    for i, j in enumerate(perm):
        expected[1 + i, 1 + j] = True
    assert torch.equal(keep, expected)


def test_fine_branch_attends_only_to_kept_tiles():
    """With a zero gate every video row's output is softmax attention over exactly the prefix rows and its kept tile."""
    plan, perm, q, k, v = hand_built_case()
    out = vsa_attention_reference(q, k, v, torch.zeros_like(q), plan)
    rows_of = [torch.nonzero(plan.row_tile == t).flatten() for t in range(plan.num_tiles)]
    for row in [0, 4, 5, 70, 140, 200, 260]:
        tile = plan.row_tile[row].item()
        if tile == 0:
            allowed = torch.arange(plan.sequence_length)
        else:
            allowed = torch.cat([rows_of[0], rows_of[1 + perm[tile - 1]]])
        logits = (k[0, allowed, 0] @ q[0, row, 0]) / math.sqrt(8)
        expected = torch.softmax(logits, dim=0) @ v[0, allowed, 0]
        assert (out[0, row, 0] - expected).abs().max().item() <= 1e-6, row
    # and the sparse result really differs from dense attention
    assert (out - dense_attention(q, k, v)).abs().max().item() > 1e-3


def test_bf16_inputs_keep_dtype_and_track_fp32():
    """bf16 inputs give a bf16 output in packed row order within 2e-2 of the fp32 reference."""
    plan = tiny_plan()
    q, k, v, gate = random_qkvg(plan, seed=4)
    ref = vsa_attention_reference(q, k, v, gate, plan)
    out = vsa_attention_reference(q.bfloat16(), k.bfloat16(), v.bfloat16(), gate.bfloat16(), plan)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert (out.float() - ref).abs().max().item() <= 2e-2


def test_batch_items_are_independent():
    """A B = 2 call equals two B = 1 calls (each item its own document, shared plan)."""
    plan = tiny_plan()
    q, k, v, gate = random_qkvg(plan, seed=6)
    both = vsa_attention_reference(q, k, v, gate, plan)
    for b in range(2):
        one = vsa_attention_reference(q[b : b + 1], k[b : b + 1], v[b : b + 1], gate[b : b + 1], plan)
        assert (both[b : b + 1] - one).abs().max().item() <= 1e-6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_inputs_match_cpu_reference():
    """With CUDA tensors and the CPU-built plan, the reference runs on the device and matches the CPU result (fp32)."""
    plan = tiny_plan()
    q, k, v, gate = random_qkvg(plan, seed=7)
    cpu = vsa_attention_reference(q, k, v, gate, plan)
    gpu = vsa_attention_reference(q.cuda(), k.cuda(), v.cuda(), gate.cuda(), plan)
    assert gpu.device.type == "cuda"
    assert (gpu.cpu() - cpu).abs().max().item() <= 1e-4
    assert torch.equal(from_tiles(to_tiles(q.cuda(), plan), plan).cpu(), q)
