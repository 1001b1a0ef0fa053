"""The pipeline with its text encoder resident, offloaded and streamed renders the same MP4 frames (tiny release,
CPU), and `Pipeline.load` makes, logs and keeps the memory plan that placed it."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from h3batch.worker.h3.text_placement import HostedTextEncoder, place_text_encoder
from h3batch.worker.pipeline import Pipeline, RenderRequest
from tests.worker.test_rank_group import decoded

PROMPT = "a red fox runs through snow"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from h3batch.worker.h3.tiny_release import build_tiny_release

    base = tmp_path_factory.mktemp("placement")
    return build_tiny_release(base / "release", base / "hf-cache").release_dir


def test_resident_offloaded_and_streamed_encoders_render_the_same_frames(release, tmp_path, caplog, monkeypatch):
    """Load with `text_placement="offload"` (the plan records it and logs its table), render; place the same
    encoder resident and streamed and render again: decoded frames and audio are identical, and the hosted encoder
    is off the device after each job (a forced offload never keeps it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level(logging.INFO, logger="h3batch.pipeline"):
        pipe = Pipeline.load(release, device="cpu", hf_cache=release.parent / "hf-cache", text_placement="offload")
    plan = pipe.memory_plan
    assert plan.placement == "offload" and plan.requested == "offload" and plan.keep_encoder_max_rows == 0
    assert plan.max_rows > 0 and plan.canvas == (256, 128)
    assert any("memory plan" in r.getMessage() and "max_rows" in r.getMessage() for r in caplog.records)
    hosted = pipe.text_encoder
    assert isinstance(hosted, HostedTextEncoder)
    encoder = hosted.encoder

    req = RenderRequest(prompt=PROMPT, seconds=4.0, width=64, height=64, seed=3)  # small: three renders
    outputs = {}
    for mode in ("offload", "resident", "stream"):
        if mode != "offload":
            pipe.text_encoder = place_text_encoder(encoder, "cpu", mode)
        result = pipe.render(req, tmp_path / f"{mode}.mp4")
        outputs[mode] = decoded(result.path)
        if mode != "resident":
            assert not pipe.text_encoder.on_device
    frames, audio = outputs["resident"]
    assert frames.shape == (107, 64, 64, 3) and frames.std() > 1.0
    for mode in ("offload", "stream"):
        assert np.array_equal(outputs[mode][0], frames) and np.array_equal(outputs[mode][1], audio)


def test_auto_placement_on_the_cpu_keeps_the_tiny_encoder_resident(release, monkeypatch):
    """With the host's memory as the device's, the tiny release fits everywhere: auto keeps it resident."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pipe = Pipeline.load(release, device="cpu", hf_cache=release.parent / "hf-cache")
    assert pipe.memory_plan.placement == "resident" and pipe.memory_plan.seconds_served == 15.0
    assert not isinstance(pipe.text_encoder, HostedTextEncoder)
