"""Per-job LoRAs on the resident DiT (worker/h3/adapters.py) at real size: what applying and removing one costs, and
what the unfused deltas add to each denoise step against fused ones.

Random bf16 weights at the real shapes (config `minimax-h3-33b`, resident on one GPU). Each adapter is rank r on every
Linear a published H3 LoRA touches in all 50 DiT blocks (to_q/to_k/to_v, to_out, both FFN projections, the AdaLN
projection) plus two refiner projections and three top-level ones (worker/h3/tiny_adapters.lora_target_shapes), factors
in fp32 on the host as a file would hold them. Measured for r = 32 and 128:

  load     host factors -> native deltas on the GPU (bf16, QKV placement, fc1 swap): `native_lora`
  apply    forward hooks on the Linears: `apply_loras`; remove: `AppliedLoras.remove`
  fuse     the alternative: W += s·BA on every target in bf16, and unfuse (W -= s·BA), with whether W came back exact
  step     one full DiT forward (dense SDPA, no VSA) at the V2 recipe geometry 1344x768 4.4 s + 128 text rows
           (S = 32,740): base, with the hooks (unfused), and after fusing (fused costs what the base costs)

Times: CUDA-event medians after warm-up (first-call and kernel-compile time reported apart).

Usage (GPU): python -P bench/adapters.py --out $OUT [--ranks 32,128] [--steps 3]
CPU smoke:   python -P bench/adapters.py --out /tmp/x --config T2 --width 128 --height 32 --seconds 4 --steps 1
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import types
from pathlib import Path

import torch

try:  # the loader's file reader; this bench reads no files, so a GPU image without safetensors still runs it
    import safetensors.torch  # noqa: F401
except ImportError:
    sys.modules["safetensors"] = types.SimpleNamespace(safe_open=None)
    sys.modules["safetensors.torch"] = types.SimpleNamespace(save_file=None, save=None)

from h3batch.core.geometry import RequestGeometry  # noqa: E402
from h3batch.worker.h3.adapters import apply_loras, fuse_into_weights, native_lora  # noqa: E402
from h3batch.worker.h3.config import CONFIGS  # noqa: E402
from h3batch.worker.h3.model import H3Transformer  # noqa: E402
from h3batch.worker.h3.packing import build_packed_layout  # noqa: E402
from h3batch.worker.h3.tiny_adapters import random_lora_state_dict  # noqa: E402

TEXT_ROWS = 128


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def wall_ms(fn) -> float:
    """One synchronized call, wall clock (host work such as hook registration is what it measures)."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return 1e3 * (time.perf_counter() - start)


def event_ms(fn, reps: int) -> list[float]:
    """CUDA-event ms of `reps` calls (wall clock on a CPU)."""
    out = []
    for _ in range(reps):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            out.append(wall_ms(fn))
    return out


def inputs(config, geometry: RequestGeometry, device: torch.device) -> dict:
    """One request's packed forward arguments with random latents and text features."""
    layout = build_packed_layout(TEXT_ROWS, geometry).to(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    video = torch.randn(1, layout.video_rows, config.video_patch_dim, generator=g).to(device)
    audio = torch.randn(1, layout.audio_rows, config.audio_latents_dim, generator=g).to(device)
    text = torch.randn(1, TEXT_ROWS, config.text_dim, generator=g).to(device)
    timestep = torch.tensor([0.3, 0.5], device=device)
    return dict(hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=text, timestep=timestep,
                timestep_indices=(layout.token_tags == 2).long(), token_tags=layout.token_tags,
                position_ids=layout.position_ids, video_indices=layout.video_indices,
                audio_indices=layout.audio_indices, text_indices=layout.text_indices)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", default="minimax-h3-33b", choices=sorted(CONFIGS))
    parser.add_argument("--ranks", default="32,128")
    parser.add_argument("--steps", type=int, default=3, help="timed DiT forwards per case (after one warm-up)")
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--seconds", type=float, default=4.4)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = CONFIGS[args.config]
    result: dict = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "python": platform.python_version(),
                    "torch": torch.__version__, "device": str(device), "config": args.config,
                    "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                    "geometry": [args.width, args.height, args.seconds], "cases": {}}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass

    def save() -> None:
        (out / "adapters.json").write_text(json.dumps(result, indent=2) + "\n")

    t0 = time.perf_counter()
    with torch.device(device):
        model = H3Transformer(config, dtype=torch.bfloat16).eval()
    sync()
    result["build_s"] = round(time.perf_counter() - t0, 2)
    result["parameters_b"] = round(sum(p.numel() for p in model.parameters()) / 1e9, 2)
    kwargs = inputs(config, RequestGeometry(args.width, args.height, args.seconds), device)
    result["rows"] = int(kwargs["position_ids"].shape[0])

    @torch.inference_mode()
    def step() -> None:
        model(**kwargs)

    result["first_step_s"] = round(wall_ms(step) / 1e3, 2)  # kernel compiles included
    base = event_ms(step, args.steps)
    result["step_base_ms"] = round(statistics.median(base), 1)
    save()
    for rank in (int(r) for r in args.ranks.split(",")):
        case: dict = {}
        state_dict = random_lora_state_dict(config, rank=rank, seed=rank)
        case["factor_mib_fp32_host"] = round(sum(t.nbytes for t in state_dict.values()) / 2**20, 1)
        loads = [wall_ms(lambda: native_lora(f"r{rank}", state_dict, model)) for _ in range(3)]
        weights = native_lora(f"r{rank}", state_dict, model)
        case["load_ms"] = round(statistics.median(loads), 2)
        case["targets"] = len(weights.deltas)
        case["factor_mib_gpu_bf16"] = round(weights.nbytes / 2**20, 1)
        applies, removes = [], []
        for _ in range(5):
            holder = {}
            applies.append(wall_ms(lambda: holder.update(applied=apply_loras(model, [(weights, 1.0)]))))
            removes.append(wall_ms(lambda: holder["applied"].remove()))
        case["apply_ms"], case["remove_ms"] = round(statistics.median(applies), 3), round(statistics.median(removes), 3)
        applied = apply_loras(model, [(weights, 1.0)])
        step()  # warm-up with the hooks
        unfused = event_ms(step, args.steps)
        applied.remove()
        case["step_unfused_ms"] = round(statistics.median(unfused), 1)
        case["step_unfused_overhead_pct"] = round(100 * (statistics.median(unfused) / result["step_base_ms"] - 1), 2)
        probe = dict(model.named_parameters())["blocks.0.attn.qkv_proj.weight"]
        before = probe.detach().clone()
        case["fuse_ms"] = round(wall_ms(lambda: fuse_into_weights(model, weights, 1.0)), 1)
        fused = event_ms(step, args.steps)
        case["step_fused_ms"] = round(statistics.median(fused), 1)
        case["unfuse_ms"] = round(wall_ms(lambda: fuse_into_weights(model, weights, 1.0, sign=-1.0)), 1)
        changed = (probe != before).float().mean().item()
        case["fused_unfused_qkv_elements_changed_pct"] = round(100 * changed, 3)  # bf16 W + sBA - sBA != W
        result["cases"][f"rank{rank}"] = case
        save()
        del weights, state_dict
    if device.type == "cuda":
        result["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    save()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
