"""The rank group (worker/rank_group.py): N resident gloo processes render like one process, cancel, and fail loudly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest

from h3batch.worker.pipeline import RenderCancelled, RenderRequest
from h3batch.worker.rank_group import RankGroupError, RankGroupPipeline, load_pipeline
from tests.worker.test_render_cli import drifted_release

H3BATCH = [sys.executable, "-P", "-m", "h3batch.cli"]
PROMPT = "a red fox runs through snow"


def decoded(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(video frames uint8 [N, H, W, 3], audio samples [2, n]) decoded back from an MP4 with PyAV."""
    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    with av.open(str(path)) as container:
        audio = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=-1)
    return frames, audio


def render_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # One thread per process everywhere, so the 1-rank run and each rank reduce in the same order.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    env.pop("H3BATCH_RANKS", None)
    return subprocess.run([*H3BATCH, "render", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_render_cli_two_ranks_writes_the_one_rank_mp4(tiny_release, tmp_path):
    """`h3batch render --ranks 2` (gloo, CPU) writes an MP4 whose decoded frames and audio equal the 1-rank one's."""
    outputs = {}
    for ranks in ("1", "2"):
        out = tmp_path / f"ranks{ranks}.mp4"
        proc = render_cli("--release", str(tiny_release), "--prompt", PROMPT, "--seed", "5", "--device", "cpu",
                          "--ranks", ranks, "--out", str(out), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["ranks"] == int(ranks) and summary["frames"] == 107
        outputs[ranks] = decoded(out)
    (frames1, audio1), (frames2, audio2) = outputs["1"], outputs["2"]
    assert frames1.shape == (107, 128, 256, 3) and frames1.std() > 1.0  # a real, non-flat clip
    assert np.array_equal(frames1, frames2)
    assert np.array_equal(audio1, audio2)


def test_render_cli_refuses_a_bad_rank_count(tiny_release, tmp_path):
    """`--ranks 0` exits 2 with one line naming --ranks, before anything loads."""
    proc = render_cli("--release", str(tiny_release), "--prompt", "x", "--ranks", "0", "--out",
                      str(tmp_path / "x.mp4"), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--ranks" in lines[0], proc.stderr


def test_render_cli_two_ranks_names_a_drifted_contract_field(tiny_release, tmp_path):
    """A release the ranks refuse while loading (contract drift) exits 2 with one line naming the field."""
    bad = drifted_release(tiny_release, tmp_path, vsa_sparsity=0.9)
    proc = render_cli("--release", str(bad), "--prompt", "x", "--device", "cpu", "--ranks", "2", "--out",
                      str(tmp_path / "x.mp4"), cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "vsa_sparsity" in lines[0], proc.stderr


@pytest.fixture(scope="module")
def group(tiny_release):
    """A 2-rank CPU group, resident for the whole module."""
    pipe = load_pipeline(tiny_release, ranks=2, device="cpu", hf_cache=tiny_release.parent / "hf-cache")
    yield pipe
    pipe.close()


def test_group_renders_twice_on_the_same_resident_ranks(group, tmp_path):
    """Two requests run on the same two rank processes, relay every progress event in order and write valid clips."""
    assert isinstance(group, RankGroupPipeline) and group.release_id.endswith("tiny")
    pids = group.pids
    events: list[tuple[str, int, int]] = []
    first = group.render(RenderRequest(PROMPT, seed=11), tmp_path / "a.mp4", on_progress=lambda *e: events.append(e))
    expected = [("text_encode", 0, 0), *[("denoise", k, 8) for k in range(0, 9)], ("decode", 0, 0), ("mux", 0, 0)]
    assert events == expected
    second = group.render(RenderRequest("waves at night", seed=12), tmp_path / "b.mp4")
    assert group.pids == pids and all(p.is_alive() for p in group._processes)
    assert first.extra["ranks"] == 2 and first.frames == second.frames == 107
    frames_a, _ = decoded(first.path)
    frames_b, _ = decoded(second.path)
    assert frames_a.shape == frames_b.shape and not np.array_equal(frames_a, frames_b)


def test_group_cancels_at_the_next_step_boundary(group, tmp_path):
    """should_cancel during step 2 stops every rank before step 4, writes nothing, and the group renders on after."""
    events: list[tuple[str, int, int]] = []
    out = tmp_path / "cancelled.mp4"
    with pytest.raises(RenderCancelled):
        group.render(RenderRequest(PROMPT, seed=21), out, on_progress=lambda *e: events.append(e),
                     should_cancel=lambda: ("denoise", 2, 8) in events)
    steps = [step for stage, step, _ in events if stage == "denoise"]
    assert 2 <= max(steps) <= 3 and ("decode", 0, 0) not in events  # the boundary after the flag, not the end
    assert not out.exists()

    # Same seed after the cancel and once more: identical frames, so no rank kept state from the stopped request.
    after = group.render(RenderRequest(PROMPT, seed=21), tmp_path / "after.mp4")
    again = group.render(RenderRequest(PROMPT, seed=21), tmp_path / "again.mp4")
    assert np.array_equal(decoded(after.path)[0], decoded(again.path)[0])


def test_group_refuses_bad_requests_in_the_driver(group, tmp_path):
    """An empty prompt is a ValueError naming the prompt, raised before any rank sees the request."""
    with pytest.raises(ValueError, match="prompt"):
        group.render(RenderRequest("   "), tmp_path / "x.mp4")


def test_prompt_refused_by_rank0_encoder_fails_every_rank_together(group, tmp_path):
    """An over-long prompt (refused by the text encoder on rank 0 only) is a ValueError; the group keeps serving."""
    with pytest.raises(ValueError, match="token"):
        group.render(RenderRequest("snow " * 3000), tmp_path / "long.mp4")
    assert all(p.is_alive() for p in group._processes)
    assert group.render(RenderRequest(PROMPT, seed=1), tmp_path / "ok.mp4").frames == 107


def test_a_dead_rank_stops_the_group_with_an_error(tiny_release, tmp_path):
    """Killing one rank makes the next render raise RankGroupError naming it; the group then refuses every render."""
    pipe = RankGroupPipeline.start(tiny_release, ranks=2, device="cpu", hf_cache=tiny_release.parent / "hf-cache")
    try:
        os.kill(pipe.pids[1], signal.SIGKILL)  # our own child process, by its id
        time.sleep(0.2)
        with pytest.raises(RankGroupError, match="rank 1 exited"):
            pipe.render(RenderRequest(PROMPT), tmp_path / "x.mp4")
        with pytest.raises(RankGroupError, match="down"):
            pipe.render(RenderRequest(PROMPT), tmp_path / "y.mp4")
        assert not any(p.is_alive() for p in pipe._processes)
    finally:
        pipe.close()
