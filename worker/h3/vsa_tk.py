"""VSA-H3 fine branch on fastvideo-kernel's compiled sm_90a block-sparse kernel, and the predicate that picks it.

`vsa_attention_fast` is what `h3batch.worker.h3.vsa.vsa_attention` calls for CUDA tensors: it runs
`vsa_attention_tk` where `use_tk` says the compiled kernel serves the call, else the FlexAttention path
`h3batch.worker.h3.vsa_cuda.vsa_attention_cuda` (the fallback, and with the dense-mask reference the check).

The kernel is `block_sparse_fwd` from the `fastvideo_kernel._C.fastvideo_kernel_ops` extension of the fastvideo-kernel
wheel (ThunderKittens, Hopper TMA + WGMMA, one CTA per 64-row query tile). What it takes:
q, k, v bf16 [B, H, 64·n, D] contiguous (D = 128 here), the per-query-tile key-tile lists `q2k_idx` int32
[B, H, n, width] with their counts `q2k_num` int32 [B, H, n], and the true row count of every key tile int32 [n]
(pad key slots are masked with it); it returns (out [B, H, 64·n, D], lse). Its tiles are ours (64 slots, valid rows
first), so the plan's padded buffer is its input once laid out head-major, which vsa_cuda's tile kernel writes
directly (`tile_rows_bhsd`).

Only the extension module is loaded, by file path: the package's own `__init__` imports every other kernel family of
the wheel, none of which is needed here. The wheels are built against a newer torch and NCCL than some hosts have;
libraries named in H3BATCH_VSA_PRELOAD (colon-separated paths) are loaded RTLD_GLOBAL first, which is how a host
supplies missing NCCL entry points (the extension links them for its Ulysses all-to-all, which VSA never calls).
H3BATCH_VSA_KERNEL selects: "auto" (default: the compiled kernel where it loads), "flex" (always FlexAttention), "tk"
(the compiled kernel or an error).

The 0.3.5 wheel also bundles a user-mode driver library for its two driver calls; on the lent H200 its NEEDED entry
was pointed at the host's libcuda.so.1 before use (docs/benchmarks.md, P3 section, says how).

Measured on one H200 at the V2 geometry (docs/performance.md §5): kernel 15.46 ms vs FlexAttention's 17.32, whole
VSA 17.88 vs 19.28 ms (2.99× vs 2.77× dense SDPA), max abs 9.8e-4 against the fp32 reference on the same tile maps.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.machinery
import importlib.util
import math
import os
from collections.abc import Callable

import torch

from h3batch.settings import raw_value
from h3batch.worker.h3.vsa_cuda import (
    TiledGeometry,
    _check_inputs,
    combine,
    launch_tile_and_mean,
    tiled_geometry,
    vsa_attention_cuda,
)
from h3batch.worker.h3.vsa_plan import VsaPlan

KERNEL_ENV = "H3BATCH_VSA_KERNEL"
PRELOAD_ENV = "H3BATCH_VSA_PRELOAD"
KERNEL_CHOICES = ("auto", "flex", "tk")
TK_HEAD_DIMS = (128,)  # the head size the H3 DiT uses and the bench and GPU test check


_load_error: str | None = None


@functools.lru_cache(maxsize=1)
def load_block_sparse_fwd() -> Callable | None:
    """fastvideo-kernel's compiled `block_sparse_fwd`, or None (the reason is in `load_error()`)."""
    global _load_error
    try:
        for path in filter(None, (raw_value(PRELOAD_ENV) or "").split(":")):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        spec = importlib.util.find_spec("fastvideo_kernel")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("fastvideo_kernel is not installed")
        found = []
        for folder in spec.submodule_search_locations:
            found += glob.glob(os.path.join(folder, "_C", "fastvideo_kernel_ops*.so"))
        if not found:
            raise ImportError("fastvideo_kernel has no compiled _C/fastvideo_kernel_ops extension")
        name = "fastvideo_kernel._C.fastvideo_kernel_ops"
        loader = importlib.machinery.ExtensionFileLoader(name, found[0])
        module_spec = importlib.util.spec_from_file_location(name, found[0], loader=loader)
        module = importlib.util.module_from_spec(module_spec)
        loader.exec_module(module)
        fwd = getattr(module, "block_sparse_fwd", None)
        if fwd is None:
            raise ImportError(f"{found[0]} exports no block_sparse_fwd")
        return fwd
    except (ImportError, OSError) as exc:
        _load_error = f"{type(exc).__name__}: {exc}"
        return None


def load_error() -> str | None:
    """Why `load_block_sparse_fwd` returned None (None when it loaded or was not tried)."""
    return _load_error


def kernel_choice() -> str:
    choice = (raw_value(KERNEL_ENV) or "auto").lower()  # read per call: tests and the bench flip it
    if choice not in KERNEL_CHOICES:
        raise ValueError(f"{KERNEL_ENV}: expected one of {KERNEL_CHOICES}, got {choice!r}")
    return choice


def use_tk(q: torch.Tensor, plan: VsaPlan) -> bool:
    """The one predicate: does the compiled sm_90a kernel serve this call (else FlexAttention)?

    Needs a sparse plan (dense plans take SDPA in the FlexAttention module), bf16 CUDA tensors on an SM 9.0 device,
    head_dim 128, the extension loaded, and H3BATCH_VSA_KERNEL not "flex". With "tk" an unusable call raises instead.
    """
    choice = kernel_choice()
    if choice == "flex":
        return False
    reasons = []
    if plan.is_dense:
        reasons.append("dense plan")
    if not q.is_cuda or q.dtype != torch.bfloat16 or q.shape[-1] not in TK_HEAD_DIMS:
        reasons.append(f"needs bf16 CUDA tensors with head_dim in {TK_HEAD_DIMS}, got {q.dtype} on {q.device}, "
                       f"head_dim {q.shape[-1]}")
    elif torch.cuda.get_device_capability(q.device) != (9, 0):
        reasons.append(f"needs SM 9.0, device is {torch.cuda.get_device_capability(q.device)}")
    elif load_block_sparse_fwd() is None:
        reasons.append(f"extension not loaded ({load_error()})")
    if reasons and choice == "tk":
        raise RuntimeError(f"{KERNEL_ENV}=tk but the compiled VSA kernel cannot serve this call: {'; '.join(reasons)}")
    return not reasons


def tile_rows_bhsd(x: torch.Tensor, geo: TiledGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows [B, S, H, D] → (padded head-major buffer [B, H, 64·n, D], zero pads; fp32 means [B, H, n, D])."""
    return launch_tile_and_mean(x, geo, head_major=True)


@functools.lru_cache(maxsize=32)
def _static_lists(plan: VsaPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prefix ids int32 [P], every id int32 [n], key-tile sizes int32 [n]) of one plan on one device."""
    n = plan.num_tiles
    ids = torch.arange(n, dtype=torch.int32)
    return (ids[: plan.num_prefix_tiles].to(device), ids.to(device),
            plan.variable_block_sizes.to(device=device, dtype=torch.int32))


def q2k_lists(scores: torch.Tensor, plan: VsaPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """The VSA tile map of `scores` fp32 [B, H, n, n] as (q2k_idx int32 [B, H, n, n], q2k_num int32 [B, H, n]).

    Video query tiles: every prefix key tile, then the top-k video key tiles (`torch.topk`, as the reference's
    `block_map`); prefix query tiles: every tile. Entries past a count are unused (zero). No host synchronisation.
    """
    b, heads, n, _ = scores.shape
    p, k = plan.num_prefix_tiles, plan.top_k
    prefix_ids, every_id, _ = _static_lists(plan, scores.device)
    idx = torch.zeros((b, heads, n, n), dtype=torch.int32, device=scores.device)
    idx[..., :p] = prefix_ids
    idx[..., p : p + k] = (torch.topk(scores[..., p:], k, dim=-1).indices + p).to(torch.int32)
    idx[:, :, :p] = every_id
    num = torch.full((b, heads, n), p + k, dtype=torch.int32, device=scores.device)
    num[:, :, :p] = n
    return idx, num


def fine_attention_tk(qt: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, idx: torch.Tensor, num: torch.Tensor,
                      plan: VsaPlan) -> torch.Tensor:
    """Block-sparse fine branch on padded head-major buffers [B, H, 64·n, D] → the same layout (pad rows unspecified)."""
    fwd = load_block_sparse_fwd()
    if fwd is None:
        raise RuntimeError(f"fastvideo-kernel block_sparse_fwd unavailable: {load_error()}")
    sizes = _static_lists(plan, qt.device)[2]
    if qt.shape[0] == 1:
        return fwd(qt, kt, vt, idx, num, sizes)[0]
    # The kernel refuses batch > 1 ("please set batch to 1"); batch-outermost slices are contiguous, so one call each.
    return torch.cat([fwd(qt[b : b + 1], kt[b : b + 1], vt[b : b + 1], idx[b : b + 1], num[b : b + 1], sizes)[0]
                      for b in range(qt.shape[0])])


def vsa_attention_tk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
                     plan: VsaPlan) -> torch.Tensor:
    """VSA-H3 attention with the compiled fine branch; same contract and glue as `vsa_attention_cuda`.

    q, k, v, gate: bf16 CUDA [B, S, heads, 128] in packed row order; returns the same shape and dtype.
    """
    _check_inputs(q, k, v, gate, plan)
    geo = tiled_geometry(plan, q.device)
    (qt, q_mean), (kt, k_mean), (vt, v_mean) = (tile_rows_bhsd(t, geo) for t in (q, k, v))
    scores = q_mean @ k_mean.transpose(-1, -2) / math.sqrt(q.shape[-1])  # fp32 [B, H, n, n]
    coarse = (torch.softmax(scores, dim=-1) @ v_mean).to(q.dtype)  # [B, H, n, D]
    idx, num = q2k_lists(scores, plan)
    fine = fine_attention_tk(qt, kt, vt, idx, num, plan)  # [B, H, 64·n, D]
    return combine(fine.transpose(1, 2), gate, coarse, geo)  # the combine kernel reads through strides


def vsa_attention_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor,
                       plan: VsaPlan) -> torch.Tensor:
    """The CUDA VSA path: the compiled kernel where `use_tk` allows, else FlexAttention."""
    if use_tk(q, plan):
        return vsa_attention_tk(q, k, v, gate, plan)
    return vsa_attention_cuda(q, k, v, gate, plan)
