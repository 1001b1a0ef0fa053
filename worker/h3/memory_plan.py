"""The memory plan of one worker: where the text encoder, DiT and VAEs live on each rank, the GPU memory left, and
the largest clip each configuration serves (`max_rows`, the largest packed row count S = L + 2A + video rows).

Pure arithmetic (stdlib, `core.geometry`, `worker.h3.config`): no torch, no GPU. The worker calls `plan()` at start
with the bytes of the modules it loaded and the device's memory, logs `format_plan()` and places the text encoder as
the plan says (worker/h3/text_placement.py); `h3batch memory-plan` prints it for the V2 33B shapes
(`python -m h3batch.worker.h3.memory_plan` is the same), and docs/performance.md holds that table (a test checks it).

Model of one rank's GPU memory (bytes allocated through torch; `reserve` covers the CUDA context and allocator slack
that `max_memory_allocated` does not see):

    between jobs   weights = DiT + VAEs (rank 0) + text stack when resident or kept + weights_overhead
    text_encode    weights + the text stack while it visits (offload: all of it; stream: its largest unit)
    denoise        weights + (a·S + b·S²)/N + sp_full_per_row·S (the last term for N > 1 only)
    decode         weights + decode_per_tile · tiles of one temporal chunk (rank 0; chunks stream, so it does not
                   grow with the clip's length)

A configuration serves S rows when every stage fits in `gpu_bytes - reserve`. The constants are calibrated on one
H200 (`H200_MEASURED`, docs/benchmarks.md "Memory per stage"): two clips at 1344x768, 4.4 s and 15 s, give two
(S, peak) points of the denoise stage, through which a·S + b·S² passes (b·S² is the VSA tile maps, n x n per head);
the decode of one 28-tile chunk gives decode_per_tile. `sp_full_per_row` (SP ranks keep the full-S embed output,
RoPE tables and the all-to-all buffers of their heads) is an estimate from the shapes, not measured: no multi-GPU
machine was lent. The activation constants are the V2 33B DiT's: for a smaller release (the tiny one) the plan takes
the real module bytes but over-states the activations, so its `max_rows` errs low. On the CPU the device memory is
the host's RAM.

Text-encoder placement with one GPU (`H3BATCH_TEXT_ENCODER_PLACEMENT`, default `auto`): `resident` when the
largest allowed clip at the release's default canvas (15 s, a prompt of `MAX_TEXT_ROWS` tokens) fits beside it,
else `offload` (host memory; copied to the GPU to encode; the copy stays after a job whose rows fit beside it,
`keep_encoder_max_rows`), else `stream` (one layer at a time). The request's own duration window (4-15 s) still
applies: `seconds_served` is the memory figure capped at 15 s; `seconds_by_memory` is uncapped.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from typing import Mapping

from h3batch.core.geometry import FPS, MAX_REQUESTED_FRAMES, RequestGeometry
from h3batch.worker.h3.config import H3_33B, H3Config, parameter_count

GIB = 1 << 30
MIB = 1 << 20

MAX_TEXT_ROWS = 1024
"""Longest prompt in tokens (worker/h3/text_encoder.py MAX_PROMPT_TOKENS): the text rows every plan reserves."""

PLACEMENTS = ("auto", "resident", "offload", "stream")
"""Values of H3BATCH_TEXT_ENCODER_PLACEMENT."""

H200_BYTES = 143_155 * MIB
"""Memory of one H200 as `torch.cuda.mem_get_info` reports its total on the lent machines: 139.8 GiB
(nvidia-smi says 143,771 MiB; the driver keeps the rest)."""

SEARCH_FRAMES = 60 * FPS
"""Longest clip the plan looks for when it reports what memory alone would allow (60 s)."""


# --- sizes of the parts ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PartSizes:
    """Bytes of each part as the GPU holds it."""

    dit: int  # the whole DiT (bf16 blocks, fp32 projections and heads)
    text_encoder: int  # the text stack that runs: embeddings + kept decoder layers (vision tower, LM head stay off)
    text_unit: int  # its largest unit that streams (one decoder layer or the embedding table)
    video_vae: int  # the served video decoder (fp16 decoder-only on CUDA)
    audio_vae: int  # the audio VAE (fp32)


def dit_bytes(config: H3Config) -> int:
    """Bytes of the DiT: bf16 except the fp32 patch projections, time MLP and output heads (worker/h3/model.py)."""
    c = config
    fp32 = ((c.video_patch_dim + 1) * c.hidden_size + (c.audio_latents_dim + 1) * c.hidden_size
            + (c.timestep_input_dim + 1) * c.time_embed_hidden_size + (c.time_embed_hidden_size + 1) * c.time_embed_dim
            + (c.hidden_size + 1) * c.video_patch_dim + (c.hidden_size + 1) * c.audio_latents_dim)
    return 2 * (parameter_count(c) - fp32) + 4 * fp32 + 4 * c.rope_inv_freq_len


def text_stack_bytes(text_config: Mapping, kept_layers: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """(bytes of embeddings + `kept_layers` decoder layers, bytes of the largest of those units) of a Qwen3-VL text
    config (`text_config` of the release's text_encoder/config.json)."""
    hidden, inner = text_config["hidden_size"], text_config["intermediate_size"]
    heads, kv_heads = text_config["num_attention_heads"], text_config["num_key_value_heads"]
    head_dim = text_config.get("head_dim") or hidden // heads
    bias = bool(text_config.get("attention_bias", False))
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    if bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    layer = attention + 3 * hidden * inner + 2 * hidden + 2 * head_dim  # + input/post norms, q/k norms
    embeddings = text_config["vocab_size"] * hidden
    return dtype_bytes * (embeddings + kept_layers * layer), dtype_bytes * max(embeddings, layer)


V2_TEXT_CONFIG = {"vocab_size": 151_936, "hidden_size": 5120, "intermediate_size": 25_600, "num_attention_heads": 64,
                  "num_key_value_heads": 8, "head_dim": 128, "attention_bias": False}
"""Qwen3-VL-32B's text stack, the FastH3 V2 text encoder (spec h3-model.md §8)."""
V2_TEXT_KEPT_LAYERS = 50
"""The release reads hidden_states[50]: decoder layers 0..49 are kept (text_encoder.py)."""

V2_VIDEO_DECODER_PARAMS = 2_423_531_096
"""diffusers 0.42.1 `AutoencoderKLMiniMaxH3()` (the release config) without encoder and quant_conv; 299,008 of them
stay fp32 (`_keep_in_fp32_modules`), the rest is served in fp16 (tests check both against the class)."""
V2_VIDEO_DECODER_FP32_PARAMS = 299_008
V2_AUDIO_VAE_PARAMS = 151_321_489
"""`AutoencoderKLMiniMaxH3Audio()`, fp32 as released."""


def v2_sizes() -> PartSizes:
    """The FastH3 V2 33B release as the worker holds it on CUDA."""
    text, unit = text_stack_bytes(V2_TEXT_CONFIG, V2_TEXT_KEPT_LAYERS)
    video = 2 * (V2_VIDEO_DECODER_PARAMS - V2_VIDEO_DECODER_FP32_PARAMS) + 4 * V2_VIDEO_DECODER_FP32_PARAMS
    return PartSizes(dit=dit_bytes(H3_33B.with_gates(True)), text_encoder=text, text_unit=unit, video_vae=video,
                     audio_vae=4 * V2_AUDIO_VAE_PARAMS)


# --- activation model -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibration:
    """Activation and workspace costs (bytes) of the model of the module docstring."""

    act_per_row: float  # denoise activations per packed row on one rank
    act_per_row_sq: float  # and per row squared: the VSA tile maps are n x n per head (n = S/64)
    sp_full_per_row: float  # per row of the full sequence that every SP rank keeps (N > 1 only; estimate)
    decode_per_tile: int  # decode workspace per 256-px tile of one temporal chunk
    text_workspace: int  # activations of encoding a MAX_TEXT_ROWS prompt
    weights_overhead: int  # tensors held between jobs outside module parameters (weight-norm weights, workspaces)
    reserve: int  # CUDA context + allocator slack outside max_memory_allocated
    source: str = ""  # where the numbers come from

    def activations(self, rows: int, ranks: int = 1) -> float:
        """Denoise activation bytes on one rank for S = `rows` (heads and rows are split over `ranks`)."""
        local = (self.act_per_row * rows + self.act_per_row_sq * rows * rows) / ranks
        return local + (self.sp_full_per_row * rows if ranks > 1 else 0.0)


@dataclass(frozen=True)
class Measurement:
    """One job of bench/memory.py: packed rows and GiB allocated before it and at the peak of each stage."""

    rows: int
    before_gib: float
    denoise_gib: float
    decode_gib: float
    tiles_per_chunk: int = 28


H200_MEASURED = (Measurement(32_740, 71.06, 76.90, 75.75), Measurement(109_190, 71.07, 91.99, 75.81))
"""bench/memory.py on one H200, 2026-12-02 01:13 UTC (docs/benchmarks.md, "Memory per stage"): 1344x768 at 4.4 s and
15 s, 128 prompt tokens, text encoder offloaded; DiT + VAEs as served were 70.40 GiB of parameters and 71.06 GiB
allocated (the difference is `weights_overhead`)."""
H200_MEASURED_PARTS_GIB = 70.40
H200_TEXT_WORKSPACE = GIB // 2
"""0.06 GiB measured for 128 tokens; 1024 tokens taken as 0.5 GiB (activations grow linearly in L at this length)."""


def calibrate(points: tuple[Measurement, Measurement], parts_gib: float, *, reserve: int = 4 * GIB,
              sp_full_per_row: float = 26 * 1024, text_workspace: int = H200_TEXT_WORKSPACE) -> Calibration:
    """The constants from two measured jobs: denoise activations a·S + b·S² through both points (the line through
    them has a negative intercept: the S² term is the VSA tile maps), decode workspace per tile from the larger
    decode, the overhead from what was allocated beyond the parameters."""
    (p, q) = points
    x1, x2 = (p.denoise_gib - p.before_gib) * GIB / p.rows, (q.denoise_gib - q.before_gib) * GIB / q.rows
    b = (x2 - x1) / (q.rows - p.rows)
    a = x1 - b * p.rows
    decode = max((m.decode_gib - m.before_gib) * GIB / m.tiles_per_chunk for m in points)
    overhead = int((p.before_gib - parts_gib) * GIB)
    return Calibration(act_per_row=a, act_per_row_sq=b, sp_full_per_row=sp_full_per_row, decode_per_tile=int(decode),
                       text_workspace=text_workspace, weights_overhead=overhead, reserve=reserve,
                       source="bench/memory.py on one H200, 2026-12-02 (docs/benchmarks.md)")


H200_CALIBRATION = calibrate(H200_MEASURED, H200_MEASURED_PARTS_GIB)
"""`reserve` 4 GiB: the CUDA context (about 0.5 GiB outside torch's allocator) and allocator slack; `sp_full_per_row`
26 KiB: under SP every rank builds the full-S embed output [S, 5376] bf16 (10.5 KiB/row) before keeping its rows,
the full-S RoPE tables (0.75 KiB/row) and, inside attention, q, k, v, G and the output for its 56/N heads at all S
rows (at N = 4: 5 x 14 x 128 x 2 B = 17.5 KiB/row), not measured."""


CPU_MEASURED = (Measurement(1391, 0.473, 0.659, 0.676, tiles_per_chunk=1),
                Measurement(7947, 0.676, 3.005, 1.179, tiles_per_chunk=3))
"""bench/memory_cpu.py on the 2-core, 24 GiB CPU machine, 2026-12-04 16:20 UTC (torch 2.13.0+cpu): the tiny release
(4 heads, hidden 96) at 256x128 4 s and 512x256 8 s, a 7-token prompt, resident-set figures (VmRSS before the job,
VmHWM of the denoise and of the decode + mux, GiB). The CPU attention is the dense-mask reference
(worker/h3/vsa.py), whose [B, heads, S, S] fp32 logits, mask and softmax make the S² term: 26.7 B per row² for 4
heads."""
CPU_MEASURED_PARTS_GIB = 0.004
"""DiT + VAEs of the tiny release as loaded on the CPU (module bytes), GiB: the rest of `before` is the process's
own overhead (Python, torch's libraries, the text encoder)."""
CPU_MEASURED_HEADS = 4
CPU_MEASURED_HIDDEN = 96
CPU_RESERVE = 2 * GIB
"""Host memory kept for everything beside the worker (the OS, Redis, the API on a one-machine stack)."""


def cpu_calibration(heads: int = CPU_MEASURED_HEADS, hidden: int = CPU_MEASURED_HIDDEN) -> Calibration:
    """The CPU's activation costs, fitted through `CPU_MEASURED` as `calibrate` fits the H200's, for a DiT of
    `heads` attention heads and width `hidden`: the S² term (the reference attention's [heads, S, S] tensors) scales
    with the heads, the per-row term with the width. For the measured release this is the measurement itself; for
    another one the scaling is an estimate from the shapes, not measured."""
    cal = calibrate(CPU_MEASURED, CPU_MEASURED_PARTS_GIB, reserve=CPU_RESERVE, sp_full_per_row=0.0,
                    text_workspace=0)
    return replace(cal, act_per_row=cal.act_per_row * max(1.0, hidden / CPU_MEASURED_HIDDEN),
                   act_per_row_sq=cal.act_per_row_sq * heads / CPU_MEASURED_HEADS,
                   source="bench/memory_cpu.py on the CPU, 2026-12-04 (tiny release; heads and width scaled)")


CPU_CALIBRATION = cpu_calibration()
"""The tiny release's own: what a CPU worker on it plans with (its host RAM as the device memory)."""


# --- geometry helpers -----------------------------------------------------------------------------------------------

def tiles_per_side(length: int, tile: int = 256, min_overlap: int = 64) -> int:
    """Tiles of the video VAE's spatial tiling over `length` pixels (diffusers' `_split_tiles` count)."""
    if tile >= length:
        return 1
    count = math.ceil(length / tile)
    while tile * count - min_overlap * (count - 1) < length:
        count += 1
    return count


def tiles_per_chunk(width: int, height: int) -> int:
    return tiles_per_side(width) * tiles_per_side(height)


def clip_rows(width: int, height: int, seconds: float, text_rows: int = MAX_TEXT_ROWS) -> int:
    """Packed rows S of a clip (any length: the duration window is not applied)."""
    return RequestGeometry(width, height, seconds, check_duration_window=False).sequence_rows(text_rows)


def longest_clip(width: int, height: int, max_rows: int, *, text_rows: int = MAX_TEXT_ROWS,
                 max_frames: int = SEARCH_FRAMES) -> float:
    """Longest duration (seconds, a whole number of frames at 24 fps, up to `max_frames`) whose rows fit; 0.0 when
    not even one frame does."""
    best = 0
    low, high = 1, max_frames  # rows grow with the frame count: bisect
    while low <= high:
        mid = (low + high) // 2
        if clip_rows(width, height, mid / FPS, text_rows) <= max_rows:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best / FPS


# --- the plan ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankPlan:
    """One rank: where each part lives, bytes, stage peaks at `max_rows`, the room left."""

    rank: int
    dit: str  # "gpu"
    text_encoder: str  # "gpu" (resident), "host, visits to encode" (offload), "host, streamed" (stream), "-"
    vaes: str  # "gpu" or "-"
    weights: int  # bytes on the GPU between jobs
    text_visit: int  # extra bytes while the prompt is encoded (offload/stream)
    decode_workspace: int  # rank 0 only
    headroom: int  # gpu_bytes - reserve - weights: what activations may use
    max_rows: int  # largest S every stage of this rank serves


@dataclass(frozen=True)
class MemoryPlan:
    gpu_bytes: int
    ranks: int
    canvas: tuple[int, int]
    placement: str  # the text-encoder placement chosen (never "auto")
    requested: str  # what was asked for
    sizes: PartSizes
    calibration: Calibration
    per_rank: tuple[RankPlan, ...]
    keep_encoder_max_rows: int  # offload: rows that fit with the encoder kept on the GPU (0 = never keep)
    text_rows: int = MAX_TEXT_ROWS
    notes: tuple[str, ...] = field(default=())

    @property
    def max_rows(self) -> int:
        """The largest packed row count S this worker serves (the smallest over its ranks)."""
        return min(rank.max_rows for rank in self.per_rank)

    @property
    def seconds_by_memory(self) -> float:
        """Longest clip at the default canvas that memory allows (up to 60 s; prompt of `text_rows` tokens)."""
        return longest_clip(*self.canvas, self.max_rows, text_rows=self.text_rows)

    @property
    def seconds_served(self) -> float:
        """`seconds_by_memory` within the request window (at most 15 s)."""
        return min(self.seconds_by_memory, MAX_REQUESTED_FRAMES / FPS)

    def as_json(self) -> dict:
        return {"gpu_GiB": round(self.gpu_bytes / GIB, 2), "ranks": self.ranks, "canvas": list(self.canvas),
                "text_encoder_placement": self.placement, "max_rows": self.max_rows,
                "seconds_served": round(self.seconds_served, 3), "seconds_by_memory": round(self.seconds_by_memory, 3),
                "keep_encoder_max_rows": self.keep_encoder_max_rows,
                "per_rank": [{**rank.__dict__, **{k: round(getattr(rank, k) / GIB, 2) for k in
                                                  ("weights", "text_visit", "decode_workspace", "headroom")}}
                             for rank in self.per_rank]}


def _rank_max_rows(budget: int, weights: int, extra_stage_peaks: tuple[int, ...], cal: Calibration,
                   ranks: int) -> int:
    """Largest S with weights + denoise activations ≤ budget; 0 when another stage (the text visit, the decode)
    does not fit at all."""
    if any(weights + peak > budget for peak in extra_stage_peaks):
        return 0
    room = budget - weights - cal.act_per_row  # one row of slack for ⌈S/N⌉
    if room <= 0:
        return 0
    quad = cal.act_per_row_sq / ranks
    lin = cal.act_per_row / ranks + (cal.sp_full_per_row if ranks > 1 else 0.0)
    rows = (-lin + math.sqrt(lin * lin + 4 * quad * room)) / (2 * quad) if quad > 0 else room / lin
    rows = int(rows)
    while rows > 0 and cal.activations(rows, ranks) > room:  # float rounding of the root
        rows -= 1
    return rows


def _rank0(sizes: PartSizes, cal: Calibration, budget: int, ranks: int, canvas: tuple[int, int],
           placement: str) -> RankPlan:
    decode = cal.decode_per_tile * tiles_per_chunk(*canvas)
    weights = sizes.dit + sizes.video_vae + sizes.audio_vae + cal.weights_overhead
    if placement == "resident":
        weights += sizes.text_encoder
        visit, where = cal.text_workspace, "gpu"
    elif placement == "offload":
        visit, where = sizes.text_encoder + cal.text_workspace, "host; visits the GPU to encode"
    else:
        visit, where = sizes.text_unit + cal.text_workspace, "host; streamed a layer at a time"
    max_rows = _rank_max_rows(budget, weights, (visit, decode), cal, ranks)
    return RankPlan(0, "gpu", where, "gpu", weights, visit if placement != "resident" else 0, decode,
                    budget - weights, max_rows)


def plan(sizes: PartSizes, *, gpu_bytes: int, ranks: int = 1, canvas: tuple[int, int] = (1344, 768),
         placement: str = "auto", calibration: Calibration = H200_CALIBRATION,
         text_rows: int = MAX_TEXT_ROWS) -> MemoryPlan:
    """The plan for `ranks` GPUs of `gpu_bytes` each (rank 0 holds the text encoder and the VAEs, as
    worker/rank_group.py places them); `placement` is the text encoder's (PLACEMENTS)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"text encoder placement: expected one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks: expected a positive integer, got {ranks!r}")
    cal = calibration
    budget = gpu_bytes - cal.reserve
    target = clip_rows(*canvas, MAX_REQUESTED_FRAMES / FPS, text_rows)  # the longest clip a request may ask for
    notes = []
    if placement == "auto":
        chosen = "stream"
        for mode in ("resident", "offload"):
            if _rank0(sizes, cal, budget, ranks, canvas, mode).max_rows >= target:
                chosen = mode
                break
        notes.append(f"auto: {chosen} (the 15 s clip at {canvas[0]}x{canvas[1]} is {target} rows)")
    else:
        chosen = placement
    rank0 = _rank0(sizes, cal, budget, ranks, canvas, chosen)
    others = []
    for rank in range(1, ranks):
        weights = sizes.dit + cal.weights_overhead
        others.append(RankPlan(rank, "gpu", "-", "-", weights, 0, 0, budget - weights,
                               _rank_max_rows(budget, weights, (), cal, ranks)))
    keep = 0
    if chosen == "offload" and placement == "auto":
        keep = _rank0(sizes, cal, budget, ranks, canvas, "resident").max_rows
    return MemoryPlan(gpu_bytes, ranks, tuple(canvas), chosen, placement, sizes, cal, (rank0, *others), keep,
                      text_rows, tuple(notes))


# --- output -----------------------------------------------------------------------------------------------------------

def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def format_plan(p: MemoryPlan) -> str:
    """A Markdown table, one row per rank (identical DiT-only ranks folded into one row)."""
    lines = [f"{p.ranks} × {_gib(p.gpu_bytes)} GiB, text encoder `{p.placement}`"
             f"{' (asked: ' + p.requested + ')' if p.requested != p.placement else ''}: "
             f"max_rows {p.max_rows:,}, longest clip at {p.canvas[0]}x{p.canvas[1]} "
             f"{p.seconds_served:.2f} s served ({_seconds_text(p.seconds_by_memory)} by memory)"]
    if p.keep_encoder_max_rows:
        lines.append(f"the encoder stays on the GPU after a job of at most {p.keep_encoder_max_rows:,} rows "
                     f"({_seconds_text(longest_clip(*p.canvas, p.keep_encoder_max_rows, text_rows=p.text_rows))} "
                     "at the default canvas)")
    lines += ["", "| rank | DiT | text encoder | VAEs | weights GiB | while encoding +GiB | decode GiB | "
              "headroom GiB | max_rows |", "|---|---|---|---|---|---|---|---|---|"]
    rows = [p.per_rank[0]]
    if len(p.per_rank) > 1:
        rows.append(p.per_rank[1])
    for rank in rows:
        name = "0" if rank.rank == 0 else (f"1..{p.ranks - 1}" if p.ranks > 2 else "1")
        lines.append(f"| {name} | {rank.dit} {_gib(p.sizes.dit)} | {rank.text_encoder}"
                     f"{' ' + _gib(p.sizes.text_encoder) if rank.text_encoder != '-' else ''} | {rank.vaes}"
                     f"{' ' + _gib(p.sizes.video_vae + p.sizes.audio_vae) if rank.vaes != '-' else ''} | "
                     f"{_gib(rank.weights)} | {_gib(rank.text_visit) if rank.text_visit else '-'} | "
                     f"{_gib(rank.decode_workspace) if rank.decode_workspace else '-'} | {_gib(rank.headroom)} | "
                     f"{rank.max_rows:,} |")
    return "\n".join(lines)


def _seconds_text(seconds: float) -> str:
    return f"≥ {SEARCH_FRAMES // FPS} s" if seconds >= SEARCH_FRAMES / FPS else f"{seconds:.2f} s"


def v2_table(gpu_bytes: int = H200_BYTES, calibration: Calibration = H200_CALIBRATION) -> str:
    """The docs/performance.md table: the V2 33B shapes on H200s at ranks 1 and 4, auto placement, and one GPU
    with the encoder forced resident (what it would cost)."""
    sizes = v2_sizes()
    cal = calibration
    parts = [f"Parts (bytes on the GPU): DiT {_gib(sizes.dit)} GiB, text stack {_gib(sizes.text_encoder)} GiB "
             f"(largest streamed unit {_gib(sizes.text_unit)} GiB), video decoder fp16 {_gib(sizes.video_vae)} GiB, "
             f"audio VAE {_gib(sizes.audio_vae)} GiB, other tensors {_gib(cal.weights_overhead)} GiB. Denoise "
             f"activations {cal.act_per_row / 1024:.1f} KiB per row + {cal.act_per_row_sq:.4f} B per row² (one "
             f"rank), + {cal.sp_full_per_row / 1024:.0f} KiB per row of the full sequence per SP rank; decode "
             f"{cal.decode_per_tile / MIB:.0f} MiB per tile of a chunk; reserve {_gib(cal.reserve)} GiB. "
             f"Calibration: {cal.source}."]
    for ranks, placement in ((1, "auto"), (1, "resident"), (4, "auto")):
        parts.append(format_plan(plan(sizes, gpu_bytes=gpu_bytes, ranks=ranks, placement=placement,
                                      calibration=cal)))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """`h3batch memory-plan`: print the plan of the V2 33B shapes for the given GPUs."""
    from h3batch.cli_args import OneLineArgumentParser

    parser = OneLineArgumentParser(prog="h3batch memory-plan", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4], help="GPUs per worker (default: 1 4)")
    parser.add_argument("--gpu-gib", type=float, default=H200_BYTES / GIB, help="memory per GPU (default: H200)")
    parser.add_argument("--placement", choices=PLACEMENTS, default="auto", help="text encoder placement")
    parser.add_argument("--size", default="1344x768", help="canvas WxH (default 1344x768)")
    parser.add_argument("--docs", action="store_true", help="print the docs/performance.md table")
    args = parser.parse_args(argv)
    if args.docs:
        print(v2_table())
        return 0
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
        RequestGeometry(width, height, 4.0)
    except ValueError as err:
        parser.error(f"--size: expected WxH of a canvas FastH3 V2 renders, got {args.size!r} ({err})")
    if any(r < 1 for r in args.ranks) or not 1 <= args.gpu_gib < 1e6:
        parser.error("--ranks: expected positive integers; --gpu-gib: expected a size in GiB")
    for ranks in args.ranks:
        print(format_plan(plan(v2_sizes(), gpu_bytes=int(args.gpu_gib * GIB), ranks=ranks, canvas=(width, height),
                               placement=args.placement)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

