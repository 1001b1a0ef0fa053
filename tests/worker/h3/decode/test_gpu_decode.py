"""CUDA paths of the P2 decode: compiled fp16 decoder and GPU-side BT.709 conversion (skipped without a GPU)."""
from __future__ import annotations

import pytest
import torch

from h3batch.worker.h3.decode import decode_video, prepare_video_decoder
from h3batch.worker.h3.mp4 import Mp4Writer, probe_mp4
from tests.worker.h3.decode.test_decode import video_latents
from tests.worker.h3.decode.test_decode_batched import FP16_MIN_PSNR_DB, psnr_db
from tests.worker.h3.decode.test_mp4 import decoded_frames, gradient_frames, tones

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_compiled_fp16_decoder_on_cuda_is_within_tolerance(tiny_video_vae):
    """The served form (fp16 weights, compiled blocks, batched tiles) on CUDA stays within FP16_MIN_PSNR_DB of
    the fp32-weight per-tile decode of the same latents."""
    latents = video_latents(12, 24, 24, seed=21).cuda()
    fp32 = prepare_video_decoder(tiny_video_vae, None, copy_module=True).cuda()
    reference = decode_video(fp32, latents)
    served = prepare_video_decoder(fp32, torch.float16, compile_blocks=True, copy_module=True)
    frames = decode_video(served, latents, tile_batch=0)
    assert frames.shape == reference.shape and psnr_db(frames, reference) >= FP16_MIN_PSNR_DB


def test_gpu_frames_mux_like_cpu_frames(tmp_path):
    """Frames handed over on the GPU (converted there) decode within a few levels of the same frames from the CPU."""
    frames, audio = gradient_frames(20, 128, 256), tones(800 * 30)
    paths = []
    for name, tensor in (("cpu", torch.from_numpy(frames)), ("gpu", torch.from_numpy(frames).cuda())):
        with Mp4Writer(tmp_path / f"{name}.mp4", 256, 128, audio, background=True) as writer:
            writer.add_frames(tensor)
            paths.append(writer.finish())
    a, b = (decoded_frames(p).astype(int) for p in paths)
    assert probe_mp4(paths[1])["frames"] == 20 and abs(a - b).mean() < 1.5
