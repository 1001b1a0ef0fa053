"""`h3batch render` end to end on the tiny release: real loading, 8 steps, VAEs, MP4 decoded back with PyAV."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3batch.worker.h3.mp4 import probe_mp4
from h3batch.worker.h3.tiny_release import build_tiny_release

H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("render")
    return build_tiny_release(base / "release", base / "hf-cache").release_dir


def drifted_release(release: Path, tmp_path: Path, **fields: object) -> Path:
    """A copy of `release` at tmp_path/bad whose fastvideo_inference.json has `fields` changed; the sibling hf-cache
    is linked beside it, so only the contract differs. The rank-group tests use it too."""
    import shutil

    bad = Path(shutil.copytree(release, tmp_path / "bad"))
    contract = json.loads((bad / "fastvideo_inference.json").read_text())
    contract.update(fields)
    (bad / "fastvideo_inference.json").write_text(json.dumps(contract))
    (tmp_path / "hf-cache").symlink_to(release.parent / "hf-cache")
    return bad


def render(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)  # the release's sibling hf-cache must be found on its own
    return subprocess.run([*H3BATCH, "render", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_render_defaults_produce_a_valid_mp4(release, tmp_path):
    """At the defaults (256×128, 4 s) the MP4 has 107 frames at 24 fps, stereo 32 kHz audio of matching length."""
    out = tmp_path / "clip.mp4"
    proc = render("--release", str(release), "--prompt", "a red fox runs through snow", "--seed", "7",
                  "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["frames"] == 107 and summary["seed"] == 7
    assert set(summary["timings"]) == {"load", "text_encode", "denoise", "decode", "mux"}
    assert summary["tokens"]["audio_rows"] == 356 and summary["tokens"]["video_rows"] == 1024
    assert "denoise" in proc.stderr and "8/8" in proc.stderr  # the progress bar reached the last step

    info = probe_mp4(out)
    assert (info["video_codec"], info["width"], info["height"]) == ("h264", 256, 128)
    assert info["frames"] == 107 and info["average_fps"] == 24
    assert (info["audio_codec"], info["channels"], info["sample_rate"]) == ("aac", 2, 32000)
    assert abs(info["audio_duration_s"] - 178 * 800 / 32000) <= 1 / 24  # A = 178 latents
    assert info["metadata"].get("h3batch_seed") == "7"


def test_same_seed_same_frames(release, tmp_path):
    """Rendering twice with one seed gives identical decoded frames (seeded noise, deterministic CPU math)."""
    import av
    import numpy as np

    frames = []
    for name in ("a.mp4", "b.mp4"):
        out = tmp_path / name
        proc = render("--release", str(release), "--prompt", "waves", "--seed", "3", "--out", str(out),
                      "--no-progress", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        with av.open(str(out)) as container:
            frames.append(np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]))
    assert np.array_equal(frames[0], frames[1])


@pytest.mark.parametrize("args, words", [
    (["--prompt", "   "], "--prompt"),
    (["--prompt", "x", "--width", "250"], "width"),
    (["--prompt", "x", "--width", "1024", "--height", "128"], "aspect"),
    (["--prompt", "x", "--seconds", "2"], "seconds"),
    (["--prompt", "x", "--seconds", "16"], "seconds"),
    (["--prompt", "x", "--aspect-ratio", "16:9", "--width", "256"], "aspect_ratio"),
    (["--prompt", "x", "--width", "1536", "--height", "1024"], "width x height"),
    (["--prompt", "x", "--out", "clip.webm"], "--out"),
])
def test_bad_input_exits_2_with_one_line(release, tmp_path, args, words):
    """Bad input answers exit 2 and one stderr line naming the problem, before any model loads."""
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "x.mp4")]
    proc = render("--release", str(release), *args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr
    assert not (tmp_path / "x.mp4").exists()


def test_missing_release_exits_2(tmp_path):
    """A release directory that does not exist is named in a one-line error."""
    proc = render("--release", str(tmp_path / "nope"), "--prompt", "x", "--out", str(tmp_path / "x.mp4"),
                  cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_invalid_release_exits_2_naming_the_field(release, tmp_path):
    """A release whose contract drifts stops before loading, naming the field."""
    bad = drifted_release(release, tmp_path, vsa_sparsity=0.9)
    proc = render("--release", str(bad), "--prompt", "x", "--out", str(tmp_path / "x.mp4"), cwd=tmp_path)
    assert proc.returncode == 2 and "vsa_sparsity" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_aspect_ratio_renders_the_release_bucket(release, tmp_path):
    """`--aspect-ratio 1:1` on the tiny release renders its 1:1 bucket at the tiny budget (128x128)."""
    out = tmp_path / "square.mp4"
    proc = render("--release", str(release), "--prompt", "a cat", "--aspect-ratio", "1:1", "--out", str(out),
                  "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (summary["width"], summary["height"]) == (128, 128)
    assert (probe_mp4(out)["width"], probe_mp4(out)["height"]) == (128, 128)


def test_default_release_outside_the_checkout_is_a_missing_folder_not_a_hub_id(tmp_path):
    """Run where no `var/tiny-release` exists, with no --release and no H3BATCH_RELEASE, the path-like default is
    reported as a missing folder (exit 2, one line); it is never read as the Hub repo `var/tiny-release`, so nothing
    touches the network or the Hub cache (HF_HUB_OFFLINE is unset here on purpose)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3BATCH_") and k != "HF_HUB_OFFLINE"}
    env["HF_HUB_CACHE"] = str(tmp_path / "hub-cache")
    done = subprocess.run([*H3BATCH, "render", "--prompt", "rain", "--out", str(tmp_path / "x.mp4")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "release directory 'var/tiny-release' does not exist" in lines[0] and "the default" in lines[0]
    assert "build-tiny" in lines[0] and not (tmp_path / "hub-cache").exists()
