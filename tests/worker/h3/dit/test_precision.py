"""H3BATCH_PRECISION (worker/h3/precision.py): bf16 is the default and changes nothing; fp8 is opt-in, replaces the
DiT block linears only, and its error at the output is bounded at tiny size on the CPU (the fake-quant reference);
a bad value is refused at start naming the field. Real-size figures: docs/performance.md "FP8 precision"."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from h3batch.settings import ConfigError, Settings
from h3batch.worker.h3 import decode, packing
from h3batch.worker.h3.config import T2
from h3batch.worker.h3.loader import load_diffusers_weights
from h3batch.worker.h3.model import H3Transformer
from h3batch.worker.h3.precision import FP8_LINEARS, Fp8Linear, apply_precision, precision_of
from h3batch.worker.pipeline import Pipeline, RenderRequest
from tests.worker.h3.dit.dit_oracle import gate_tensors, make_oracle, t2va_inputs

PROMPT = "a red fox runs through snow"


def _bf16_model(seed: int = 0) -> H3Transformer:
    oracle = make_oracle(T2, seed=seed)
    model = H3Transformer(T2.with_gates(True), dtype=torch.bfloat16).eval()
    load_diffusers_weights(model, {**oracle.state_dict(), **gate_tensors(T2, seed=5)})
    return model


def _run(model, inputs):
    with torch.no_grad():
        return model(**inputs.kwargs())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_bf16_is_the_default_and_leaves_the_model_bit_identical():
    assert Settings().precision == "bf16" and Settings.from_env({}).precision == "bf16"
    model, twin = _bf16_model(), _bf16_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert apply_precision(model, "bf16") is model and precision_of(model) == "bf16"
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    inputs = t2va_inputs(T2)
    for got, want in zip(_run(model, inputs), _run(twin, inputs)):
        assert torch.equal(got, want)


def test_fp8_replaces_the_block_linears_only_and_bounds_the_error_of_one_forward():
    model, reference = _bf16_model(), _bf16_model()
    apply_precision(model, "fp8")
    assert precision_of(model) == "fp8"
    for block in model.blocks:
        for path in FP8_LINEARS:
            assert isinstance(block.get_submodule(path), Fp8Linear), path
        assert isinstance(block.adaln_proj.linear, nn.Linear)  # M = 1: stays bf16
        assert not any(n.endswith("weight") and p.dtype != torch.bfloat16 and "norm" not in n
                       for n, p in block.named_parameters())  # the bf16 weights of replaced linears are gone
    assert all(isinstance(m, nn.Linear) for m in model.token_refiner.modules() if "Linear" in type(m).__name__)
    inputs = t2va_inputs(T2)
    (video, audio), (video_ref, audio_ref) = _run(model, inputs), _run(reference, inputs)
    assert torch.isfinite(video).all() and torch.isfinite(audio).all()
    # Measured here: 1.12e-2 (video) and 1.24e-2 (audio) relative Frobenius; bf16 vs itself is 0.
    assert 1e-3 < _rel(video, video_ref) < 5e-2 and 1e-3 < _rel(audio, audio_ref) < 5e-2


@pytest.mark.parametrize("value", ["fp16", "FP4", "int8"])
def test_a_bad_precision_is_refused_at_start_naming_the_field(value, tmp_path):
    with pytest.raises(ConfigError, match="H3BATCH_PRECISION: expected one of bf16, fp8"):
        Settings.from_env({"H3BATCH_PRECISION": value})
    # The pipeline checks it before it reads the release: a missing release is not what it reports.
    with pytest.raises(ValueError, match="H3BATCH_PRECISION: expected one of"):
        Pipeline.load(tmp_path / "no-release", device="cpu", precision=value)
    with pytest.raises(ValueError, match="H3BATCH_PRECISION"):
        apply_precision(_bf16_model(), value)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from h3batch.worker.h3.tiny_release import build_tiny_release

    base = tmp_path_factory.mktemp("precision")
    return build_tiny_release(base / "release", base / "hf-cache").release_dir


def _frames(pipe: Pipeline, clip) -> torch.Tensor:
    geo = clip.geometry
    latents = packing.unpatchify_video(clip.video, geo.latent_frames, geo.latent_height, geo.latent_width)
    return torch.cat(list(decode.iter_video_frames(pipe.video_vae, latents, tile_batch=0)))


def test_fp8_pipeline_error_at_the_output_after_8_steps_is_bounded(release, monkeypatch):
    """The tiny release loaded twice on the CPU, bf16 (default) and fp8: the same request and seed give final
    latents within the stated error and decoded frames above the stated PSNR; fp8 is really on (they differ)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    req = RenderRequest(prompt=PROMPT, seconds=4.0, width=64, height=64, seed=3)
    clips, frames = {}, {}
    for precision in ("bf16", "fp8"):
        kwargs = {} if precision == "bf16" else {"precision": "fp8"}
        pipe = Pipeline.load(release, device="cpu", hf_cache=release.parent / "hf-cache", **kwargs)
        assert pipe.precision == precision
        clips[precision] = pipe.denoise(req)
        frames[precision] = _frames(pipe, clips[precision])
    # The warm-up runs the first block only and gives every block back, the same modules in the same order.
    blocks = list(pipe.dit.blocks)
    pipe.warm_up([req])
    assert list(pipe.dit.blocks) == blocks and len(blocks) == pipe.dit.config.num_layers
    video_err = _rel(clips["fp8"].video, clips["bf16"].video)
    audio_err = _rel(clips["fp8"].audio, clips["bf16"].audio)
    mse = (frames["fp8"].double() - frames["bf16"].double()).pow(2).mean().item()
    psnr = math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)
    print(f"tiny fp8 vs bf16 after 8 steps: video latents {video_err:.3e}, audio latents {audio_err:.3e}, "
          f"frames PSNR {psnr:.2f} dB")
    assert 1e-4 < video_err < 5e-2 and 1e-4 < audio_err < 5e-2
    assert 40.0 < psnr < math.inf
