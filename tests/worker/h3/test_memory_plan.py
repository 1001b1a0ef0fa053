"""The memory plan (worker/h3/memory_plan.py): part sizes against the real module classes, the calibration against
the H200 measurements, the placement it chooses, max_rows and the longest clip, the docs table and the command."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3 import memory_plan as mp
from h3batch.worker.h3.config import H3_33B

REPO = Path(__file__).resolve().parents[3]
GIB = mp.GIB


def module_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def test_dit_bytes_match_the_module_built_on_meta():
    """dit_bytes (bf16 + the fp32 projections, time MLP and heads) equals the V2 H3Transformer's own bytes, and
    the parameters are the 65.3 GiB of spec §12."""
    from h3batch.worker.h3.model import H3Transformer

    config = H3_33B.with_gates(True)
    with torch.device("meta"):
        model = H3Transformer(config, dtype=torch.bfloat16)
    assert mp.dit_bytes(config) == module_bytes(model)
    assert mp.v2_sizes().dit == module_bytes(model)
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == 70_133_946_880


def test_text_stack_bytes_match_qwen3_vl_at_real_width():
    """The formula equals the language model of Qwen3-VL-32B's text config kept to 50 layers, built on meta; the
    largest streamed unit is the embedding table."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from h3batch.worker.h3.text_encoder import TextEncoder
    from h3batch.worker.h3.tiny_configs import TINY_TEXT_ENCODER

    text = dict(TINY_TEXT_ENCODER["text_config"], **mp.V2_TEXT_CONFIG, num_hidden_layers=mp.V2_TEXT_KEPT_LAYERS,
                rope_parameters=dict(TINY_TEXT_ENCODER["text_config"]["rope_parameters"], mrope_section=[24, 20, 20]))
    config = Qwen3VLConfig(**dict(TINY_TEXT_ENCODER, text_config=text))
    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16)
    stack = TextEncoder(model, None, mp.V2_TEXT_KEPT_LAYERS).text_stack  # as served: the final norm is an identity
    total, unit = mp.text_stack_bytes(mp.V2_TEXT_CONFIG, mp.V2_TEXT_KEPT_LAYERS)
    params = sum(p.numel() * p.element_size() for p in stack.parameters())
    assert total == params
    assert unit == max(module_bytes(stack.embed_tokens), *(module_bytes(layer) for layer in stack.layers))
    assert 46.8 < total / GIB < 46.9


def test_vae_constants_match_the_diffusers_classes():
    """The served video decoder (encoder and quant_conv dropped, the fp32-pinned modules kept) and the audio VAE
    have the parameter counts the plan uses."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    with torch.device("meta"):
        video, audio = AutoencoderKLMiniMaxH3(), AutoencoderKLMiniMaxH3Audio()
    keep = tuple(video._keep_in_fp32_modules)
    decoder = [(n, p) for n, p in video.named_parameters() if not n.startswith(("encoder.", "quant_conv."))]
    assert sum(p.numel() for _, p in decoder) == mp.V2_VIDEO_DECODER_PARAMS
    assert sum(p.numel() for n, p in decoder if any(k in n.split(".") for k in keep)) == mp.V2_VIDEO_DECODER_FP32_PARAMS
    assert sum(p.numel() for p in audio.parameters()) == mp.V2_AUDIO_VAE_PARAMS


def test_calibration_reproduces_the_h200_measurements():
    """The plan's weights + activations give back the measured peaks of bench/memory.py (4.4 s and 15 s)."""
    sizes, cal = mp.v2_sizes(), mp.H200_CALIBRATION
    weights = sizes.dit + sizes.video_vae + sizes.audio_vae + cal.weights_overhead
    for m in mp.H200_MEASURED:
        assert abs((weights + cal.activations(m.rows)) / GIB - m.denoise_gib) < 0.05
        assert (weights + cal.decode_per_tile * m.tiles_per_chunk) / GIB >= m.decode_gib - 0.05
    assert abs(weights / GIB - mp.H200_MEASURED[0].before_gib) < 0.05
    assert cal.act_per_row > 0 and cal.act_per_row_sq > 0


def test_one_h200_cannot_keep_the_encoder_beside_a_15_s_clip_and_offloads_it():
    """ranks = 1: with the encoder resident the longest 1344x768 clip is under 15 s; auto offloads it and then
    serves 15 s (max_rows covers 15 s with the longest prompt) and keeps the encoder for shorter clips."""
    sizes = mp.v2_sizes()
    resident = mp.plan(sizes, gpu_bytes=mp.H200_BYTES, ranks=1, placement="resident")
    auto = mp.plan(sizes, gpu_bytes=mp.H200_BYTES, ranks=1)
    fifteen = mp.clip_rows(1344, 768, 15.0)
    assert resident.max_rows < fifteen and 4.4 <= resident.seconds_served < 15.0
    assert auto.placement == "offload" and auto.max_rows >= fifteen and auto.seconds_served == 15.0
    assert auto.keep_encoder_max_rows == resident.max_rows
    assert auto.per_rank[0].weights + auto.per_rank[0].text_visit <= mp.H200_BYTES - mp.H200_CALIBRATION.reserve
    forced = mp.plan(sizes, gpu_bytes=mp.H200_BYTES, ranks=1, placement="offload")
    assert forced.keep_encoder_max_rows == 0  # a forced offload never keeps the copy


def test_four_h200s_keep_the_encoder_resident_on_rank_0():
    """ranks = 4: rank 0 holds DiT + encoder + VAEs and still serves 15 s; ranks 1..3 hold the DiT only."""
    p = mp.plan(mp.v2_sizes(), gpu_bytes=mp.H200_BYTES, ranks=4)
    assert p.placement == "resident" and p.seconds_served == 15.0
    assert [r.text_encoder for r in p.per_rank] == ["gpu", "-", "-", "-"]
    assert [r.vaes for r in p.per_rank] == ["gpu", "-", "-", "-"]
    assert p.max_rows == p.per_rank[0].max_rows < p.per_rank[1].max_rows
    assert p.per_rank[0].headroom < p.per_rank[1].headroom


def test_a_smaller_gpu_streams_the_encoder_and_an_80_gb_one_serves_nothing():
    """A 96 GiB GPU cannot take the whole encoder beside the DiT even while encoding: auto streams it. On an 80 GB
    GPU the DiT and VAEs alone leave no room: max_rows 0 whatever the placement."""
    p = mp.plan(mp.v2_sizes(), gpu_bytes=96 * GIB, ranks=1)
    assert p.placement == "stream" and mp.clip_rows(1344, 768, 4.0) < p.max_rows
    assert mp.plan(mp.v2_sizes(), gpu_bytes=96 * GIB, placement="offload").max_rows == 0
    assert all(mp.plan(mp.v2_sizes(), gpu_bytes=80 * 10**9, placement=placement).max_rows == 0
               for placement in mp.PLACEMENTS)


@pytest.mark.parametrize("gpu_gib", [100, 139.8, 200])
def test_max_rows_is_the_largest_that_fits_and_the_longest_clip_follows(gpu_gib):
    """Every stage fits at max_rows and the denoise would not at max_rows + 1; the longest clip is the last frame
    count whose rows fit."""
    p = mp.plan(mp.v2_sizes(), gpu_bytes=int(gpu_gib * GIB), ranks=1)
    rank, cal = p.per_rank[0], p.calibration
    budget = p.gpu_bytes - cal.reserve - cal.act_per_row
    assert rank.weights + cal.activations(p.max_rows) <= budget < rank.weights + cal.activations(p.max_rows + 1)
    seconds = p.seconds_by_memory
    frames = round(seconds * 24)
    assert mp.clip_rows(1344, 768, frames / 24) <= p.max_rows < mp.clip_rows(1344, 768, (frames + 17) / 24)


def test_tile_count_matches_the_vae_tiling():
    """tiles_per_chunk equals the number of tiles decode.py lays over the canvas (diffusers' _split_tiles)."""
    from diffusers import AutoencoderKLMiniMaxH3

    from h3batch.worker.h3 import decode
    from h3batch.worker.h3.tiny_configs import TINY_VIDEO_VAE

    vae = AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE)
    for width, height in ((1344, 768), (768, 1344), (768, 768), (1536, 672), (256, 128), (320, 288)):
        RequestGeometry(width, height, 4.0)
        rows, _, _ = decode._tile_layout(vae, height // 16, width // 16)
        assert mp.tiles_per_chunk(width, height) == sum(len(row) for row in rows)
    assert mp.tiles_per_chunk(1344, 768) == 28


def test_prompt_rows_match_the_encoder_limit():
    from h3batch.worker.h3.text_encoder import MAX_PROMPT_TOKENS

    assert mp.MAX_TEXT_ROWS == MAX_PROMPT_TOKENS


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="expected one of auto, resident, offload, stream"):
        mp.plan(mp.v2_sizes(), gpu_bytes=mp.H200_BYTES, placement="gpu")
    with pytest.raises(ValueError, match="ranks"):
        mp.plan(mp.v2_sizes(), gpu_bytes=mp.H200_BYTES, ranks=0)


def test_docs_performance_holds_the_generated_table():
    """docs/performance.md carries `h3batch memory-plan --docs` between its markers."""
    text = (REPO / "docs" / "performance.md").read_text()
    begin, end = "<!-- memory-plan:begin -->", "<!-- memory-plan:end -->"
    assert text[text.index(begin) + len(begin):text.index(end)].strip() == mp.v2_table().strip()


def test_command_prints_both_rank_counts_and_refuses_a_bad_size():
    done = subprocess.run([sys.executable, "-P", "-m", "h3batch", "memory-plan"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "1 × 139.8 GiB, text encoder `offload`" in done.stdout and "4 × 139.8 GiB" in done.stdout
    assert "max_rows" in done.stdout
    bad = subprocess.run([sys.executable, "-P", "-m", "h3batch", "memory-plan", "--size", "100x7"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--size" in bad.stderr
