"""Native DiT vs the diffusers oracle on CUDA with the Triton modulation kernels (SM90 path on H200)."""

import dataclasses

import pytest
import torch

from h3batch.worker.h3.config import H3_33B, T2
from h3batch.worker.h3.loader import load_diffusers_weights
from h3batch.worker.h3.model import H3Transformer
from tests.worker.h3.dit.dit_oracle import make_oracle, oracle_forward, oracle_to_mixed_bf16, t2va_inputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (Triton kernels)")

BF16_ATOL = 5e-2  # spec §13.3

# Every 33B width (hidden 5376, 56 x 128 heads, ffn 14336, text 5120, time 256/5376/2688, 16 RoPE freqs), one block.
ONE_BLOCK_33B = dataclasses.replace(H3_33B, num_layers=1, token_refiner_num_layers=1)


def _bf16_pair(config, inputs):
    oracle = make_oracle(config, seed=0, device="cuda")
    with torch.device("cuda"):
        model = H3Transformer(config, dtype=torch.bfloat16).eval()
    load_diffusers_weights(model, oracle.state_dict())
    expected = oracle_forward(oracle_to_mixed_bf16(oracle), inputs)
    with torch.no_grad():
        got = model(**inputs.kwargs())
    return got, expected


@pytest.mark.parametrize(
    "config, layout",
    [
        (T2, {}),
        (ONE_BLOCK_33B, {"text_rows": 30, "audio_latents": 40, "latent_frames": 4, "latent_height": 16,
                         "latent_width": 32}),
    ],
    ids=["T2", "33B-width-one-block"],
)
def test_cuda_bf16_parity_with_diffusers(config, layout):
    """bf16 native on CUDA (Triton kernels) vs the mixed-precision bf16 oracle on CUDA: both heads within 5e-2."""
    inputs = t2va_inputs(config, **layout).to("cuda")
    (video, audio), (expected_video, expected_audio) = _bf16_pair(config, inputs)
    video_diff = (video - expected_video).abs().max().item()
    audio_diff = (audio - expected_audio).abs().max().item()
    print(f"{config.hidden_size=} video max|diff| {video_diff:.3e} (std {expected_video.std():.3f}), "
          f"audio max|diff| {audio_diff:.3e} (std {expected_audio.std():.3f})")
    assert video.dtype == audio.dtype == torch.float32
    assert video_diff <= BF16_ATOL and audio_diff <= BF16_ATOL
