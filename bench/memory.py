"""Peak GPU memory per stage of whole jobs at real size on one GPU, random weights (issue P4, point 5).

Builds the real-shape models with bench/e2e.py's builders (DiT 35.05 B bf16 with VSA gates, the Qwen3-VL text stack
at real width with its 50 kept layers, the video VAE served as an fp16 decoder-only copy, the fp32 audio VAE) and
renders clips through the real `Pipeline` (`denoise` then `write`), one job per clip, recording per stage
(text_encode, denoise, decode, mux) the peak of `torch.cuda.max_memory_allocated` after
`reset_peak_memory_stats`, the stage seconds and the memory plan's prediction (worker/h3/memory_plan.py) for the
same sizes. The stage boundary between text_encode and denoise is the pipeline's `settle` call (after the prompt is
encoded, before the refiner and the first step).

Phases, in one process:
`--phases` (default `resident:4.4 offload:4.4,15 stream:4.4`): the text stack resident on the GPU beside the DiT
(what ranks = 1 held before), then offloaded (pinned host memory, copied to the GPU to encode and dropped before the
denoise), then streamed a layer at a time; each phase renders its clips (seconds) at `--size`.

Usage (GPU):  python bench/memory.py --out $OUT/memory.json
      (CPU):  python bench/memory.py --tiny --size 64x64 --phases 'resident:4 offload:4 stream:4' --out /tmp/m.json
Each job is the first at its geometry, so its denoise includes the VSA kernel's compile for that shape (seconds);
the decoder runs eager unless `--compile`. JSON is rewritten after every job.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import torch
from e2e import PROMPT, StageMemory, bench_info, build_dit, build_text_encoder, build_vaes, environment, sync

from h3batch.worker import pipeline as pipeline_module
from h3batch.worker.h3 import decode, memory_plan
from h3batch.worker.h3.text_placement import place_text_encoder
from h3batch.worker.pipeline import Pipeline, RenderRequest, WriteOptions, plan_for

GIB = 2**30


class StageSplit:
    """The pipeline's text encoder, with `settle` marking the end of text_encode for the stage memory."""

    def __init__(self, inner, memory: StageMemory | None = None):
        self.inner, self.memory = inner, memory

    def encode(self, prompt: str):
        return self.inner.encode(prompt)

    def settle(self, rows: int) -> None:
        settle = getattr(self.inner, "settle", None)
        if settle is not None:
            settle(rows)
        if self.memory is not None:
            self.memory.enter("denoise")


class Memory(StageMemory):
    """StageMemory whose denoise starts at `settle` (StageSplit), not after the first step."""

    def progress(self, stage: str, step: int, total: int) -> None:
        if stage in ("text_encode", "decode", "mux"):
            self.enter(stage)


def one_job(pipe: Pipeline, split: StageSplit, req: RenderRequest, out_dir: Path, tag: str) -> dict:
    device = pipe.device
    cuda = device.type == "cuda"
    geo = pipe.geometry(req)
    entry: dict = {"tag": tag, "seconds": req.seconds, "size": f"{req.width}x{req.height}",
                   "frames": geo.num_frames, "video_rows": geo.video_rows, "audio_rows": geo.audio_rows}
    if cuda:
        sync(device)
        torch.cuda.empty_cache()
        entry["allocated_before_GiB"] = round(torch.cuda.memory_allocated() / GIB, 2)
    memory = Memory(device)
    split.memory = memory
    t0 = time.perf_counter()
    try:
        clip = pipe.denoise(req, on_progress=memory.progress)
        result = pipe.write(clip, out_dir / f"{tag}.mp4", on_progress=memory.progress)
        entry.update(ok=True, rows=clip.layout.sequence_length, text_rows=clip.layout.text_rows,
                     timings={k: round(v, 3) for k, v in result.timings.items()},
                     whole_job_s=round(time.perf_counter() - t0, 2), frames_written=result.frames,
                     mp4_bytes=result.path.stat().st_size)
        result.path.unlink()
    except torch.OutOfMemoryError as exc:
        entry.update(ok=False, error=f"OutOfMemoryError: {str(exc).splitlines()[0][:300]}", stage=memory.stage)
        traceback.print_exc()
    entry["peak_GiB"] = memory.close()
    if cuda:
        entry["max_reserved_GiB"] = round(torch.cuda.max_memory_reserved() / GIB, 2)
        free, total = torch.cuda.mem_get_info()
        entry["free_after_GiB"], entry["total_GiB"] = round(free / GIB, 2), round(total / GIB, 2)
        torch.cuda.empty_cache()
    print(tag, json.dumps(entry), flush=True)
    return entry


def predicted(plan: memory_plan.MemoryPlan, rows: int) -> dict:
    """The plan's stage peaks (GiB) for a clip of `rows` packed rows on rank 0."""
    rank, cal = plan.per_rank[0], plan.calibration
    weights = rank.weights
    return {"text_encode": round((weights + max(rank.text_visit, cal.text_workspace)) / GIB, 2),
            "denoise": round((weights + cal.activations(rows)) / GIB, 2),
            "decode": round((weights + rank.decode_workspace) / GIB, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU test configs instead of the real shapes")
    parser.add_argument("--size", default=None, help="WxH (default 1344x768 real, 256x128 tiny)")
    parser.add_argument("--phases", default="resident:4.4 offload:4.4,15 stream:4.4",
                        help="placement:seconds,... in order (placements: resident, offload, stream)")
    parser.add_argument("--text-tokens", type=int, default=128)
    parser.add_argument("--text-layers", type=int, default=51, help="real width text stack depth built (51: the "
                                                                    "release's 50 kept + the one dropped)")
    parser.add_argument("--compile", action="store_true", help="compile the decoder's ViT blocks (as served)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cpu") if args.tiny or not torch.cuda.is_available() else torch.device("cuda")
    width, height = map(int, (args.size or ("256x128" if args.tiny else "1344x768")).lower().split("x"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    res: dict = {"env": environment(device), "config": vars(args) | {"out": str(args.out)}, "jobs": []}

    def dump() -> None:
        args.out.write_text(json.dumps(res, indent=1, default=str))

    t0 = time.perf_counter()
    dit = build_dit(args.tiny, device)
    fp32_vae, audio_vae = build_vaes(args.tiny, device)
    cuda = device.type == "cuda"
    video_vae = decode.prepare_video_decoder(fp32_vae, torch.float16 if cuda else None, compile_blocks=args.compile)
    del fp32_vae
    text = build_text_encoder(args.tiny, args.text_layers, args.text_tokens, device)
    sync(device)
    res["build_s"] = round(time.perf_counter() - t0, 1)
    info = bench_info(args.tiny)
    out_dir = Path(tempfile.mkdtemp(prefix="memory-"))
    plans = {}
    phases = [(name, [float(v) for v in clips.split(",") if v.strip()])
              for name, _, clips in (phase.partition(":") for phase in args.phases.split())]
    for placement in dict.fromkeys(name for name, _ in phases):
        plan = plan_for(device, dit, text, video_vae, audio_vae, canvas=(width, height), placement=placement)
        plans[placement] = plan
        res.setdefault("plan", {})[placement] = plan.as_json()
    res["sizes_GiB"] = {k: round(v / GIB, 3) for k, v in next(iter(plans.values())).sizes.__dict__.items()}
    dump()

    for placement, clips in phases:
        if not clips:
            continue
        t0 = time.perf_counter()
        placed = place_text_encoder(text, device, placement)
        sync(device)
        res.setdefault("place_s", {})[placement] = round(time.perf_counter() - t0, 2)
        if cuda:
            res.setdefault("weights_GiB", {})[placement] = round(torch.cuda.memory_allocated() / GIB, 2)
        split = StageSplit(placed)
        pipe = Pipeline(info, dit, split, video_vae, audio_vae, device, write_options=WriteOptions())
        for secs in clips:
            req = RenderRequest(prompt=PROMPT, seconds=secs, width=width, height=height, seed=7)
            entry = one_job(pipe, split, req, out_dir, f"{placement}-{secs:g}s")
            entry["placement"] = placement
            if "rows" in entry:
                entry["predicted_GiB"] = predicted(plans[placement], entry["rows"])
            res["jobs"].append(entry)
            dump()
    dump()
    for entry in res["jobs"]:
        print(f"{entry['tag']}: ok={entry.get('ok')} rows={entry.get('rows')} peak={entry['peak_GiB']} "
              f"timings={entry.get('timings')} predicted={entry.get('predicted_GiB')}")


if __name__ == "__main__":
    pipeline_module.log.setLevel("WARNING")
    main()
