"""Peak host memory per stage of whole jobs on the CPU (the tiny release): the two points the CPU memory plan's
calibration passes through (worker/h3/memory_plan.py `CPU_MEASURED`, issue P7 point 2).

One process loads the release through the real `Pipeline` on the CPU, then renders each size in turn (smallest
first), reading the kernel's resident-set figures of this process: VmRSS before the job, and the high-water mark
VmHWM of the denoise (read when the decode starts) and of the decode and mux. Writing 5 to /proc/self/clear_refs
resets the high-water mark to the current resident set between stages (Linux only), so each figure is that stage's
own peak. Rows are the packed sequence the DiT ran (`layout.sequence_length`, the prompt's real token count).

Usage: python bench/memory_cpu.py --release var/tiny-release --sizes 256x128x4,512x256x8 --out /tmp/memory_cpu.json
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from h3batch.worker.pipeline import Pipeline, RenderRequest

GIB = 2**30


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--hf-cache", default=None)
    parser.add_argument("--sizes", default="256x128x4,512x256x8", help="WxHxSECONDS, comma-separated, ascending")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    pipe = Pipeline.load(args.release, device="cpu", hf_cache=args.hf_cache)
    result: dict = {"release": pipe.release_id, "torch": torch.__version__, "machine": platform.platform(),
                    "cpus": torch.get_num_threads(), "jobs": []}
    for size in args.sizes.split(","):
        width, height, seconds = size.split("x")
        req = RenderRequest(prompt="a kettle whistles on a stove", width=int(width), height=int(height),
                            seconds=float(seconds), seed=1)
        marks: dict[str, float] = {}

        def progress(stage: str, step: int, total: int, marks: dict = marks) -> None:
            if stage == "decode" and "denoise_gib" not in marks:
                marks["denoise_gib"] = _status_kib("VmHWM") * 1024 / GIB
                _reset_peak()

        before = _status_kib("VmRSS") * 1024 / GIB
        _reset_peak()
        t0 = time.perf_counter()
        clip = pipe.denoise(req, on_progress=progress)
        progress("decode", 0, 1)
        written = pipe.write(clip, Path(args.out).with_suffix(f".{size}.mp4"), on_progress=progress)
        entry = {"size": size, "rows": clip.layout.sequence_length, "before_gib": round(before, 3),
                 "denoise_gib": round(marks["denoise_gib"], 3),
                 "decode_gib": round(_status_kib("VmHWM") * 1024 / GIB, 3),
                 "seconds": round(time.perf_counter() - t0, 1)}
        written.path.unlink()
        result["jobs"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
