"""The whole job at real size on one GPU through the real `Pipeline`, random weights, no checkpoint (issue P2).

Builds the FastH3 V2 models at their real shapes straight on the device with random weights: the 35.0 B-parameter
DiT (bf16, VSA gates), the Qwen3-VL text stack at real width (`--text-layers` of its 51 kept layers; fewer leave
room for both video-VAE copies), the default-config video VAE (2.60 B parameters, fp32 as released) and the audio
VAE. `--tiny` builds the CPU test configs instead (worker/h3/tiny_configs.py, config T2) so the same code runs in
seconds on a CPU.

One run measures, stage by stage (text_encode, denoise, decode, mux, whole job), with peak memory per stage:

* ours:      `WriteOptions()` (all tiles of a temporal chunk per decoder call, fp16 decoder-only copy with compiled
             ViT blocks on CUDA, chunks streamed to a libx264 `veryfast` encode on a thread), after `warm_up` (timed
             apart, as a worker does before it reports ready); `--jobs N` back-to-back jobs on the one resident
             pipeline, with the GPU idle time between them.
* baseline:  (`--baseline`) today's path, `WriteOptions.legacy()`: diffusers' per-tile decode with the fp32 VAE
             under fp16 autocast, then libx264 `medium` on the whole clip, no warm-up; two jobs (the second is the
             steady-state figure; the first is reported apart).
* fp8:       (`--precisions bf16,fp8`) after ours and the baseline, the same DiT put in H3BATCH_PRECISION=fp8 in
             place (worker/h3/precision.py), its own warm-up and jobs; its final latents (8 steps, same seed) and
             decoded frames against ours' bf16 ones: relative Frobenius error, max abs, PSNR of frames.
* warm-up:   `H3BATCH_COMPILE_CACHE` (env) points the Inductor/Triton caches at a directory first; `--warm-only`
             builds, warms up once, records the seconds and stops (run it twice on one cache: fresh, then restart).
* decode:    (`--decode-variants`) the decode alone on the same latents: per-tile fp32 weights, per-tile fp16,
             batched fp16 eager, batched fp16 compiled at several tile batches (and CUDA graphs), each against the
             fp32-weight decode (PSNR of frames), plus the audio waveform's max abs difference.

Usage (GPU):  python bench/e2e.py --baseline --jobs 3 --precisions bf16,fp8 --out $OUT/e2e.json
      (CPU):  python bench/e2e.py --tiny --baseline --jobs 2 --out /tmp/e2e.json
Prints a table last and writes everything to --out as it arrives.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

from h3batch.core.geometry import TINY_CANVAS, V2_CANVAS
from h3batch.worker import compile_cache
from h3batch.worker import pipeline as pipeline_module
from h3batch.worker.h3 import contract, decode, packing
from h3batch.worker.h3.config import T2, H3Config
from h3batch.worker.h3.model import H3Transformer
from h3batch.worker.h3.precision import apply_precision
from h3batch.worker.h3.text_encoder import TextEncoder
from h3batch.worker.pipeline import Pipeline, RenderRequest, WriteOptions

STAGES = ("text_encode", "denoise", "decode", "mux")
PROMPT = "A red fox runs across a snowy field at dawn, its breath steaming in the cold air."


# Models with random weights ------------------------------------------------------------------------------------------


class FixedLengthTokenizer:
    """Stands in for the Qwen tokenizer: the prompt's bytes, repeated to exactly `length` ids below `vocab`."""

    def __init__(self, length: int, vocab: int):
        self.length, self.vocab = length, vocab

    def __call__(self, prompt: str, add_special_tokens: bool = False) -> dict:
        data = prompt.encode() or b" "
        return {"input_ids": [(data[i % len(data)] * 31 + i) % self.vocab for i in range(self.length)]}


def fill_random_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Matrices N(0, 1/fan_in), 1-D weights (norm gains) 1, biases 0: finite activations through deep stacks."""
    generator = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if parameter.ndim >= 2:
                fan_in = math.prod(parameter.shape[1:])
                parameter.normal_(0.0, fan_in**-0.5, generator=generator)
            elif name.endswith("bias"):
                parameter.zero_()
            else:
                parameter.fill_(1.0)
    return module


def build_dit(tiny: bool, device: torch.device) -> H3Transformer:
    from h3batch.worker.h3.loader import materialize

    config = (T2 if tiny else H3Config()).with_gates(True)
    with torch.device("meta"):
        model = H3Transformer(config, dtype=torch.bfloat16)
    return fill_random_(materialize(model, device), seed=1).eval()


def build_text_encoder(tiny: bool, layers: int, tokens: int, device: torch.device) -> TextEncoder:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from h3batch.worker.h3.tiny_configs import TINY_TEXT_ENCODER, TINY_TEXT_HIDDEN_LAYER

    if tiny:
        config, hidden_layer = Qwen3VLConfig(**TINY_TEXT_ENCODER), TINY_TEXT_HIDDEN_LAYER
    else:  # Qwen3-VL-32B's text stack (the release conditions on hidden_states[50]: layers 0..50 kept)
        text = dict(TINY_TEXT_ENCODER["text_config"], vocab_size=151_936, hidden_size=5120, intermediate_size=25_600,
                    num_hidden_layers=layers, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                    rope_parameters=dict(TINY_TEXT_ENCODER["text_config"]["rope_parameters"],
                                         mrope_section=[24, 20, 20]))
        vision = dict(TINY_TEXT_ENCODER["vision_config"], out_hidden_size=5120)
        config = Qwen3VLConfig(**dict(TINY_TEXT_ENCODER, text_config=text, vision_config=vision,
                                      vision_start_token_id=151_652, vision_end_token_id=151_653,
                                      image_token_id=151_655, video_token_id=151_656))
        hidden_layer = layers - 1
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    vocab = config.text_config.vocab_size
    return TextEncoder(model.eval(), FixedLengthTokenizer(tokens, vocab - 8), hidden_layer)


def build_vaes(tiny: bool, device: torch.device):
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    from h3batch.worker.h3.tiny_configs import TINY_AUDIO_VAE, TINY_VIDEO_VAE

    with torch.device(device):
        video = AutoencoderKLMiniMaxH3(**(TINY_VIDEO_VAE if tiny else {})).eval()
        # The class default has no latent statistics (the release's config.json carries them): identity ones.
        audio = AutoencoderKLMiniMaxH3Audio(**(TINY_AUDIO_VAE if tiny else {"latents_mean": [0.0] * 32,
                                                                            "latents_std": [1.0] * 32})).eval()
    generator = torch.Generator(device=device).manual_seed(2)
    with torch.no_grad():  # the ViT blocks start as identities (zero residual scales): give them weight
        for name, parameter in video.decoder.named_parameters():
            if name.endswith(("scale1", "scale2")):
                parameter.copy_(0.2 + 0.05 * torch.randn(parameter.shape, generator=generator, device=device))
            elif name == "register_tokens":
                parameter.normal_(0.0, 0.02, generator=generator)
    return video, audio


def bench_info(tiny: bool) -> SimpleNamespace:
    """What `Pipeline` reads from a validated release, for a model that has none."""
    return SimpleNamespace(path=Path(tempfile.gettempdir()), model_id="bench/random" + ("-tiny" if tiny else ""),
                           contract_hash="0" * 64, entry=SimpleNamespace(contract=SimpleNamespace(vsa_sparsity=0.8)),
                           canvas=TINY_CANVAS if tiny else V2_CANVAS, kind=contract.ReleaseKind.V2,
                           tasks=contract.V2_TASKS, native=None, vsa_sparsity=0.8)


# Timing --------------------------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StageMemory:
    """Peak allocated GPU memory per stage, from the pipeline's stage-entry progress calls."""

    def __init__(self, device: torch.device):
        self.device, self.peaks, self.stage = device, {}, None

    def enter(self, stage: str) -> None:
        if self.device.type != "cuda":
            return
        if self.stage is not None:
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0.0), torch.cuda.max_memory_allocated() / 2**30)
        torch.cuda.reset_peak_memory_stats()
        self.stage = stage

    def progress(self, stage: str, step: int, total: int) -> None:
        if stage == "denoise" and step == 1:
            self.enter("denoise")  # text_encode ends where the first step's progress arrives, after step 1
        elif stage in ("text_encode", "decode", "mux"):
            self.enter(stage)

    def close(self) -> dict:
        self.enter("_end")
        return {k: round(v, 2) for k, v in self.peaks.items()}


def run_jobs(pipe: Pipeline, req: RenderRequest, jobs: int, out_dir: Path, tag: str):
    """`jobs` renders back to back; per job: stage seconds, whole job, peak memory, GPU idle before it. Returns the
    per-job records and the last job's latents (for the decode variants)."""
    results, previous_gpu_end = [], None
    for k in range(jobs):
        memory = StageMemory(pipe.device)
        t_start = time.perf_counter()
        idle = None if previous_gpu_end is None else t_start - previous_gpu_end
        clip = pipe.denoise(req, on_progress=memory.progress)
        t_write = time.perf_counter()
        result = pipe.write(clip, out_dir / f"{tag}-{k}.mp4", on_progress=memory.progress)
        t_end = time.perf_counter()
        # The GPU's last work of this job is the decode; the mux tail after it is CPU only.
        previous_gpu_end = t_write + result.timings["decode"]
        entry = {"job": k, **{s: round(result.timings[s], 4) for s in STAGES}, "whole job": round(t_end - t_start, 4),
                 "peak_GiB": memory.close(), "gpu_idle_before_s": None if idle is None else round(idle, 4),
                 "mp4_bytes": (out_dir / f"{tag}-{k}.mp4").stat().st_size, "frames": result.frames}
        results.append(entry)
        print(tag, json.dumps(entry), flush=True)
    # The idle before job k+1 also includes the mux tail of job k, which ran after the GPU's last decode kernel.
    return results, clip


# Decode variants -----------------------------------------------------------------------------------------------------


def psnr_db(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def time_decode(vae, latents, tile_batch, device, reps: int) -> tuple[float, float, torch.Tensor]:
    """(first-call s, median s over reps, frames on CPU) of a decode alone."""

    def once():
        if tile_batch is None:
            return decode.decode_video(vae, latents)
        return torch.cat([f.cpu() for f in decode.iter_video_frames(vae, latents, tile_batch=tile_batch)])

    sync(device)
    t0 = time.perf_counter()
    frames = once()
    sync(device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        sync(device)
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times) if times else first, frames


def decode_variants(res: dict, fp32_vae, served_vae, audio_vae, clip, device, tiles_per_chunk: int, dump,
                    out_dir: Path, reps: int) -> None:
    """The decode alone on one clip's latents, in several forms, each against the fp32-weight per-tile decode."""
    geo = clip.geometry
    latents = packing.unpatchify_video(clip.video, geo.latent_frames, geo.latent_height, geo.latent_width)
    variants = res.setdefault("decode_variants", {})
    _, base_s, reference = time_decode(fp32_vae, latents, None, device, reps=1)
    variants["per-tile fp32 weights (today)"] = {"s": round(base_s, 4), "psnr_db": math.inf}
    dump()
    # The audio VAE runs in fp32 in both paths (bf16 decodes are ~20 dB quieter): the same call twice.
    waves = [decode.decode_audio(audio_vae, clip.audio[0]) for _ in range(2)]
    res["audio_waveform_max_abs_diff"] = float((waves[0] - waves[1]).abs().max())

    cuda = device.type == "cuda"
    # (name, tile batch, compile, compile mode); None as the compile flag reuses the served (warm) decoder.
    plans = [("batched (chunk) fp16 eager", 0, False, None)]
    plans += [("batched (chunk) fp16 compiled (served)", 0, None, None),
              ("batched (chunk) fp16 compiled, CUDA graphs", 0, True, "reduce-overhead"),
              ("batched 2 chunks fp16 compiled", 2 * tiles_per_chunk, True, None)] if cuda else \
        [("per-tile fp16 weights", 1, False, None)]
    for name, tile_batch, compiled, mode in plans:
        entry = variants.setdefault(name, {"tile_batch": tile_batch})
        try:
            vae = served_vae if compiled is None else decode.prepare_video_decoder(
                fp32_vae, torch.float16 if cuda else None, compile_blocks=compiled, compile_mode=mode,
                copy_module=True)
            first, seconds, frames = time_decode(vae, latents, tile_batch, device, reps=reps)
            entry.update(first_call_s=round(first, 3), s=round(seconds, 4),
                         psnr_db=round(psnr_db(frames, reference), 2),
                         max_abs_levels=int((frames.int() - reference.int()).abs().max()),
                         speedup_vs_today=round(base_s / seconds, 2))
            if compiled is None and cuda:
                entry["profile"] = profile_decode(vae, latents, out_dir)
            del vae
        except Exception as exc:  # noqa: BLE001 - one failed variant is a result, not the end of the run
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            traceback.print_exc()
        if cuda:
            torch.cuda.empty_cache()
        print("decode", name, json.dumps(entry), flush=True)
        dump()


def profile_decode(vae, latents, out_dir: Path) -> dict:
    """Top CUDA kernels of one compiled decode, the GEMM share, and the whole table to a text file."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in decode.iter_video_frames(vae, latents):
            pass
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    (out_dir / "decode_profile.txt").write_text(prof.key_averages().table(sort_by="self_cuda_time_total",
                                                                          row_limit=30))
    gemm = sum(e.self_device_time_total for e in events
               if any(s in e.key.lower() for s in ("gemm", "nvjet", "cutlass", "xmma")))
    attention = sum(e.self_device_time_total for e in events
                    if any(s in e.key.lower() for s in ("flash", "fmha", "attention", "sdpa")))
    return {"gpu_s": round(total / 1e6, 3), "gemm_s": round(gemm / 1e6, 3), "attention_s": round(attention / 1e6, 3),
            "top": [{"kernel": e.key[:90], "ms": round(e.self_device_time_total / 1e3, 1), "calls": e.count}
                    for e in events[:8]]}


# Main ----------------------------------------------------------------------------------------------------------------


def environment(device: torch.device) -> dict:
    info = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "argv": sys.argv}
    for name in ("diffusers", "transformers", "av", "triton"):
        try:
            info[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - record, do not stop
            info[name] = f"unavailable: {type(exc).__name__}"
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    try:
        info["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        info["git"] = None
    return info


def summarize(jobs: list[dict]) -> dict:
    """Median over the jobs given, per stage and whole job."""
    return {k: round(statistics.median(j[k] for j in jobs), 4) for k in (*STAGES, "whole job")}


def table(res: dict) -> str:
    """Stage rows; columns baseline, ours bf16, ours fp8 (seconds, steady medians) and the ratios to the baseline."""
    base = res.get("baseline", {}).get("steady") or {}
    bf16 = res.get("ours", {}).get("steady") or {}
    fp8 = res.get("fp8", {}).get("steady") or {}

    def cell(v):
        return "-" if v is None else f"{v:.3f}"

    def ratio(b, o):
        return f"{b / o:.2f}x" if b and o else "-"

    lines = ["| stage | baseline s | bf16 s | fp8 s | bf16 vs baseline | fp8 vs baseline |", "|---|---|---|---|---|---|"]
    for stage in (*STAGES, "whole job"):
        b, o, f = base.get(stage), bf16.get(stage), fp8.get(stage)
        lines.append(f"| `{stage}` | {cell(b)} | {cell(o)} | {cell(f)} | {ratio(b, o)} | {ratio(b, f)} |")
    return "\n".join(lines)


def served_frames(vae, clip) -> torch.Tensor:
    """The served decode of a clip's latents (all tiles of a chunk per call), uint8 frames on the CPU."""
    geo = clip.geometry
    video = clip.video.to(next(vae.parameters()).device)
    latents = packing.unpatchify_video(video, geo.latent_frames, geo.latent_height, geo.latent_width)
    return torch.cat([f.cpu() for f in decode.iter_video_frames(vae, latents, tile_batch=0)])


def rel_fro(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def precision_error(clip, reference, vae, reference_frames) -> dict:
    """Final latents and decoded frames of `clip` against the bf16 `reference` clip (same request and seed)."""
    frames = served_frames(vae, clip)
    return {"video_latents_rel_fro": rel_fro(clip.video, reference.video),
            "audio_latents_rel_fro": rel_fro(clip.audio, reference.audio),
            "video_latents_max_abs": float((clip.video.float().cpu() - reference.video.float().cpu()).abs().max()),
            "frames_psnr_db": round(psnr_db(frames, reference_frames), 2),
            "frames_max_abs_levels": int((frames.int() - reference_frames.int()).abs().max()),
            "frames_mean_abs_levels": float((frames.float() - reference_frames.float()).abs().mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU test configs instead of the real shapes")
    parser.add_argument("--baseline", action="store_true", help="also run today's path in the same process")
    parser.add_argument("--jobs", type=int, default=1, help="back-to-back jobs of ours on one resident pipeline")
    parser.add_argument("--baseline-jobs", type=int, default=2, help="baseline jobs (steady = all but the first)")
    parser.add_argument("--seconds", type=float, default=None, help="clip length (default 4.4 real, 4.0 tiny)")
    parser.add_argument("--size", default=None, help="WxH (default 1344x768 real, 256x128 tiny)")
    parser.add_argument("--ranks", type=int, default=1, help="GPUs of the node; only 1 is implemented here")
    parser.add_argument("--text-tokens", type=int, default=128)
    parser.add_argument("--text-layers", type=int, default=51, help="real width text stack depth (release: 51)")
    parser.add_argument("--tile-batch", type=int, default=0, help="ours: tiles per decoder call (0 = a chunk)")
    parser.add_argument("--no-compile", action="store_true", help="ours: eager decoder")
    parser.add_argument("--decode-variants", action="store_true", help="time the decode alone in several forms")
    parser.add_argument("--variant-reps", type=int, default=2)
    parser.add_argument("--precisions", default="bf16",
                        help="ours' DiT precisions, in order (bf16 first): bf16 or bf16,fp8")
    parser.add_argument("--warm-only", action="store_true", help="build, warm up once, record, stop")
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    args = parser.parse_args()
    if args.ranks != 1:
        parser.error("--ranks > 1 (tiles split across ranks) is not implemented yet; run with --ranks 1")

    device = torch.device("cpu") if args.tiny or not torch.cuda.is_available() else torch.device("cuda")
    seconds = args.seconds or (4.0 if args.tiny else 4.4)
    width, height = map(int, (args.size or ("256x128" if args.tiny else "1344x768")).lower().split("x"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"env": environment(device), "config": {"tiny": args.tiny, "size": f"{width}x{height}",
                                                        "seconds": seconds, "text_tokens": args.text_tokens,
                                                        "text_layers": None if args.tiny else args.text_layers,
                                                        "tile_batch": args.tile_batch,
                                                        "compile": not args.no_compile and device.type == "cuda"}}

    def dump() -> None:
        args.out.write_text(json.dumps(res, indent=1, default=str))

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not precisions or precisions[0] != "bf16" or not set(precisions) <= {"bf16", "fp8"}:
        parser.error(f"--precisions: bf16 first, then optionally fp8; got {args.precisions!r}")
    res["compile_cache"] = compile_cache.configure(os.environ.get("H3BATCH_COMPILE_CACHE") or None)
    t0 = time.perf_counter()
    dit = build_dit(args.tiny, device)
    text = build_text_encoder(args.tiny, args.text_layers, args.text_tokens, device)
    fp32_vae, audio_vae = build_vaes(args.tiny, device)
    sync(device)
    res["build_s"] = round(time.perf_counter() - t0, 1)
    if device.type == "cuda":
        res["weights_GiB"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    res["params_B"] = {"dit": sum(p.numel() for p in dit.parameters()) / 1e9,
                       "video_vae": sum(p.numel() for p in fp32_vae.parameters()) / 1e9,
                       "text_encoder": sum(p.numel() for p in text.model.parameters()) / 1e9}
    dump()
    info = bench_info(args.tiny)
    req = RenderRequest(prompt=PROMPT, seconds=seconds, width=width, height=height, seed=7)
    out_dir = Path(tempfile.mkdtemp(prefix="e2e-"))
    tiles_per_chunk = sum(len(r) for r in decode._tile_layout(fp32_vae, height // 16, width // 16)[0])
    res["config"]["tiles_per_chunk"] = tiles_per_chunk

    # Ours first, in a fresh process: its first job shows whether the warm-up left any compile for a job.
    compile_blocks = not args.no_compile and device.type == "cuda"
    fp16_vae = decode.prepare_video_decoder(fp32_vae, torch.float16 if device.type == "cuda" else None,
                                            compile_blocks=compile_blocks, copy_module=True)
    options = WriteOptions(tile_batch=args.tile_batch)
    ours = Pipeline(info, dit, text, fp16_vae, audio_vae, device, write_options=options)
    res["ours"] = {"warm_up_s": round(ours.warm_up([req]), 2)}
    dump()
    print("warm-up", res["ours"]["warm_up_s"], "s", flush=True)
    if args.warm_only:
        return
    jobs, clip = run_jobs(ours, req, max(1, args.jobs), out_dir, "ours")
    bf16_clip = SimpleNamespace(video=clip.video.cpu(), audio=clip.audio.cpu(), geometry=clip.geometry)
    res["ours"].update(jobs=jobs, steady=summarize(jobs[1:] or jobs))
    if len(jobs) > 1:
        later = statistics.median(j["whole job"] for j in jobs[1:])
        res["ours"]["first_job_vs_later"] = round(jobs[0]["whole job"] / later - 1.0, 4)
        res["ours"]["gpu_idle_between_jobs_s"] = [j["gpu_idle_before_s"] for j in jobs[1:]]
    dump()

    if args.baseline:
        try:
            legacy = Pipeline(info, dit, text, fp32_vae, audio_vae, device, write_options=WriteOptions.legacy())
            jobs, _ = run_jobs(legacy, req, max(1, args.baseline_jobs), out_dir, "baseline")
            res["baseline"] = {"jobs": jobs, "first_job": jobs[0], "steady": summarize(jobs[1:] or jobs)}
        except Exception as exc:  # noqa: BLE001 - keep what ours measured
            res["baseline_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            traceback.print_exc()
        dump()

    if "fp8" in precisions:
        try:
            t1 = time.perf_counter()
            apply_precision(dit, "fp8")
            sync(device)
            res["fp8"] = {"quantize_s": round(time.perf_counter() - t1, 2)}
            if device.type == "cuda":
                res["fp8"]["weights_GiB"] = round(torch.cuda.memory_allocated() / 2**30, 2)
            fast = Pipeline(info, dit, text, fp16_vae, audio_vae, device, write_options=options)
            res["fp8"]["warm_up_s"] = round(fast.warm_up([req]), 2)
            jobs, fp8_clip = run_jobs(fast, req, max(1, args.jobs), out_dir, "fp8")
            res["fp8"].update(jobs=jobs, steady=summarize(jobs[1:] or jobs))
            dump()
            reference_frames = served_frames(fp16_vae, bf16_clip)
            res["fp8"]["error_vs_bf16"] = precision_error(fp8_clip, bf16_clip, fp16_vae, reference_frames)
            print("fp8 error", json.dumps(res["fp8"]["error_vs_bf16"]), flush=True)
        except Exception as exc:  # noqa: BLE001 - keep what the other paths measured
            res["fp8_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
            traceback.print_exc()
        dump()

    if args.decode_variants:
        decode_variants(res, fp32_vae, fp16_vae, audio_vae, clip, device, tiles_per_chunk, dump, args.out.parent,
                        args.variant_reps)
    res["table"] = table(res)
    dump()
    print(json.dumps({k: res.get(k) for k in ("config", "build_s", "params_B")}, default=str))
    if "decode_variants" in res:
        for name, entry in res["decode_variants"].items():
            print(f"decode variant {name}: {entry.get('s')} s, PSNR {entry.get('psnr_db')} dB {entry.get('error', '')}")
    if "fp8" in res:
        print(f"fp8: warm-up {res['fp8'].get('warm_up_s')} s, error {res['fp8'].get('error_vs_bf16')}")
    print(f"ours: warm-up {res['ours']['warm_up_s']} s, first job vs later {res['ours'].get('first_job_vs_later')}, "
          f"GPU idle between jobs {res['ours'].get('gpu_idle_between_jobs_s')}")
    print(res["table"])


if __name__ == "__main__":
    pipeline_module.log.setLevel("WARNING")
    main()
