"""`h3batch render --task t2va|fl2va|ref2va` on the tiny native release: real loading, 3 steps, VAEs, MP4 probed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from h3batch.worker.h3.mp4 import probe_mp4

H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """Two random PNGs of other aspects than the canvas, and a file that is not an image."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(3)
    paths = {"a": folder / "a.png", "b": folder / "b.png", "bad": folder / "bad.png"}
    Image.fromarray(rng.integers(0, 256, (120, 200, 3), dtype=np.uint8)).save(paths["a"])
    Image.fromarray(rng.integers(0, 256, (200, 150, 3), dtype=np.uint8)).save(paths["b"])
    paths["bad"].write_text("not an image")
    return paths


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*H3BATCH, "render", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("task,flags", [
    ("t2va", ()),
    ("fl2va", ("--first-frame", "a", "--last-frame", "b")),
    ("ref2va", ("--reference", "a", "--reference", "b")),
])
def test_each_task_renders_a_decodable_mp4(native, images, tmp_path, task, flags):
    """Every task of the native release renders the default canvas at the native default 5 s (124 frames) through
    the release's 3 forwards into an H.264 + AAC MP4 whose frames decode."""
    out = tmp_path / f"{task}.mp4"
    args = [str(images[f]) if f in images else f for f in flags]
    proc = render("--release", str(native.release_dir), "--prompt", "a red fox runs through snow", "--task", task,
                  *args, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["frames"] == 124 and summary["release"] == "h3batch/MiniMax-H3-native-tiny"
    assert "3/3" in proc.stderr  # the bar counts the release's own forwards
    info = probe_mp4(out)
    assert (info["video_codec"], info["width"], info["height"], info["frames"]) == ("h264", 256, 128, 124)
    assert (info["audio_codec"], info["channels"]) == ("aac", 2)


@pytest.mark.parametrize("flags,words", [
    (("--task", "fl2va"), "--task fl2va: expected --first-frame and/or --last-frame"),
    (("--task", "t2va", "--first-frame", "a"), "--first-frame: not an input of --task t2va"),
    (("--task", "fl2va", "--reference", "a"), "--reference: not an input of --task fl2va"),
    (("--task", "fl2va", "--first-frame", "bad"), "is not an image"),
    (("--task", "ref2va", "--reference", "missing.png"), "--reference: no such file"),
    (("--task", "ref2va", *(["--reference", "a"] * 10)), "--reference: expected at most 9 images, got 10"),
])
def test_bad_image_flags_exit_2_with_one_line(native, images, tmp_path, flags, words):
    args = [str(images[f]) if f in images else f for f in flags]
    proc = render("--release", str(native.release_dir), "--prompt", "x", *args, "--out", str(tmp_path / "o.mp4"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert words in proc.stderr and not (tmp_path / "o.mp4").exists()


def test_a_v2_release_refuses_fl2va_naming_its_tasks(tiny_v2, images, tmp_path):
    """fl2va on a FastH3 V2 release: exit 2, the line names the task and what the release renders."""
    proc = render("--release", str(tiny_v2), "--prompt", "x", "--task", "fl2va", "--first-frame", str(images["a"]),
                  "--out", str(tmp_path / "o.mp4"))
    assert proc.returncode == 2, proc.stderr
    assert "task: this worker renders t2va (v2 release), found 'fl2va'" in proc.stderr
