"""The compiled sm_90a VSA path (worker/h3/vsa_tk.py) against the dense-mask reference (worker/h3/vsa.py), §10, §13.20.

CPU: the tile lists the kernel reads equal the reference tile map, and the predicate keeps CPU tensors (and every
call when H3BATCH_VSA_KERNEL=flex) on the other paths. GPU (marked gpu; skipped with the reason where no H200 with
the fastvideo-kernel extension is present): the kernel path in bf16 equals the fp32 reference within 2e-2 max abs
and the FlexAttention path to bf16 noise, on geometries with partial text/audio prefix tiles, partial edge cubes and
odd and even list lengths, with the gated coarse branch on.
"""
from __future__ import annotations

import pytest
import torch

from h3batch.worker.h3 import vsa, vsa_plan, vsa_tk
from h3batch.worker.h3.model import AttentionCore
from h3batch.worker.h3.vsa import vsa_attention_reference as reference
from h3batch.worker.h3.vsa_cuda import vsa_attention_cuda
from h3batch.worker.h3.vsa_plan import build_vsa_plan

BF16_ATOL = 2e-2
PREFIX = (12, 74)  # text 12 rows (one partial tile), audio 74 rows (64 + a partial 10)
# (grid, sparsity): P = 3 prefix tiles each; lists of P + k keys for video queries and n for prefix queries:
GEOMETRIES = [
    ((8, 8, 10), 0.8),  # Nv = 12, k = 3: 6 and 15 entries (odd), partial w edge cubes of 32 rows
    ((12, 12, 20), 0.8),  # Nv = 45, k = 9: 12 and 48 entries
    ((5, 9, 6), 0.5),  # Nv = 2·3·2 = 12 with partial t, h and w cubes, k = 6: 9 and 15 entries
]


def _inputs(plan, batch=1, heads=2, dim=128, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, plan.sequence_length, heads, dim)
    return [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(4)]


def _map_from_lists(idx: torch.Tensor, num: torch.Tensor, n: int) -> torch.Tensor:
    """bool [B, H, n, n] from (q2k_idx, q2k_num); also checks no key tile is listed twice for one query tile."""
    used = torch.arange(idx.shape[-1]) < num[..., None].long()
    keep = torch.zeros((*idx.shape[:-1], n), dtype=torch.int32)
    keep.scatter_add_(-1, idx.long(), used.to(torch.int32))
    assert int(keep.max()) <= 1, "a key tile listed twice would be counted twice by the kernel"
    return keep.bool()


@pytest.mark.parametrize("grid,sparsity", GEOMETRIES)
def test_lists_encode_exactly_the_reference_tile_map(grid, sparsity):
    """q2k lists (what the kernel reads) hold exactly the kept tiles of the reference `block_map`, each once."""
    plan = build_vsa_plan(PREFIX, grid, sparsity)
    q, k, _, _ = _inputs(plan, batch=2, heads=3, dim=32, seed=3)
    scores = vsa.tile_scores(q, k, plan)
    idx, num = vsa_tk.q2k_lists(scores, plan)
    assert idx.dtype == num.dtype == torch.int32 and idx.shape == (2, 3, plan.num_tiles, plan.num_tiles)
    assert torch.equal(_map_from_lists(idx, num, plan.num_tiles), vsa_plan.block_map(scores, plan))
    assert int(num[:, :, : plan.num_prefix_tiles].min()) == plan.num_tiles  # prefix queries see every tile


def test_predicate_keeps_cpu_and_flex_choice_off_the_compiled_kernel(monkeypatch):
    """CPU tensors never take the kernel; 'tk' on an unusable call raises with the reason; bad choices are named."""
    plan = build_vsa_plan(PREFIX, (8, 8, 10), 0.8)
    q = _inputs(plan, dtype=torch.bfloat16)[0]
    monkeypatch.delenv(vsa_tk.KERNEL_ENV, raising=False)
    assert vsa_tk.use_tk(q, plan) is False
    monkeypatch.setenv(vsa_tk.KERNEL_ENV, "flex")
    assert vsa_tk.use_tk(q, plan) is False
    monkeypatch.setenv(vsa_tk.KERNEL_ENV, "tk")
    with pytest.raises(RuntimeError, match="bf16 CUDA tensors"):
        vsa_tk.use_tk(q, plan)
    monkeypatch.setenv(vsa_tk.KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match="H3BATCH_VSA_KERNEL"):
        vsa_tk.use_tk(q, plan)


def test_cpu_entry_point_still_runs_the_reference():
    """The DiT's AttentionCore on CPU tensors with a plan is the dense-mask reference, bit for bit."""
    plan = build_vsa_plan(PREFIX, (8, 8, 10), 0.8)
    q, k, v, g = _inputs(plan, dim=32, seed=5)
    assert torch.equal(AttentionCore(q.shape[-1])(q, k, v, g, plan), reference(q, k, v, g, plan))


def _tk_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (the compiled VSA kernel is sm_90a only)"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"needs an SM 9.0 GPU (H100/H200), found {torch.cuda.get_device_capability()}"
    if vsa_tk.load_block_sparse_fwd() is None:
        return f"fastvideo-kernel's compiled block_sparse_fwd did not load: {vsa_tk.load_error()}"
    return None


needs_tk = pytest.mark.skipif(_tk_skip_reason() is not None, reason=str(_tk_skip_reason()))


@pytest.mark.gpu
@needs_tk
@pytest.mark.parametrize("grid,sparsity", GEOMETRIES)
@pytest.mark.parametrize("seed", [41, 42])
def test_compiled_kernel_matches_reference_and_flex(grid, sparsity, seed):
    """bf16 kernel path vs the fp32 reference (≤ 2e-2 max abs) and vs FlexAttention, coarse gate and prefix tiles on."""
    plan = build_vsa_plan(PREFIX, grid, sparsity)
    q, k, v, g = _inputs(plan, batch=2, heads=3, dtype=torch.bfloat16, device="cuda", seed=seed)
    out = vsa_tk.vsa_attention_tk(q, k, v, g, plan)
    expected = reference(*(t.float().cpu() for t in (q, k, v, g)), plan)
    assert torch.isfinite(out).all()
    assert (out.float().cpu() - expected).abs().max().item() <= BF16_ATOL
    flex = vsa_attention_cuda(q, k, v, g, plan)
    assert (out.float() - flex.float()).abs().max().item() <= BF16_ATOL


@pytest.mark.gpu
@needs_tk
def test_dit_entry_point_takes_the_compiled_kernel_unless_flex_is_chosen(monkeypatch):
    """On an H200 with the extension, the DiT's AttentionCore selects the kernel; H3BATCH_VSA_KERNEL=flex turns it
    off."""
    plan = build_vsa_plan(PREFIX, (12, 12, 20), 0.8)
    q, k, v, g = _inputs(plan, heads=2, dtype=torch.bfloat16, device="cuda", seed=7)
    monkeypatch.delenv(vsa_tk.KERNEL_ENV, raising=False)
    assert vsa_tk.use_tk(q, plan)
    out = AttentionCore(q.shape[-1])(q, k, v, g, plan)
    assert torch.equal(out, vsa_tk.vsa_attention_tk(q, k, v, g, plan))
    monkeypatch.setenv(vsa_tk.KERNEL_ENV, "flex")
    assert not vsa_tk.use_tk(q, plan)
    assert torch.equal(AttentionCore(q.shape[-1])(q, k, v, g, plan), vsa_attention_cuda(q, k, v, g, plan))
    dense = build_vsa_plan(PREFIX, (12, 12, 20), 0.0)  # dense plans stay on the SDPA branch
    monkeypatch.delenv(vsa_tk.KERNEL_ENV, raising=False)
    assert not vsa_tk.use_tk(_inputs(dense, dtype=torch.bfloat16, device="cuda")[0], dense)

