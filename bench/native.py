"""The native MiniMax-H3 release at real size on one GPU: seconds per DiT forward for t2va and fl2va at 1344x768 x 5 s,
dense (the native release's attention) and with the VSA-H3 switch at sparsity 0.8, and the whole clip's 49 forwards.

Random bf16 weights at the 33B shapes (worker/h3/config.py `H3_33B`, with VSA gates built so the sparse switch has
them; the dense runs ignore them). Layouts are the pipeline's (worker/h3/packing.py):
  t2va   L = 128 text rows + 2A = 414 audio + 37x24x42 = 37,296 video rows (124 frames).
  fl2va  first and last keyframe: L = 128 + 2 x (1,008 vision tokens of a 1344x768 image at Qwen3-VL's 16-pixel
         patch, 2x2 merge, + "<Picture i>: " label and its 2 delimiters, about 6) and C = 2 x 1,008 keyframe rows.
Timing: one warm-up forward (reported apart: compiles, first calls), then `--steps` forwards timed with CUDA syncs;
s/step is their mean and the whole clip is the 49 forwards of the published 50-point grid, from that figure
(`--full` runs all 49 instead). Text encoding, keyframe encoding and decode are not in these figures.

Usage (GPU machine): python bench/native.py --out $OUT [--steps 3] [--full]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import torch

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3 import packing
from h3batch.worker.h3.config import H3_33B
from h3batch.worker.h3.loader import materialize
from h3batch.worker.h3.model import H3Transformer
from h3batch.worker.h3.vsa_plan import build_vsa_plan

FORWARDS = 49
TEXT_ROWS = 128
VISION_TOKENS = (768 // 16) * (1344 // 16) // 4  # one 1344x768 keyframe through Qwen3-VL's processor: 1,008
LABEL_ROWS = 6  # "<Picture i>: " (about 4 tokens) + vision start/end


def random_dit(device: torch.device) -> H3Transformer:
    config = dataclasses.replace(H3_33B, vsa_gates=True)  # gates for the sparse switch; dense ignores them
    with torch.device("meta"):
        model = H3Transformer(config, dtype=torch.bfloat16)
    model = materialize(model, device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    return model.eval().requires_grad_(False)


def layout_for(task: str, geo: RequestGeometry):
    if task == "t2va":
        return packing.build_packed_layout(TEXT_ROWS, geo), (TEXT_ROWS, geo.audio_rows)
    text = TEXT_ROWS + 2 * (VISION_TOKENS + LABEL_ROWS)
    tags = [packing.TEXT_TAG] * text
    layout = packing.build_packed_layout(text, geo, text_tags=tags, keyframe_anchors=("first", "last"))
    return layout, (text, layout.condition_rows, geo.audio_rows)


def run(model, task: str, sparsity: float, steps: int, device) -> dict:
    geo = RequestGeometry(1344, 768, 5.0)
    layout, prefix = layout_for(task, geo)
    plan = build_vsa_plan(prefix, tuple(layout.video_grid), sparsity) if sparsity > 0 else None
    dev = layout.to(device)
    cfg = model.config
    text = torch.randn(1, layout.text_rows, cfg.text_dim, device=device, dtype=torch.bfloat16)
    video = torch.randn(1, layout.condition_rows + layout.video_rows, packing.VIDEO_ROW_DIM, device=device)
    audio = torch.randn(1, layout.audio_rows, packing.AUDIO_LATENT_CHANNELS, device=device)
    refined = model.refine_text(text)
    timestep, indices = packing.row_timesteps(0.3, 0.5, dev)

    def forward():
        return model(video, audio, None, timestep, indices, dev.token_tags, dev.position_ids, dev.video_indices,
                     dev.audio_indices, dev.text_indices, vsa_plan=plan, refined_text=refined)

    with torch.inference_mode():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        forward()
        torch.cuda.synchronize()
        warm = time.perf_counter() - t0
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            forward()
        torch.cuda.synchronize()
        per_step = (time.perf_counter() - t0) / steps
    return {"task": task, "attention": "dense" if plan is None else f"vsa {sparsity:g}", "rows": layout.sequence_length,
            "first_forward_s": round(warm, 3), "s_per_step": round(per_step, 3), "steps_timed": steps,
            "clip_49_forwards_s": round(per_step * FORWARDS, 1) if steps < FORWARDS else round(per_step * steps, 1),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="time all 49 forwards")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    facts = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:], "results": []}
    try:
        import triton
        facts["triton"] = triton.__version__
    except ImportError:
        pass
    t0 = time.perf_counter()
    model = random_dit(device)
    facts["init_s"] = round(time.perf_counter() - t0, 1)
    steps = FORWARDS if args.full else args.steps
    for task in ("t2va", "fl2va"):
        for sparsity in (0.0, 0.8):
            try:
                facts["results"].append(run(model, task, sparsity, steps, device))
            except Exception as exc:  # noqa: BLE001  # one failing configuration must not lose the others
                facts["results"].append({"task": task, "sparsity": sparsity, "error": f"{type(exc).__name__}: {exc}"})
            print(json.dumps(facts["results"][-1]), flush=True)
            (out / "native.json").write_text(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
