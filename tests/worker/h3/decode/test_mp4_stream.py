"""Mp4Writer: chunked and background-thread writes, BT.709 conversion and tags, failure clean-up (worker/h3/mp4.py)."""
from __future__ import annotations

import os

import av
import numpy as np
import pytest
import torch

from h3batch.worker.h3.mp4 import Mp4Writer, probe_mp4, rgb_to_yuv420_bt709, write_mp4
from tests.worker.h3.decode.test_mp4 import decoded_audio, decoded_frames, gradient_frames, tones


def reference_yuv420(frames: np.ndarray) -> np.ndarray:
    """float64 BT.709 limited-range Y'CbCr 4:2:0 straight from the Rec. 709 formulas, packed as [n, 3H/2, W]."""
    rgb = frames.astype(np.float64) / 255.0
    y = 0.2126 * rgb[..., 0] + 0.7152 * rgb[..., 1] + 0.0722 * rgb[..., 2]
    cb, cr = (rgb[..., 2] - y) / 1.8556, (rgb[..., 0] - y) / 1.5748
    n, h, w = y.shape

    def sub(c):
        return c.reshape(n, h // 2, 2, w // 2, 2).mean(axis=(2, 4)).reshape(n, -1)

    planes = np.concatenate([(16 + 219 * y).reshape(n, -1), 128 + 224 * sub(cb), 128 + 224 * sub(cr)], axis=1)
    return np.clip(np.round(planes), 0, 255).astype(np.uint8).reshape(n, h * 3 // 2, w)


def test_bt709_conversion_matches_the_formula_within_one_level():
    """rgb_to_yuv420_bt709 equals the float64 Rec. 709 limited-range formulas within one code value, and maps
    white to Y 235 / C 128 and black to Y 16."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(3, 16, 24, 3), dtype=np.uint8)
    frames[0] = 255
    frames[1] = 0
    out = rgb_to_yuv420_bt709(torch.from_numpy(frames)).numpy()
    assert out.shape == (3, 24, 24) and out.dtype == np.uint8
    assert np.abs(out.astype(int) - reference_yuv420(frames).astype(int)).max() <= 1
    white, black = out[0].reshape(-1), out[1].reshape(-1)
    assert (white[: 16 * 24] == 235).all() and (white[16 * 24:] == 128).all()
    assert (black[: 16 * 24] == 16).all() and (black[16 * 24:] == 128).all()


@pytest.mark.parametrize("background", [False, True])
def test_chunked_writer_equals_one_shot_write(tmp_path, background):
    """Frames fed in uneven chunks (on the writer's thread or inline) give the same decoded pictures and audio as
    write_mp4 of the whole clip, with the stream tagged BT.709 limited range."""
    frames, audio = gradient_frames(39, 128, 256), tones(800 * 65)
    whole = write_mp4(tmp_path / "whole.mp4", frames, audio, preset="veryfast")
    with Mp4Writer(tmp_path / "chunks.mp4", 256, 128, audio, preset="veryfast", background=background,
                   queue_chunks=1) as writer:
        for start, stop in ((0, 5), (5, 22), (22, 39)):
            writer.add_frames(torch.from_numpy(frames[start:stop]))
        path = writer.finish()
    assert np.array_equal(decoded_frames(path), decoded_frames(whole))
    assert np.array_equal(decoded_audio(path), decoded_audio(whole))
    assert sorted(os.listdir(tmp_path)) == ["chunks.mp4", "whole.mp4"]
    with av.open(os.fspath(path)) as container:
        context = container.streams.video[0].codec_context
        assert (context.color_primaries, context.color_trc, context.colorspace, context.color_range) == (1, 1, 1, 1)
    assert probe_mp4(path)["frames"] == 39


def test_cpu_and_torch_conversions_decode_alike(tmp_path):
    """The two BT.709 routes (swscale for CPU frames, rgb_to_yuv420_bt709 for GPU frames, here fed pre-converted
    planes) give decoded pictures within a few levels of each other and of the input on smooth content."""
    frames, audio = gradient_frames(12, 128, 256), tones(800 * 20)
    cpu = write_mp4(tmp_path / "cpu.mp4", frames, audio)
    with Mp4Writer(tmp_path / "torch.mp4", 256, 128, audio) as writer:
        writer._encode(("yuv420p", rgb_to_yuv420_bt709(torch.from_numpy(frames)).numpy()))
        path = writer.finish()
    a, b = decoded_frames(cpu).astype(int), decoded_frames(path).astype(int)
    assert np.abs(a - b).mean() < 1.5 and np.abs(b - frames).mean() < 3.0


def test_presets_change_the_encode_not_the_contract(tmp_path):
    """ultrafast and medium both write a valid H.264 yuv420p clip; their bitstreams differ (the preset is applied)."""
    frames, audio = gradient_frames(10, 64, 64), tones(800 * 17)
    fast = write_mp4(tmp_path / "fast.mp4", frames, audio, preset="ultrafast")
    slow = write_mp4(tmp_path / "slow.mp4", frames, audio, preset="medium")
    assert probe_mp4(fast)["frames"] == probe_mp4(slow)["frames"] == 10
    assert fast.read_bytes() != slow.read_bytes()


def test_worker_thread_error_aborts_and_leaves_nothing(tmp_path):
    """An encode error on the background thread reaches the caller (at the next add_frames or at finish), and
    leaving the block leaves no target or temp file."""

    def broken(planes):
        raise RuntimeError("encoder broke")

    with pytest.raises(RuntimeError, match="encoder broke"):
        with Mp4Writer(tmp_path / "out.mp4", 64, 64, tones(800 * 9), background=True) as writer:
            writer._encode = broken  # every chunk fails on the worker thread
            for _ in range(3):
                writer.add_frames(gradient_frames(3, 64, 64))
            writer.finish()
    assert os.listdir(tmp_path) == []


def test_finish_adds_late_tags(tmp_path):
    """Tags given to finish (stage timings known only at the end) are in the container with the opening ones."""
    with Mp4Writer(tmp_path / "out.mp4", 64, 64, tones(800 * 9), metadata={"job_id": "j1"}, background=True) as w:
        w.add_frames(gradient_frames(4, 64, 64))
        path = w.finish(metadata={"h3batch_stage_seconds": "decode=1.0000"})
    tags = probe_mp4(path)["metadata"]
    assert tags["job_id"] == "j1" and tags["h3batch_stage_seconds"] == "decode=1.0000"


def test_leaving_the_block_without_finish_removes_the_temp(tmp_path):
    """An exception inside the `with` block aborts: no target, no temp file; wrong-sized frames are refused."""
    with pytest.raises(ValueError, match="the stream is 64x64"):
        with Mp4Writer(tmp_path / "out.mp4", 64, 64, tones(800 * 9), background=True) as writer:
            writer.add_frames(gradient_frames(2, 64, 64))
            writer.add_frames(gradient_frames(2, 32, 64))
    assert os.listdir(tmp_path) == []
