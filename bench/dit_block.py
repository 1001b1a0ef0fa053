"""One real-size MiniMax-H3 DiT block on one GPU: diffusers oracle vs native dense vs native VSA-H3, attention alone.

Geometry: the V2 recipe 1344×768, 4.4 s (107 frames → latent 32×48×84) with a 128-token prompt:
S = 128 text + 356 audio + 32,256 video = 32,740 rows. Random bf16 weights at real width (hidden 5376, 56×128 heads,
SwiGLU 14336). Times are CUDA-event medians after warm-up; compile / first-call / capture time is reported apart.

Parts (each guarded, so one failure does not lose the others; results go to OUT/dit_block.json as they arrive):
  peak       8192³ bf16 matmul rate and the block's own GEMM shapes at M = S.
  attention  (d) dense SDPA vs each sparse VSA path at sparsity 0.8: FlexAttention (worker/h3/vsa_cuda.py) and the
             compiled sm_90a kernel (worker/h3/vsa_tk.py, when it loads); stage breakdowns, optional Flex option
             sweep, a real-size check of two heads of each against an fp32 masked reference on the same tile maps.
  block      (a) diffusers MiniMaxH3TransformerBlock eager dense, (b) native DiTBlock dense, (c) native DiTBlock with
             VSA 0.8 on the shipped dispatch (compiled kernel where it loads), (c-flex) the same on FlexAttention,
             (c-graph)/(c-flex-graph) each replayed from one CUDA graph; launch gaps (wall − summed kernel time from
             torch.profiler), peak memory, 8 steps × 50 blocks; --c0 adds (c0), eager QK-norm/RoPE/SwiGLU.
  glue       the fused QK-norm + RoPE and SwiGLU ops alone at S rows vs their eager torch paths: ms, GB/s, and the
             fraction of output elements that differ from eager CUDA torch.
  fp8        block (c) in bf16 and with H3BATCH_PRECISION=fp8's e4m3 linears (worker/h3/precision.py): ms, the
             per-block budget (linears / attention / fp8 quantization / glue / gaps), one block's output error, and
             the five linears alone.

Usage (on the GPU machine): python bench/dit_block.py --out $OUT [--parts peak,attention,block,glue] [--sweep] [--c0]
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from timing import median_ms as time_ms

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3 import vsa as vsa_module
from h3batch.worker.h3 import vsa_cuda, vsa_tk
from h3batch.worker.h3 import vsa_plan as vsa_plan_module
from h3batch.worker.h3.packing import build_packed_layout

TEXT_ROWS = 128
WIDTH, HEIGHT, SECONDS = 1344, 768, 4.4
STEPS, BLOCKS = 8, 50
ALL_TO_ALL_GBPS = 350.0  # assumed per-GPU NVLink all-to-all bandwidth for the multi-GPU estimate (not measured here)

SWEEP = [  # H200 runs 2026-12-01 without TMA: stages 2 → 19.8 ms, 4 → 22.8, 8 warps → 28.3 vs 17.9 (w4 s3);
    # then TMA 17.5, PRESCALE_QK 18.3, both 16.2 (PRESCALE_QK rounds q·scale to bf16: kept off for accuracy).
    {"num_stages": 2},
    {"num_stages": 4},
    {"PRESCALE_QK": True},
]


# Timing --------------------------------------------------------------------------------------------------------------


def first_call_s(fn) -> float:
    """Wall time of one call including compilation, synchronized."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


# FLOP counts ---------------------------------------------------------------------------------------------------------


def linear_flops(rows: int, hidden: int, inner: int, ffn: int, *, gate: bool) -> float:
    """2·S·(weights) for qkv, out, fc1, fc2 (+ to_gate_compress)."""
    weights = 3 * inner * hidden + inner * hidden + 3 * ffn * hidden + (inner * hidden if gate else 0)
    return 2.0 * rows * weights


def dense_attention_flops(rows: int, inner: int) -> float:
    return 4.0 * rows * rows * inner


def sparse_attention_flops(keep: torch.Tensor, plan, head_dim: int) -> float:
    """4·hd·Σ_{b,h,i} size_i·Σ_{j kept} size_j: the useful (unpadded) FLOPs of the fine branch."""
    sizes = plan.variable_block_sizes.to(device=keep.device, dtype=torch.float64)
    per_query_tile = (keep.to(torch.float64) * sizes).sum(-1)  # [B, H, n] real keys seen
    return 4.0 * head_dim * float((per_query_tile * sizes).sum())


# Setup ---------------------------------------------------------------------------------------------------------------


def geometry():
    layout = build_packed_layout(TEXT_ROWS, RequestGeometry(WIDTH, HEIGHT, SECONDS))
    plan = vsa_plan_module.vsa_plan_for_layout(layout, 0.8)
    return layout, plan


def environment() -> dict:
    info = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
    }
    for name in ("triton", "diffusers"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - record, do not stop
            info[name] = f"unavailable: {exc}"
    return info


# Parts ---------------------------------------------------------------------------------------------------------------


def part_peak(res: dict, rows: int) -> None:
    """Matmul ceiling (8192³) and the block's GEMMs at M = rows, bf16 random data."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: a @ b, reps=20, warmup=5)
    res["matmul_8192_TFLOPs"] = 2 * n**3 / ms / 1e9
    del a, b
    shapes = {"qkv_proj": (5376, 21504), "to_gate_compress": (5376, 7168), "out_proj": (7168, 5376),
              "fc1": (5376, 28672), "fc2": (14336, 5376)}
    gemms = {}
    for name, (k_in, n_out) in shapes.items():
        x = torch.randn(rows, k_in, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n_out, k_in, device="cuda", dtype=torch.bfloat16) * k_in**-0.5
        ms = time_ms(lambda: F.linear(x, w), reps=10, warmup=3)
        gemms[name] = {"ms": ms, "TFLOPs": 2 * rows * k_in * n_out / ms / 1e9}
        del x, w
    total_flops = sum(2 * rows * k * o for k, o in shapes.values())
    total_ms = sum(g["ms"] for g in gemms.values())
    res["gemms"] = gemms
    res["gemms_total_ms"] = total_ms
    res["gemms_TFLOPs"] = total_flops / total_ms / 1e9
    res["gemms_fraction_of_peak"] = res["gemms_TFLOPs"] / res["matmul_8192_TFLOPs"]


def _reference_heads(q, k, v, g, plan, heads, chunk=4096):
    """fp32 VSA reference for a few heads at full length (query chunks; token mask from the reference's tile map)."""
    scores = vsa_module.tile_scores(q, k, plan)  # fp32 [1, H, n, n] via the reference's own means
    keep = vsa_plan_module.block_map(scores, plan)
    coarse = (torch.softmax(scores, -1) @ vsa_module.tile_means(v, plan)).to(q.dtype)  # [1, H, n, D]
    row_tile = plan.row_tile.to(q.device)
    out = {}
    for h in heads:
        qh, kh, vh = (t[0, :, h].float() for t in (q, k, v))  # [S, D]
        tiles_kept = keep[0, h]  # [n, n]
        pieces = []
        for start in range(0, qh.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = qh[rows] @ kh.T / math.sqrt(qh.shape[-1])
            mask = tiles_kept[row_tile[rows]][:, row_tile]
            pieces.append(torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ vh)
        fine = torch.cat(pieces).to(q.dtype)
        out[h] = fine + g[0, :, h] * coarse[0, h, row_tile]
    return out, keep


def part_attention(res: dict, plan, sweep: bool, dump) -> None:
    """(d): dense SDPA vs VSA at sparsity 0.8, plus option sweep, stage breakdown and a real-size check."""
    rows, heads, dim = plan.sequence_length, 56, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (1, rows, heads, dim)
    q, k, v, g = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    att = res.setdefault("attention", {})
    att["rows"], att["tiles"], att["prefix_tiles"], att["video_tiles"], att["top_k"] = (
        rows, plan.num_tiles, plan.num_prefix_tiles, plan.num_video_tiles, plan.top_k)

    sdpa = lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # noqa: E731
    att["sdpa_ms"] = time_ms(sdpa, reps=10)
    att["dense_TFLOP"] = dense_attention_flops(rows, heads * dim) / 1e12
    att["sdpa_TFLOPs"] = att["dense_TFLOP"] / att["sdpa_ms"] * 1e3
    dump()

    # Real-size correctness on two heads before any timing of VSA.
    att["first_call_s"] = first_call_s(lambda: vsa_cuda.vsa_attention_cuda(q, k, v, g, plan))
    out = vsa_cuda.vsa_attention_cuda(q, k, v, g, plan)
    ref, keep_ref = _reference_heads(q, k, v, g, plan, heads=(0, 37))
    att["check_max_abs_err"] = max((out[0, :, h].float() - r.float()).abs().max().item() for h, r in ref.items())
    geo = vsa_cuda.tiled_geometry(plan, q.device)
    (qt, qm), (kt, km), (vt, _) = (vsa_cuda.tile_rows(t, geo) for t in (q, k, v))
    scores = qm @ km.transpose(-1, -2) / math.sqrt(dim)
    keep = vsa_plan_module.block_map(scores, plan)
    att["block_map_agreement_with_reference"] = (keep == keep_ref).float().mean().item()
    att["density_tiles"] = keep.float().mean().item()
    att["sparse_TFLOP"] = sparse_attention_flops(keep, plan, dim) / 1e12
    # keep spans [B, H, n, n], so its sum already counts every head's 64×64 blocks.
    att["padded_sparse_TFLOP"] = 4.0 * dim * float(keep.sum()) * vsa_plan_module.TILE_TOKENS**2 / 1e12
    # The compiled sm_90a kernel (worker/h3/vsa_tk.py): same check on the same heads, and against the Flex output.
    tk = att.setdefault("tk", {})
    tk["loaded"] = vsa_tk.load_block_sparse_fwd() is not None
    tk["load_error"] = vsa_tk.load_error()
    if tk["loaded"]:
        try:
            tk["first_call_s"] = first_call_s(lambda: vsa_tk.vsa_attention_tk(q, k, v, g, plan))
            out_tk = vsa_tk.vsa_attention_tk(q, k, v, g, plan)
            tk["finite"] = bool(torch.isfinite(out_tk).all())
            tk["check_max_abs_err"] = max((out_tk[0, :, h].float() - r.float()).abs().max().item()
                                          for h, r in ref.items())
            tk["max_abs_diff_vs_flex"] = (out_tk.float() - out.float()).abs().max().item()
            tk["mean_abs_diff_vs_flex"] = (out_tk.float() - out.float()).abs().mean().item()
            del out_tk
        except Exception:  # noqa: BLE001 - a kernel that refuses the geometry is a result
            tk["error"] = traceback.format_exc()[-2000:]
            tk["loaded"] = False
            print(tk["error"], flush=True)
    del keep_ref, ref
    dump()

    att["vsa_ms"] = time_ms(lambda: vsa_cuda.vsa_attention_cuda(q, k, v, g, plan), reps=10)
    att["vsa_speedup_vs_sdpa"] = att["sdpa_ms"] / att["vsa_ms"]
    att["vsa_effective_TFLOPs"] = att["sparse_TFLOP"] / att["vsa_ms"] * 1e3
    dump()
    if tk["loaded"]:
        tk["ms"] = time_ms(lambda: vsa_tk.vsa_attention_tk(q, k, v, g, plan), reps=10)
        tk["speedup_vs_sdpa"] = att["sdpa_ms"] / tk["ms"]
        tk["speedup_vs_flex"] = att["vsa_ms"] / tk["ms"]
        tk["effective_TFLOPs"] = att["sparse_TFLOP"] / tk["ms"] * 1e3
        tk_stages = {"tile_bhsd_and_mean_x3": time_ms(lambda: [vsa_tk.tile_rows_bhsd(t, geo) for t in (q, k, v)])}
        (qh, _), (kh, _), (vh, _) = (vsa_tk.tile_rows_bhsd(t, geo) for t in (q, k, v))
        tk_stages["scores_topk_lists"] = time_ms(lambda: vsa_tk.q2k_lists(qm @ km.transpose(-1, -2) / math.sqrt(dim),
                                                                          plan))
        idx, num = vsa_tk.q2k_lists(scores, plan)
        tk_stages["kernel_only"] = time_ms(lambda: vsa_tk.fine_attention_tk(qh, kh, vh, idx, num, plan))
        tk["stages_ms"] = tk_stages
        tk["kernel_TFLOPs"] = att["sparse_TFLOP"] / tk_stages["kernel_only"] * 1e3
        tk["kernel_padded_TFLOPs"] = att["padded_sparse_TFLOP"] / tk_stages["kernel_only"] * 1e3
        del qh, kh, vh, idx, num
        print("tk", tk, flush=True)
        dump()

    # Stage breakdown (default kernel options).
    stages = {}
    stages["tile_and_mean_x3"] = time_ms(lambda: [vsa_cuda.tile_rows(t, geo) for t in (q, k, v)])
    stages["topk_only"] = time_ms(lambda: torch.topk(scores[..., plan.num_prefix_tiles:], plan.top_k, dim=-1))
    stages["scores_topk_lists"] = time_ms(lambda: vsa_cuda.kv_lists_from_scores(
        qm @ km.transpose(-1, -2) / math.sqrt(dim), plan, geo))
    lists = vsa_cuda.kv_lists_from_scores(scores, plan, geo)
    stages["block_mask_build"] = time_ms(lambda: vsa_cuda.build_block_mask(lists, geo, vsa_cuda._pad_mask_mod(geo)))
    bm = vsa_cuda.build_block_mask(lists, geo, vsa_cuda._pad_mask_mod(geo))
    flex = vsa_cuda._compiled_flex()
    opts = dict(vsa_cuda.DEFAULT_KERNEL_OPTIONS)
    stages["flex_kernel_only"] = time_ms(lambda: flex(qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2),
                                                      block_mask=bm, scale=dim**-0.5, kernel_options=opts))
    fine_t = vsa_cuda.fine_attention(qt, kt, vt, lists, geo)
    att["flex_output_stride"] = list(fine_t.stride())
    coarse = torch.randn(1, heads, plan.num_tiles, dim, device="cuda", dtype=torch.bfloat16)
    stages["combine"] = time_ms(lambda: vsa_cuda.combine(fine_t, g, coarse, geo))
    att["stages_ms"] = stages
    att["flex_kernel_TFLOPs"] = att["sparse_TFLOP"] / stages["flex_kernel_only"] * 1e3
    att["flex_kernel_padded_TFLOPs"] = att["padded_sparse_TFLOP"] / stages["flex_kernel_only"] * 1e3
    dump()

    if sweep:
        results = []
        for options in SWEEP:
            entry = {"options": options}
            try:
                full = {**vsa_cuda.DEFAULT_KERNEL_OPTIONS, **options}
                entry["first_call_s"] = first_call_s(lambda: vsa_cuda.vsa_attention_cuda(
                    q, k, v, g, plan, kernel_options=full))
                entry["kernel_ms"] = time_ms(lambda: flex(qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2),
                                                          block_mask=bm, scale=dim**-0.5, kernel_options=full))
                entry["vsa_ms"] = time_ms(lambda: vsa_cuda.vsa_attention_cuda(q, k, v, g, plan, kernel_options=full))
                o = vsa_cuda.vsa_attention_cuda(q, k, v, g, plan, kernel_options=full)
                entry["max_abs_diff_vs_default"] = (o.float() - out.float()).abs().max().item()
            except Exception as exc:  # noqa: BLE001 - a config the template refuses is a result
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            results.append(entry)
            print("sweep", entry, flush=True)
            dump()
        att["sweep"] = results


def _copy_diffusers_to_native(dblock, nblock, ffn: int) -> None:
    """Load the diffusers block's random weights into the native block (N names, §3.2/§3.3 rules)."""
    with torch.no_grad():
        a = dblock.attn
        nblock.attn.qkv_proj.weight.copy_(torch.cat([a.to_q.weight, a.to_k.weight, a.to_v.weight]))
        nblock.attn.q_norm.weight.copy_(a.norm_q.weight)
        nblock.attn.k_norm.weight.copy_(a.norm_k.weight)
        nblock.attn.out_proj.weight.copy_(a.to_out[0].weight)
        w1 = dblock.ff.net[0].proj.weight
        nblock.mlp.fc1.weight.copy_(torch.cat([w1[ffn:], w1[:ffn]]))
        nblock.mlp.fc2.weight.copy_(dblock.ff.net[2].weight)
        nblock.norm1.weight.copy_(dblock.norm1.weight)
        nblock.norm2.weight.copy_(dblock.norm2.weight)
        nblock.adaln_proj.linear.weight.copy_(dblock.adaln_proj.linear.weight)
        nblock.adaln_proj.linear.bias.copy_(dblock.adaln_proj.linear.bias)


def _is_gemm(name: str) -> bool:
    """cuBLAS / CUTLASS matmul kernels (attention kernels excluded, though cuDNN's carry 'sm90' too)."""
    low = name.lower()
    if any(s in low for s in ("sdpa", "flash", "fmha", "attention", "triton")):
        return False
    return any(s in low for s in ("gemm", "nvjet", "xmma", "cutlass", "sm90"))


def _profile_top(fn, path: Path, top: int = 15) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0 and e.device_type.name == "CUDA"]
    if not events:  # older naming: kernels appear as CPU-side events with cuda time
        events = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    total = sum(e.self_device_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    rows = [{"kernel": e.key[:120], "ms": e.self_device_time_total / 1e3, "calls": e.count,
             "share": e.self_device_time_total / total} for e in events[:top]]
    path.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
    gemm_us = sum(e.self_device_time_total for e in events if _is_gemm(e.key))
    return rows, gemm_us / 1e3, total / 1e3


def _with_kernel(choice: str, fn):
    """fn() with H3BATCH_VSA_KERNEL set to `choice` (vsa_tk's predicate reads it per call)."""
    before = os.environ.get(vsa_tk.KERNEL_ENV)
    os.environ[vsa_tk.KERNEL_ENV] = choice
    try:
        return fn()
    finally:
        if before is None:
            del os.environ[vsa_tk.KERNEL_ENV]
        else:
            os.environ[vsa_tk.KERNEL_ENV] = before


def _graph_entry(fn, flops: float) -> dict:
    """Capture fn() (already warm) in one CUDA graph and time its replays; output checked against an eager call."""
    eager = fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn()
    graph.replay()
    torch.cuda.synchronize()
    entry = {"capture_s": time.perf_counter() - t0}
    entry["max_abs_vs_eager"] = (static_out.float() - eager.float()).abs().max().item()
    entry["ms"] = time_ms(graph.replay, reps=10, warmup=2)
    entry["TFLOPs"] = flops / entry["ms"] / 1e9
    del graph, static_out, eager
    torch.cuda.empty_cache()
    return entry


def _with_eager_glue(native, fn):
    """fn() with h3batch.worker.h3.model's fused QK-norm + RoPE and SwiGLU ops forced onto their eager torch paths."""
    fused_ops = native.qk_norm_rope, native.swiglu
    native.qk_norm_rope = functools.partial(fused_ops[0], backend="torch")
    native.swiglu = functools.partial(fused_ops[1], backend="torch")
    try:
        return fn()
    finally:
        native.qk_norm_rope, native.swiglu = fused_ops


def part_glue(res: dict, rows: int, dump) -> None:
    """Fused QK-norm + RoPE and SwiGLU alone at the block's shapes vs eager torch: time, bandwidth, mismatches."""
    from h3batch.kernels import qk_norm_rope, swiglu
    from h3batch.worker.h3.config import H3Config

    cfg = H3Config()
    heads, hd, width, ffn = cfg.num_attention_heads, cfg.attention_head_dim, cfg.rotary_dim, cfg.ffn_hidden_size
    glue = res.setdefault("glue", {})
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(1, rows, 3 * heads * hd, device="cuda", generator=g).mul_(2).to(torch.bfloat16)
    weights = [(1 + 0.2 * torch.randn(hd, device="cuda", generator=g)).to(torch.bfloat16) for _ in range(2)]
    angles = torch.rand(rows, width // 2, device="cuda", generator=g) * 100
    angles = torch.cat((angles, angles), -1)
    rope = (angles.cos(), angles.sin())
    eps = cfg.qk_norm_eps
    qk_bytes = rows * 2 * heads * hd * 2 * 2  # read q and k, write q and k (bf16)
    for backend in ("torch", "triton"):
        ms = time_ms(lambda: qk_norm_rope(qkv, hd, *weights, eps, rope, backend=backend), reps=20, warmup=3)
        glue[f"qk_norm_rope_{backend}_ms"] = ms
        glue[f"qk_norm_rope_{backend}_GBps"] = qk_bytes / ms / 1e6
    fused = qk_norm_rope(qkv, hd, *weights, eps, rope, backend="triton")
    eager = qk_norm_rope(qkv, hd, *weights, eps, rope, backend="torch")
    glue["qk_norm_rope_differing_fraction"] = [(a != b).float().mean().item() for a, b in zip(fused, eager)]
    glue["qk_norm_rope_max_abs"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(fused, eager))
    del qkv, fused, eager
    dump()

    fc1_out = torch.randn(1, rows, 2 * ffn, device="cuda", generator=g).mul_(3).to(torch.bfloat16)
    sw_bytes = rows * 3 * ffn * 2  # read gate and up, write the product (bf16)
    for backend in ("torch", "triton"):
        ms = time_ms(lambda: swiglu(fc1_out, backend=backend), reps=20, warmup=3)
        glue[f"swiglu_{backend}_ms"] = ms
        glue[f"swiglu_{backend}_GBps"] = sw_bytes / ms / 1e6
    fused, eager = swiglu(fc1_out, backend="triton"), swiglu(fc1_out, backend="torch")
    glue["swiglu_differing_fraction"] = (fused != eager).float().mean().item()
    glue["swiglu_max_abs"] = (fused.float() - eager.float()).abs().max().item()
    print("glue", glue, flush=True)
    dump()


def part_block(res: dict, layout, plan, out_dir: Path, dump, with_c0: bool = False) -> None:
    """(a) diffusers eager dense, (b) native dense, (c) native VSA 0.8 (shipped dispatch), (c-flex), graph replays."""
    from h3batch.worker.h3 import model as native
    from h3batch.worker.h3.config import H3Config

    cfg = H3Config(vsa_gates=True)
    rows, hidden, inner, ffn = layout.sequence_length, cfg.hidden_size, cfg.inner_dim, cfg.ffn_hidden_size
    blk = res.setdefault("block", {})
    tags = layout.token_tags.cuda()
    timestep_indices = (tags == 2).long()  # V2 step: text/video index 0, audio index 1
    adaln_rows = timestep_indices * 3 + tags
    temb = torch.randn(2, cfg.time_embed_dim, device="cuda", dtype=torch.float32)
    x = torch.randn(1, rows, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.device("cuda"):
        rope = native.RotaryEmbedding(cfg)(layout.position_ids.cuda())

    lin_dense = linear_flops(rows, hidden, inner, ffn, gate=False)
    lin_gated = linear_flops(rows, hidden, inner, ffn, gate=True)
    att_dense = dense_attention_flops(rows, inner)
    sparse_tflop = res.get("attention", {}).get("sparse_TFLOP")
    att_sparse = sparse_tflop * 1e12 if sparse_tflop else 0.224 * att_dense
    blk["flops_TFLOP"] = {"linear_dense": lin_dense / 1e12, "linear_with_gate": lin_gated / 1e12,
                          "attention_dense": att_dense / 1e12, "attention_vsa": att_sparse / 1e12}

    def record(name, fn, flops, reps=5):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        entry = {"first_call_s": first_call_s(fn)}
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        entry["peak_memory_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        entry["activation_peak_GiB"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        entry["ms"] = time_ms(fn, reps=reps, warmup=1)
        entry["TFLOPs"] = flops / entry["ms"] / 1e9
        blk[name] = entry
        print(name, entry, flush=True)
        dump()

    # (a) diffusers block.
    dout = None
    try:
        from diffusers.models.transformers.transformer_minimax_h3 import (
            MiniMaxH3RotaryPosEmbed,
            MiniMaxH3TransformerBlock,
        )

        with torch.device("cuda"):
            dblock = MiniMaxH3TransformerBlock(hidden, cfg.num_attention_heads, cfg.attention_head_dim, ffn,
                                               cfg.time_embed_dim, cfg.norm_eps, cfg.qk_norm_eps).to(torch.bfloat16)
            drope = MiniMaxH3RotaryPosEmbed(cfg.rope_inv_freq_len, cfg.rope_theta)(layout.position_ids.cuda())
        dblock.eval()
        with torch.no_grad():
            record("a_diffusers_dense", lambda: dblock(x, temb, adaln_rows, drope), lin_dense + att_dense)
            dout = dblock(x, temb, adaln_rows, drope)
    except Exception:  # noqa: BLE001
        blk["a_diffusers_dense"] = {"error": traceback.format_exc()[-1500:]}
        print(blk["a_diffusers_dense"]["error"], flush=True)
        dblock = None

    # (b) native dense.
    with torch.device("cuda"):
        nblock = native.DiTBlock(cfg, torch.bfloat16)
        torch.nn.init.normal_(nblock.attn.to_gate_compress.weight, std=hidden**-0.5)
    nblock.eval()
    if dblock is not None:
        _copy_diffusers_to_native(dblock, nblock, ffn)
        del dblock
        torch.cuda.empty_cache()
    with torch.no_grad():
        record("b_native_dense", lambda: nblock(x, temb, adaln_rows, rope), lin_dense + att_dense)
        if dout is not None:
            nout = nblock(x, temb, adaln_rows, rope)
            diff = (nout.float() - dout.float()).abs()
            blk["b_vs_a_max_abs"], blk["b_vs_a_mean_abs"] = diff.max().item(), diff.mean().item()
            blk["a_output_rms"] = dout.float().pow(2).mean().sqrt().item()
            del nout, dout

    # (c) native VSA 0.8 on the shipped dispatch (vsa.vsa_attention: the compiled sm_90a kernel where it loads, see
    # worker/h3/vsa_tk.py), (c-flex) the same block with H3BATCH_VSA_KERNEL=flex; then each replayed from a CUDA graph
    # captured once per geometry (plan, RoPE and AdaLN tables are static inputs), which removes the launch gaps.
    blk["vsa_kernel_c"] = "tk" if vsa_tk.load_block_sparse_fwd() is not None else (
        f"flex (compiled kernel did not load: {vsa_tk.load_error()})")

    def run_c():
        return nblock(x, temb, adaln_rows, rope, plan)

    def run_flex():
        return _with_kernel("flex", run_c)

    with torch.no_grad():
        for name, fn in (("c_native_vsa", run_c), ("c_flex", run_flex)):
            record(name, fn, lin_gated + att_sparse)
            top, gemm_ms, total_ms = _profile_top(fn, out_dir / f"profile_{name}.txt")
            blk[f"{name}_profile_top"] = top
            blk[f"{name}_profile_gemm_ms"] = gemm_ms
            blk[f"{name}_profile_total_kernel_ms"] = total_ms
            blk[f"{name}_launch_gap_ms"] = blk[name]["ms"] - total_ms  # wall minus summed kernel time
            blk[f"{name}_in_block_linear_TFLOPs"] = lin_gated / gemm_ms / 1e9 if gemm_ms else None
            dump()
        blk["c_profile_total_kernel_ms"] = blk["c_native_vsa_profile_total_kernel_ms"]
        blk["c_speedup_vs_c_flex"] = blk["c_flex"]["ms"] / blk["c_native_vsa"]["ms"]
        eager_out = run_c()
        flex_out = run_flex()
        blk["c_vs_c_flex_max_abs"] = (eager_out.float() - flex_out.float()).abs().max().item()
        del flex_out
        for name, base, fn in (("c_graph", "c_native_vsa", run_c), ("c_flex_graph", "c_flex", run_flex)):
            try:
                blk[name] = _graph_entry(fn, lin_gated + att_sparse)
                blk[name]["speedup_vs_eager"] = blk[base]["ms"] / blk[name]["ms"]
                blk[name]["gap_removed_ms"] = blk[base]["ms"] - blk[name]["ms"]
            except Exception:  # noqa: BLE001 - a capture failure is a result
                blk[name] = {"error": traceback.format_exc()[-2000:]}
            print(name, blk[name], flush=True)
            dump()
        del eager_out
        top_b, gemm_b, total_b = _profile_top(lambda: nblock(x, temb, adaln_rows, rope), out_dir / "profile_b.txt")
        blk["b_profile_top"] = top_b
        blk["b_profile_gemm_ms"] = gemm_b

    if with_c0:  # (c0): QK-norm, RoPE and SwiGLU forced back to eager torch (the block (c) of the first runs)
        def run_c0():
            return _with_eager_glue(native, run_c)

        with torch.no_grad():
            record("c0_native_vsa_eager_glue", run_c0, lin_gated + att_sparse)
        blk["c_speedup_vs_c0"] = blk["c0_native_vsa_eager_glue"]["ms"] / blk["c_native_vsa"]["ms"]

    a_ms = blk.get("a_diffusers_dense", {}).get("ms")
    c_ms = blk["c_native_vsa"]["ms"]
    if a_ms:
        blk["c_speedup_vs_a"] = a_ms / c_ms
    blk["b_speedup_vs_a"] = a_ms / blk["b_native_dense"]["ms"] if a_ms else None
    # Estimates: 8 forwards × 50 blocks; N-GPU Ulysses splits rows, adds all-to-alls of q,k,v,g and the output.
    per_gpu = {}
    for n in (1, 2, 4, 8):
        comm_ms = 0.0 if n == 1 else 5 * rows * inner * 2 / n * (n - 1) / n / (ALL_TO_ALL_GBPS * 1e9) * 1e3
        per_gpu[str(n)] = {"block_ms": c_ms / n + comm_ms, "dit_s": STEPS * BLOCKS * (c_ms / n + comm_ms) / 1e3,
                           "all_to_all_ms_per_block": comm_ms}
    blk["estimate_8x50"] = per_gpu
    blk["denoise_8x50_1gpu_s"] = {name: STEPS * BLOCKS * blk[name]["ms"] / 1e3
                                  for name in ("c_native_vsa", "c_flex", "c_graph", "c_flex_graph")
                                  if "ms" in blk.get(name, {})}
    if a_ms:
        blk["estimate_8x50_diffusers_1gpu_s"] = STEPS * BLOCKS * a_ms / 1e3
    dump()


def _budget(fn, path: Path, wall_ms: float) -> dict:
    """Per-block budget from one profiled call: linears (GEMMs), attention, fp8 quantization, other kernels (glue),
    and gaps = CUDA-event wall time minus the summed kernel time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    path.write_text(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
    out = {"linears_ms": 0.0, "attention_ms": 0.0, "fp8_quant_ms": 0.0, "glue_ms": 0.0, "glue_kernels": []}
    for e in events:
        ms, low = e.self_device_time_total / 1e3, e.key.lower()
        if "quantize_rows" in low:
            out["fp8_quant_ms"] += ms
        elif _is_gemm(e.key):
            out["linears_ms"] += ms
        elif any(k in low for k in ("flex", "attention", "flash", "fmha", "tem_fused", "block_sparse", "vsa")):
            out["attention_ms"] += ms
        else:
            out["glue_ms"] += ms
            out["glue_kernels"].append({"kernel": e.key[:100], "ms": round(ms, 3), "calls": e.count})
    out["glue_kernels"].sort(key=lambda k: -k["ms"])
    out["glue_kernels"] = out["glue_kernels"][:12]
    kernel_ms = out["linears_ms"] + out["attention_ms"] + out["fp8_quant_ms"] + out["glue_ms"]
    out.update(kernel_ms=kernel_ms, wall_ms=wall_ms, gaps_ms=wall_ms - kernel_ms)
    return out


def _loop_budget(fn, n: int = 6) -> dict:
    """`n` back-to-back calls under the profiler, as the timed loop runs them: wall (CUDA events around the loop),
    summed kernel time and GEMM time per call, the idle rest, and the SM clock (NVML) just before and after. If the
    idle rest is small here while `_budget`'s single forward shows a gap, the gap is kernels running slower in the
    loop (clock state), not time between kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    out: dict = {"n": n}
    try:
        out["sm_mhz_before"] = torch.cuda.clock_rate()
    except Exception as exc:  # noqa: BLE001 - NVML may be missing; the times still stand
        out["clock_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
    if "clock_error" not in out:
        out["sm_mhz_after"] = torch.cuda.clock_rate()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels = sum(e.self_device_time_total for e in events) / 1e3
    gemm = sum(e.self_device_time_total for e in events if _is_gemm(e.key)) / 1e3
    wall = start.elapsed_time(end)
    out.update(wall_ms_per_call=wall / n, kernel_ms_per_call=kernels / n, gemm_ms_per_call=gemm / n,
               idle_ms_per_call=(wall - kernels) / n)
    return out


def part_fp8(res: dict, layout, plan, out_dir: Path, dump) -> None:
    """The block (c) on the shipped VSA dispatch in bf16 and with H3BATCH_PRECISION=fp8's linears (worker/h3/
    precision.py), same weights and input: ms, per-block budget (linears / attention / quant / glue / gaps), output
    error of one block, and the five linears alone at M = S."""
    from h3batch.kernels.fp8_linear import fp8_linear, quantize_rows
    from h3batch.worker.h3 import model as native
    from h3batch.worker.h3.config import H3Config
    from h3batch.worker.h3.precision import quantize_block_

    cfg = H3Config(vsa_gates=True)
    rows, hidden = layout.sequence_length, cfg.hidden_size
    out = res.setdefault("fp8", {})
    tags = layout.token_tags.cuda()
    adaln_rows = (tags == 2).long() * 3 + tags
    temb = torch.randn(2, cfg.time_embed_dim, device="cuda", dtype=torch.float32)
    x = torch.randn(1, rows, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.device("cuda"):
        rope = native.RotaryEmbedding(cfg)(layout.position_ids.cuda())
        block = native.DiTBlock(cfg, torch.bfloat16)
    for name, p in block.named_parameters():  # N(0, 1/fan_in) matrices, unit gains (bench/e2e.py's fill)
        with torch.no_grad():
            p.normal_(0.0, p.shape[1] ** -0.5) if p.ndim == 2 else p.fill_(1.0)
    block.eval()

    def run():
        return block(x, temb, adaln_rows, rope, plan)

    ref = run().float()
    for name in ("bf16", "fp8"):
        if name == "fp8":
            quantize_block_(block)
        first = first_call_s(run)
        ms = time_ms(run, reps=7, warmup=1)
        entry = {"first_call_s": first, "ms": ms, "budget": _budget(run, out_dir / f"profile_fp8_part_{name}.txt", ms),
                 "loop_budget": _loop_budget(run)}
        if name == "fp8":
            got = run().float()
            entry["rel_fro_vs_bf16"] = ((got - ref).norm() / ref.norm()).item()
            entry["max_abs_vs_bf16"] = (got - ref).abs().max().item()
            entry["finite"] = bool(torch.isfinite(got).all())
            entry["speedup_vs_bf16"] = out["bf16"]["ms"] / ms
        out[name] = entry
        print("fp8 part", name, {k: v for k, v in entry.items() if k not in ("budget", "loop_budget")}, flush=True)
        print("  loop budget", entry["loop_budget"], flush=True)
        print("  budget", {k: (round(v, 3) if isinstance(v, float) else None) for k, v in entry["budget"].items()
                           if k != "glue_kernels"}, flush=True)
        dump()
    # The linears alone at M = S: bf16 F.linear vs quantize + _scaled_mm (weights quantized once).
    shapes = {"qkv": (hidden, 3 * cfg.inner_dim), "gate": (hidden, cfg.inner_dim), "out": (cfg.inner_dim, hidden),
              "fc1": (hidden, 2 * cfg.ffn_hidden_size), "fc2": (cfg.ffn_hidden_size, hidden)}
    lin = out.setdefault("linears", {})
    for name, (k, n) in shapes.items():
        a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        wq, ws = quantize_rows(w)
        bf = time_ms(lambda: F.linear(a, w), reps=10)
        f8 = time_ms(lambda: fp8_linear(a, wq, ws), reps=10)
        q = time_ms(lambda: quantize_rows(a), reps=10)
        r = F.linear(a, w).float()
        err = ((fp8_linear(a, wq, ws).float() - r).norm() / r.norm()).item()
        lin[name] = {"bf16_ms": bf, "fp8_ms": f8, "quant_ms": q, "speedup": bf / f8, "rel_fro": err,
                     "fp8_TFLOPs": 2 * rows * k * n / f8 / 1e9}
        print("fp8 linear", name, lin[name], flush=True)
        del a, w, wq, ws
    dump()


def print_table(res: dict) -> None:
    att, blk = res.get("attention", {}), res.get("block", {})
    tk = att.get("tk", {})
    nan = float("nan")
    print("\n==== DiT block, S = %s, %s ====" % (att.get("rows"), res.get("env", {}).get("gpu")))
    print("matmul 8192^3: %.0f TFLOP/s; block GEMMs standalone: %.0f TFLOP/s (%.0f%% of it)" % (
        res.get("matmul_8192_TFLOPs", nan), res.get("gemms_TFLOPs", nan), 100 * res.get("gemms_fraction_of_peak", nan)))
    print("(c) uses: %s" % blk.get("vsa_kernel_c"))
    a_ms = blk.get("a_diffusers_dense", {}).get("ms", nan)
    print("%-28s %10s %10s %10s %12s %10s" % ("case", "ms", "TFLOP/s", "first s", "peak GiB", "vs (a)"))
    for name in ("a_diffusers_dense", "b_native_dense", "c0_native_vsa_eager_glue", "c_native_vsa", "c_flex",
                 "c_graph", "c_flex_graph"):
        e = blk.get(name)
        if not e:
            continue
        print("%-28s %10.2f %10.0f %10.1f %12.1f %9.2fx" % (
            name, e.get("ms", nan), e.get("TFLOPs", nan), e.get("first_call_s", e.get("capture_s", nan)),
            e.get("peak_memory_GiB", nan), a_ms / e.get("ms", nan)))
    sdpa = att.get("sdpa_ms", nan)
    print("%-28s %10.2f %10.0f" % ("d_sdpa_dense", sdpa, att.get("sdpa_TFLOPs", nan)))
    for name, ms, tf, first, err in (
            ("d_vsa_flex_0.8", att.get("vsa_ms", nan), att.get("vsa_effective_TFLOPs", nan),
             att.get("first_call_s", nan), att.get("check_max_abs_err", nan)),
            ("d_vsa_tk_0.8", tk.get("ms", nan), tk.get("effective_TFLOPs", nan), tk.get("first_call_s", nan),
             tk.get("check_max_abs_err", nan))):
        print("%-28s %10.2f %10.0f %10.1f   %.2fx vs SDPA, check err %.3g" % (name, ms, tf, first, sdpa / ms, err))
    print("kernel alone: flex %.2f ms (%.0f TFLOP/s), tk %.2f ms (%.0f TFLOP/s); tk load: %s" % (
        att.get("stages_ms", {}).get("flex_kernel_only", nan), att.get("flex_kernel_TFLOPs", nan),
        tk.get("stages_ms", {}).get("kernel_only", nan), tk.get("kernel_TFLOPs", nan),
        "ok" if tk.get("loaded") else tk.get("load_error") or tk.get("error", "")[-300:]))
    for name in ("c_native_vsa", "c_flex"):
        if f"{name}_launch_gap_ms" in blk:
            print("%s: kernels %.2f ms, launch gaps %.2f ms" % (name, blk[f"{name}_profile_total_kernel_ms"],
                                                               blk[f"{name}_launch_gap_ms"]))
    if "c_speedup_vs_c0" in blk:
        print("(c) fused glue vs (c0) eager glue: %.2fx" % blk["c_speedup_vs_c0"])
    if "denoise_8x50_1gpu_s" in blk:
        print("denoise 8 steps x 50 blocks, 1 GPU:", {k: round(v, 2) for k, v in blk["denoise_8x50_1gpu_s"].items()})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--parts", default="peak,attention,block,glue")
    parser.add_argument("--sweep", action="store_true", help="time alternative FlexAttention kernel options")
    parser.add_argument("--c0", action="store_true", help="also time block (c0): QK-norm, RoPE, SwiGLU on eager torch")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/dit_block.py: needs a CUDA GPU (none visible)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {"env": environment(), "command": " ".join(sys.argv)}
    path = args.out / "dit_block.json"

    def dump():
        path.write_text(json.dumps(res, indent=1, default=str))

    layout, plan = geometry()
    res["geometry"] = {"rows": layout.sequence_length, "prefix": layout.prefix_segments, "grid": layout.video_grid}
    print(res["env"], res["geometry"], flush=True)
    parts = args.parts.split(",")
    for part, fn in (("peak", lambda: part_peak(res, layout.sequence_length)),
                     ("attention", lambda: part_attention(res, plan, args.sweep, dump)),
                     ("block", lambda: part_block(res, layout, plan, args.out, dump, args.c0)),
                     ("glue", lambda: part_glue(res, layout.sequence_length, dump)),
                     ("fp8", lambda: part_fp8(res, layout, plan, args.out, dump))):
        if part not in parts:
            continue
        t0 = time.perf_counter()
        try:
            # no_grad, not inference_mode: kernels/ index checks read tensor version counters (absent there).
            with torch.no_grad():
                fn()
        except Exception:  # noqa: BLE001 - keep the other parts' numbers
            res.setdefault("errors", {})[part] = traceback.format_exc()[-3000:]
            print(res["errors"][part], flush=True)
        res.setdefault("part_wall_s", {})[part] = time.perf_counter() - t0
        torch.cuda.empty_cache()
        dump()
    print_table(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
