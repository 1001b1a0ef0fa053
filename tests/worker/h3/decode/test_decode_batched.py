"""Batched-tile, chunk-streamed video decode and the fp16 decoder-only copy (worker/h3/decode.py), on CPU."""
from __future__ import annotations

import math

import pytest
import torch

from h3batch.worker.h3.decode import decode_video, iter_video_frames, prepare_video_decoder
from tests.worker.h3.decode.test_decode import video_latents

FP16_MIN_PSNR_DB = 50.0
"""Stated tolerance of the fp16-weight decoder against the fp32-weight decode on the same latents (tiny VAE on CPU:
79 dB measured; at real size on the H200 see docs/benchmarks.md)."""


def psnr_db(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def test_one_tile_per_call_is_bit_identical_to_vae_decode(tiny_video_vae):
    """With one tile per decoder call the re-traced chunking and tile stitching give exactly diffusers' frames on a
    canvas of 2x2 tiles and two temporal chunks."""
    latents = video_latents(12, 24, 24, seed=11)  # 384x384 px: 2x2 tiles (tiny VAE: 256-px tiles)
    reference = decode_video(tiny_video_vae, latents)
    assert reference.shape == (39, 384, 384, 3)
    assert torch.equal(decode_video(tiny_video_vae, latents, tile_batch=1), reference)


@pytest.mark.parametrize("tile_batch", [0, 4, 100])
def test_batched_tiles_equal_per_tile_decode(tiny_video_vae, tile_batch):
    """Stacking tiles (a whole chunk, 4 at a time, or every chunk's tiles in one call) changes only the matmul
    blocking: the frames equal the per-tile decode except for rare one-level rounding flips."""
    latents = video_latents(12, 24, 24, seed=12)
    reference = decode_video(tiny_video_vae, latents)
    frames = decode_video(tiny_video_vae, latents, tile_batch=tile_batch)
    diff = (frames.int() - reference.int()).abs()
    assert frames.shape == reference.shape
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-5


def test_chunks_stream_in_order_before_the_rest_is_decoded(tiny_video_vae):
    """iter_video_frames yields the first chunk's frames after one decoder call; all chunks together are the whole
    clip (17n+5 frames)."""
    latents = video_latents(17, 8, 16, seed=13)  # one tile, 3 temporal chunks -> 56 frames
    calls = []
    handle = tiny_video_vae.decoder.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    try:
        chunks = iter_video_frames(tiny_video_vae, latents)
        first = next(chunks)
        assert len(calls) == 1
        rest = list(chunks)
    finally:
        handle.remove()
    assert len(calls) == 3 and first.dtype == torch.uint8
    whole = torch.cat([first, *rest])
    assert [c.shape[0] for c in (first, *rest)] == [17, 17, 17, 5]
    assert torch.equal(whole, decode_video(tiny_video_vae, latents, tile_batch=0))


def test_fp16_decoder_only_copy_is_within_tolerance(tiny_video_vae):
    """prepare_video_decoder drops the encoder and casts the unpinned weights to fp16 (norms and residual scales
    stay fp32); its frames are within FP16_MIN_PSNR_DB of the fp32-weight decode and the original VAE is untouched."""
    latents = video_latents(7, 24, 24, seed=14)
    reference = decode_video(tiny_video_vae, latents)
    decoder = prepare_video_decoder(tiny_video_vae, torch.float16, copy_module=True)
    assert decoder.encoder is None and decoder.quant_conv is None
    assert tiny_video_vae.encoder is not None and tiny_video_vae.decoder.proj_out.weight.dtype == torch.float32
    block = decoder.decoder.transformer_blocks[0]
    assert block.attn.to_q.weight.dtype == torch.float16 and decoder.decoder.proj_out.weight.dtype == torch.float16
    assert block.norm1.weight.dtype == block.scale1.dtype == torch.float32
    frames = decode_video(decoder, latents, tile_batch=0)
    assert psnr_db(frames, reference) >= FP16_MIN_PSNR_DB


def test_rejects_negative_tile_batch(tiny_video_vae):
    """A negative tile batch is refused before any decoding."""
    with pytest.raises(ValueError, match="tile_batch must be >= 0"):
        next(iter_video_frames(tiny_video_vae, video_latents(7, 8, 16), tile_batch=-1))
