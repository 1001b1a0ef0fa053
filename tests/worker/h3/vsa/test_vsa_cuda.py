"""Fast VSA-H3 (worker/h3/vsa_cuda.py) vs the dense-mask reference (worker/h3/vsa.py), spec h3-model.md §10, §13.20.

CPU: the full path runs with eager FlexAttention (which evaluates the mask function on every pair), and the pieces the
compiled CUDA kernel relies on instead (partial/full KV block lists, pad-only mask) are checked by rebuilding the
token mask the kernel applies. CUDA: the compiled kernel itself, bf16, against the reference in fp32.
Tolerances: fp32 ≤ 1e-5 max abs; bf16 ≤ 2e-2 max abs (§13.20).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from h3batch.worker.h3 import vsa
from h3batch.worker.h3.model import AttentionCore
from h3batch.worker.h3.vsa import dense_attention
from h3batch.worker.h3.vsa import vsa_attention_reference as vsa_attention  # the oracle
from h3batch.worker.h3.vsa_cuda import (
    build_block_mask,
    combine,
    fine_attention,
    kv_block_lists,
    kv_lists_from_scores,
    launch_tile_and_mean,
    tile_means,
    tiled_geometry,
    to_tiles,
    vsa_attention_cuda,
)
from h3batch.worker.h3.vsa_plan import TILE_TOKENS, block_map, build_vsa_plan

FP32_ATOL = 1e-5
BF16_ATOL = 2e-2
# Tiny T2VA-like geometry: text 12 rows, audio 74 rows (tiles 64 + 10), video 8×8×10 → 2·2·3 = 12 cubes whose last
# w-tile is 2 wide (partial, 32 rows): partial prefix and video tiles, k = ⌈0.2·12⌉ = 3 of 12.
PREFIX = (12, 74)
GRID = (8, 8, 10)


def _inputs(plan, batch=2, heads=2, dim=32, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, plan.sequence_length, heads, dim)
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(4)]


def test_plan_has_partial_tiles_and_real_sparsity():
    """The test geometry exercises partial prefix and video tiles and keeps fewer tiles than it has."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    assert plan.num_prefix_tiles == 3 and plan.num_video_tiles == 12 and plan.top_k == 3
    assert 12 in plan.tile_sizes and 10 in plan.tile_sizes and 32 in plan.tile_sizes


def test_tiling_round_trip_and_tile_means_match_reference():
    """Rows scattered into the padded buffer come back unchanged, pads are zero, and tile means equal the reference."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    geo = tiled_geometry(plan, torch.device("cpu"))
    x = _inputs(plan)[0]
    tiled = to_tiles(x, geo)
    assert tiled.shape == (2, TILE_TOKENS * plan.num_tiles, 2, 32)
    assert torch.equal(tiled[:, geo.untile], x)
    assert torch.equal(tiled[:, ~geo.valid_slot], torch.zeros_like(tiled[:, ~geo.valid_slot]))
    assert torch.equal(vsa.from_tiles(tiled, plan), x)
    torch.testing.assert_close(tile_means(tiled, geo), vsa.tile_means(x, plan), atol=1e-6, rtol=1e-6)


def test_kv_block_lists_cover_the_tile_map_and_split_full_from_partial():
    """The block lists hold exactly the kept tiles; full lists only 64-row tiles, partial lists only the others."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    geo = tiled_geometry(plan, torch.device("cpu"))
    q, k, _, _ = _inputs(plan)
    keep = block_map(vsa.tile_scores(q, k, plan), plan)
    partial_num, partial_idx, full_num, full_idx = kv_block_lists(keep, geo)
    sizes = plan.variable_block_sizes
    rebuilt = torch.zeros_like(keep)
    for num, idx, is_full in ((partial_num, partial_idx, False), (full_num, full_idx, True)):
        for b, h, i in torch.cartesian_prod(*(torch.arange(s) for s in keep.shape[:3])).tolist():
            chosen = idx[b, h, i, : num[b, h, i]].long()
            assert bool(((sizes[chosen] == TILE_TOKENS) == is_full).all())
            assert not bool(rebuilt[b, h, i, chosen].any()), "a tile listed twice"
            rebuilt[b, h, i, chosen] = True
    assert torch.equal(rebuilt, keep)
    mask = build_block_mask((partial_num, partial_idx, full_num, full_idx), geo, None)
    assert torch.equal(mask.to_dense().bool(), keep)


def _lists_to_map(lists, n):
    """Dense bool [B, H, n, n] of the tiles named by (partial_num, partial_idx, full_num, full_idx)."""
    out = None
    for num, idx in (lists[:2], lists[2:]):
        cols = torch.arange(idx.shape[-1])
        part = torch.zeros(*idx.shape[:3], n + 1, dtype=torch.bool)
        part.scatter_(-1, torch.where(cols < num[..., None], idx.long(), n), True)
        out = part[..., :n] if out is None else out | part[..., :n]
    return out


@pytest.mark.parametrize("grid,sparsity", [(GRID, 0.8), ((5, 9, 6), 0.5)])
def test_lists_from_scores_equal_lists_from_reference_block_map(grid, sparsity):
    """Block lists built straight from top-k name exactly the reference map's tiles, split by full/partial alike."""
    plan = build_vsa_plan(PREFIX, grid, sparsity)
    geo = tiled_geometry(plan, torch.device("cpu"))
    q, k, _, _ = _inputs(plan, heads=3, seed=4)
    scores = vsa.tile_scores(q, k, plan)
    fast = kv_lists_from_scores(scores, plan, geo)
    slow = kv_block_lists(block_map(scores, plan), geo)
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[2], slow[2])  # per-kind counts
    assert torch.equal(_lists_to_map(fast[:2] + (torch.zeros_like(fast[2]), fast[3]), plan.num_tiles),
                       _lists_to_map(slow[:2] + (torch.zeros_like(slow[2]), slow[3]), plan.num_tiles))
    assert torch.equal(_lists_to_map(fast, plan.num_tiles), block_map(scores, plan))


def test_kernel_semantics_from_block_lists_and_pad_mask_equal_reference():
    """Attention over the listed blocks, pad mask in partial blocks only, equals the reference fine branch."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    geo = tiled_geometry(plan, torch.device("cpu"))
    q, k, v, _ = _inputs(plan)
    keep = block_map(vsa.tile_scores(q, k, plan), plan)
    partial_num, partial_idx, full_num, full_idx = kv_lists_from_scores(vsa.tile_scores(q, k, plan), plan, geo)

    # Token mask the compiled kernel applies: full blocks unmasked, partial blocks masked to real key slots.
    def dense(num, idx):
        n = plan.num_tiles
        cols = torch.arange(n)
        blocks = torch.zeros(*keep.shape[:3], n + 1, dtype=torch.bool)
        blocks.scatter_(-1, torch.where(cols < num[..., None], idx.long(), n), True)
        return blocks[..., :n].repeat_interleave(TILE_TOKENS, -2).repeat_interleave(TILE_TOKENS, -1)

    token_mask = dense(full_num, full_idx) | (dense(partial_num, partial_idx) & geo.valid_slot)
    qt, kt, vt = (to_tiles(t, geo).transpose(1, 2) for t in (q, k, v))
    fine = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=token_mask).transpose(1, 2)[:, geo.untile]

    row_tile = plan.row_tile
    reference_mask = keep[:, :, row_tile][:, :, :, row_tile]
    expected = vsa._masked_attention(q, k, v, reference_mask).transpose(1, 2)
    torch.testing.assert_close(fine, expected, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("batch,heads", [(1, 1), (2, 3)])
def test_fp32_matches_reference(batch, heads):
    """At sparsity 0.8 with a random gate, the fast path equals the dense-mask reference in fp32."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    q, k, v, g = _inputs(plan, batch=batch, heads=heads, seed=batch + heads)
    out = vsa_attention_cuda(q, k, v, g, plan)
    torch.testing.assert_close(out, vsa_attention(q, k, v, g, plan), atol=FP32_ATOL, rtol=0)


def test_bf16_matches_reference():
    """In bf16 the fast path stays within 2e-2 max abs of the reference and returns bf16."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    q, k, v, g = _inputs(plan, dtype=torch.bfloat16, seed=3)
    out = vsa_attention_cuda(q, k, v, g, plan)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    expected = vsa_attention(*(t.float() for t in (q, k, v, g)), plan)
    assert (out.float() - expected).abs().max().item() <= BF16_ATOL


def test_sparsity_zero_with_zero_gate_is_dense_attention():
    """k = Nv and G = 0 give plain dense attention (SDPA over all rows)."""
    plan = build_vsa_plan(PREFIX, GRID, 0.0)
    assert plan.is_dense
    q, k, v, g = _inputs(plan, seed=5)
    out = vsa_attention_cuda(q, k, v, torch.zeros_like(g), plan)
    sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(out, sdpa, atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(out, dense_attention(q, k, v), atol=FP32_ATOL, rtol=0)


def test_all_tiles_through_flex_equal_dense_attention():
    """The FlexAttention fine branch with every tile kept (pads masked) equals dense attention over the real rows."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    geo = tiled_geometry(plan, torch.device("cpu"))
    q, k, v, _ = _inputs(plan, seed=6)
    keep = torch.ones((2, 2, plan.num_tiles, plan.num_tiles), dtype=torch.bool)
    lists = kv_block_lists(keep, geo)
    fine = fine_attention(to_tiles(q, geo), to_tiles(k, geo), to_tiles(v, geo), lists, geo, keep=keep)[:, geo.untile]
    torch.testing.assert_close(fine, dense_attention(q, k, v), atol=FP32_ATOL, rtol=0)


def test_zero_gate_removes_coarse_branch_and_a_gate_adds_it():
    """With G = 0 the output is the fine branch alone; a nonzero gate adds G ⊙ coarse, changing the output."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    q, k, v, g = _inputs(plan, seed=7)
    ungated = vsa_attention_cuda(q, k, v, torch.zeros_like(g), plan)
    keep = block_map(vsa.tile_scores(q, k, plan), plan)
    row_tile = plan.row_tile
    fine = vsa._masked_attention(q, k, v, keep[:, :, row_tile][:, :, :, row_tile]).transpose(1, 2)
    torch.testing.assert_close(ungated, fine, atol=FP32_ATOL, rtol=0)
    gated = vsa_attention_cuda(q, k, v, g, plan)
    assert (gated - ungated).abs().max().item() > 1e-3


def test_bad_inputs_name_the_shape():
    """A row count that does not match the plan, or mismatched q/k shapes, raise ValueError naming the shapes."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    q, k, v, g = _inputs(plan)
    with pytest.raises(ValueError, match=f"S={plan.sequence_length}"):
        vsa_attention_cuda(q[:, :-1], k[:, :-1], v[:, :-1], g[:, :-1], plan)
    with pytest.raises(ValueError, match="k: expected the shape of q"):
        vsa_attention_cuda(q, k[..., :16], v, g, plan)
    with pytest.raises(ValueError, match="gate: expected torch.float32"):
        vsa_attention_cuda(q, k, v, g.double(), plan)


def test_triton_kernels_in_interpreter_match_torch():
    """Under TRITON_INTERPRET=1 on CPU, the tile kernel equals the torch tiling in both layouts and the combine kernel
    is bit-exact."""
    repo = Path(__file__).resolve().parents[4]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-P", str(Path(__file__).with_name("interpreted_kernels.py"))], env=env,
                          cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tiled_equal"] and result["tiled_head_major_equal"] and result["combine_equal"]
    assert result["means_err"] <= 1e-6


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled FlexAttention kernel needs a CUDA GPU")


def _assert_cuda_bf16_matches_reference(plan, heads, seed):
    """The compiled CUDA path on bf16 inputs is within 2e-2 max abs of the fp32 reference on the same inputs."""
    q, k, v, g = _inputs(plan, heads=heads, dim=128, dtype=torch.bfloat16, device="cuda", seed=seed)
    out = vsa_attention_cuda(q, k, v, g, plan)
    expected = vsa_attention(*(t.float().cpu() for t in (q, k, v, g)), plan)
    assert (out.float().cpu() - expected).abs().max().item() <= BF16_ATOL


@needs_cuda
@pytest.mark.parametrize("grid,heads", [(GRID, 2), ((12, 12, 20), 4)])
def test_cuda_kernel_matches_reference(grid, heads):
    """The compiled CUDA kernel in bf16 equals the fp32 reference within 2e-2 max abs at sparsity 0.8."""
    _assert_cuda_bf16_matches_reference(build_vsa_plan(PREFIX, grid, 0.8), heads, seed=11)


@needs_cuda
def test_cuda_new_top_k_does_not_recompile_and_stays_correct():
    """A second call with different data (a different top-k) on the same geometry is correct again."""
    plan = build_vsa_plan(PREFIX, GRID, 0.8)
    for seed in (21, 22):
        _assert_cuda_bf16_matches_reference(plan, heads=2, seed=seed)


@needs_cuda
def test_cuda_sparsity_zero_equals_sdpa():
    """On CUDA, sparsity 0 with a zero gate equals dense SDPA in bf16."""
    plan = build_vsa_plan(PREFIX, GRID, 0.0)
    q, k, v, g = _inputs(plan, heads=2, dim=128, dtype=torch.bfloat16, device="cuda", seed=31)
    out = vsa_attention_cuda(q, k, v, torch.zeros_like(g), plan)
    sdpa = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert (out.float() - sdpa.float()).abs().max().item() <= BF16_ATOL
    assert math.isfinite(out.float().abs().max().item())


@needs_cuda
@pytest.mark.parametrize("head_major", [False, True])
def test_cuda_tiling_kernel_matches_torch(head_major):
    """The Triton tile-and-mean kernel writes the torch padded buffer (zero pads; transposed to [B, H, 64·n, D] when
    head-major, the compiled VSA kernel's input) and the same fp32 means."""
    plan = build_vsa_plan(PREFIX, (12, 12, 20), 0.8)
    geo = tiled_geometry(plan, torch.device("cuda"))
    qkv = torch.randn(2, plan.sequence_length, 3, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = qkv[:, :, 2]  # strided view, as the DiT passes v
    tiled, means = launch_tile_and_mean(v, geo, head_major=head_major)
    expected = to_tiles(v, geo)
    assert tiled.is_contiguous()
    assert torch.equal(tiled, expected.transpose(1, 2) if head_major else expected)
    torch.testing.assert_close(means, tile_means(expected, geo), atol=1e-5, rtol=1e-5)


@needs_cuda
def test_cuda_combine_kernel_matches_torch_bitwise():
    """The Triton combine kernel equals fine[untile] + gate ⊙ coarse[tile] in eager bf16 bit for bit."""
    plan = build_vsa_plan(PREFIX, (12, 12, 20), 0.8)
    geo = tiled_geometry(plan, torch.device("cuda"))
    fine = torch.randn(2, geo.num_slots, 4, 128, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(2, plan.sequence_length, 4, 128, device="cuda", dtype=torch.bfloat16)
    coarse = torch.randn(2, 4, plan.num_tiles, 128, device="cuda", dtype=torch.bfloat16)
    expected = fine.index_select(1, geo.untile) + gate * coarse.transpose(1, 2).index_select(1, geo.row_tile)
    assert torch.equal(combine(fine, gate, coarse, geo), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA dispatch needs a GPU")
def test_dit_entry_point_dispatches_cuda_tensors_to_the_fast_path():
    """The DiT's `AttentionCore` runs the FlexAttention path on CUDA tensors and matches the reference."""
    torch.manual_seed(0)
    plan = build_vsa_plan((12, 74), (7, 4, 8), 0.8)
    q, k, v, g = (torch.randn(1, plan.sequence_length, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out = AttentionCore(head_dim=64)(q, k, v, g, plan)
    expected = vsa_attention(*(t.float().cpu() for t in (q, k, v, g)), plan)
    torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=0)
