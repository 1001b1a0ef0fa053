"""libx264 preset choice for the MP4 mux: encode time and file size at CRF 18, smooth vs noisy content (issue P2).

Content at the service's real size (default 1344x768, 107 frames = 4.4 s, with 4.45 s of stereo audio):
  smooth  moving colour ramps and a soft sine pattern (what a decoded clip mostly looks like);
  noisy   uniform random pixels in every frame (the worst case: what random-weight decodes look like).
For each preset: `write_mp4` of the whole clip (seconds, MB), and the streamed form (`Mp4Writer` with the encode
thread, fed in 17-frame chunks): the tail left after the last chunk is handed over, which is what stays on a job's
critical path when decode and encode overlap.

Usage: python bench/mux.py --out mux.json [--size 1344x768] [--frames 107] [--presets medium,veryfast,ultrafast]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from h3batch.worker.h3.mp4 import Mp4Writer, write_mp4


def content(kind: str, frames: int, height: int, width: int) -> np.ndarray:
    """uint8 [N, H, W, 3] frames of the given kind."""
    if kind == "noisy":
        return np.random.default_rng(0).integers(0, 256, size=(frames, height, width, 3), dtype=np.uint8)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    for i in range(frames):
        out[i, ..., 0] = (x * 255 / (width - 1) + 2 * i) % 256
        out[i, ..., 1] = y * 255 / (height - 1)
        out[i, ..., 2] = 128 + 60 * np.sin(2 * np.pi * (x + y + 4 * i) / 197)
    return out


def tones(samples: int) -> np.ndarray:
    t = np.arange(samples) / 32000
    return np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 220 * t)]).astype(np.float32)


def measure(frames: np.ndarray, audio: np.ndarray, preset: str, directory: Path) -> dict:
    path = directory / f"{preset}.mp4"
    t0 = time.perf_counter()
    write_mp4(path, frames, audio, preset=preset)
    whole = time.perf_counter() - t0
    size = path.stat().st_size
    t0 = time.perf_counter()
    with Mp4Writer(directory / f"{preset}-stream.mp4", frames.shape[2], frames.shape[1], audio, preset=preset,
                   background=True) as writer:
        for start in range(0, frames.shape[0], 17):
            writer.add_frames(frames[start:start + 17])
        handed = time.perf_counter()
        writer.finish()
    end = time.perf_counter()
    os.unlink(path)
    os.unlink(directory / f"{preset}-stream.mp4")
    return {"encode_s": round(whole, 3), "MB": round(size / 1e6, 3), "stream_total_s": round(end - t0, 3),
            "stream_tail_s": round(end - handed, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="1344x768")
    parser.add_argument("--frames", type=int, default=107)
    parser.add_argument("--presets", default="medium,veryfast,ultrafast")
    args = parser.parse_args()
    width, height = map(int, args.size.lower().split("x"))
    audio = tones(800 * 178)
    res = {"size": args.size, "frames": args.frames, "crf": 18, "cpus": os.cpu_count(), "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("smooth", "noisy"):
            frames = content(kind, args.frames, height, width)
            for preset in args.presets.split(","):
                entry = measure(frames, audio, preset, Path(tmp))
                res["results"][f"{kind}/{preset}"] = entry
                print(kind, preset, json.dumps(entry), flush=True)
                args.out.write_text(json.dumps(res, indent=1))
    print("| content | preset | encode s | MB | streamed tail s |\n|---|---|---|---|---|")
    for key, entry in res["results"].items():
        kind, preset = key.split("/")
        print(f"| {kind} | {preset} | {entry['encode_s']} | {entry['MB']} | {entry['stream_tail_s']} |")


if __name__ == "__main__":
    main()
