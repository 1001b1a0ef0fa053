"""The legacy FastH3 four-step adapter (worker/h3/legacy_adapter.py): fused parity with a hand-merged reference, its
own sampling ladder, refusal of tampered adapters (nothing written), refusal on a FastH3 V2 release."""

import json

import pytest
import torch

from h3batch.worker.h3.config import T2
from h3batch.worker.h3.legacy_adapter import (
    LegacyAdapterError,
    fuse_legacy_adapter,
    read_legacy_adapter,
    refuse_on_full_checkpoint,
    sigma_summary,
    write_legacy_adapter,
)
from h3batch.worker.h3.tiny_adapters import tiny_legacy_tensors, write_tiny_legacy_adapter
from tests.worker.h3.dit.dit_oracle import make_oracle, t2va_inputs
from tests.worker.h3.dit.test_dit_model import max_diff, native_from_oracle, run


def hand_merged(oracle_state: dict, tensors: dict) -> dict:
    """The reference: every adapter tensor added to the diffusers weight of the same name, in fp32 by hand."""
    merged = {k: v.clone() for k, v in oracle_state.items()}
    modules = {k.rsplit(".lora_", 1)[0] for k in tensors if ".lora_" in k}
    for module in modules:
        b, a = tensors[f"{module}.lora_B.weight"].float(), tensors[f"{module}.lora_A.weight"].float()
        merged[f"{module}.weight"] += b @ a
    for key, value in tensors.items():
        if key.endswith(".diff"):
            merged[key.removesuffix(".diff") + ".weight"] += value.float()
        elif key.endswith(".diff_b"):
            merged[key.removesuffix(".diff_b") + ".bias"] += value.float()
    return merged


def test_fused_adapter_equals_hand_merged_reference(tmp_path):
    """fp32 T2: the native DiT with the adapter fused has the weights and outputs of a DiT loaded from the diffusers
    checkpoint merged by hand (factors, norm diffs incl. q/k norms and the refiner's final norm, bias diffs)."""
    oracle = make_oracle(T2, seed=0)
    adapter = read_legacy_adapter(write_tiny_legacy_adapter(tmp_path / "a", T2, seed=1))
    reference = native_from_oracle(T2, oracle)
    from h3batch.worker.h3.loader import load_diffusers_weights

    load_diffusers_weights(reference, hand_merged(oracle.state_dict(), dict(adapter.tensors)))
    model = native_from_oracle(T2, oracle)
    base = run(model, t2va_inputs(T2))
    changed = fuse_legacy_adapter(model, adapter)
    assert {"token_refiner.final_norm.weight", "blocks.0.attn.q_norm.weight", "blocks.2.attn.k_norm.weight",
            "blocks.1.attn.qkv_proj.weight", "final_layer.video_out.bias"} <= changed
    ref_params = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        assert max_diff(param, ref_params[name]) <= 1e-6, name
    inputs = t2va_inputs(T2)
    video, audio = run(model, inputs)
    expected_video, expected_audio = run(reference, inputs)
    assert max_diff(video, base[0]) > 0.05
    assert max_diff(video, expected_video) <= 1e-5 and max_diff(audio, expected_audio) <= 1e-5


def test_adapter_sampling_replaces_the_release_ladder(tmp_path):
    """The stored DMD2 positions [999, 749, 500, 250] on the native shifts 12 / 3: four forwards, video
    0.999917…0.8, audio 0.999666…0.5, ending at 0."""
    adapter = read_legacy_adapter(write_tiny_legacy_adapter(tmp_path / "a", T2))
    ladder = adapter.sampling.ladder(12.0, 3.0)
    assert ladder.num_steps == 4 and adapter.sampling.vsa_topk is None
    assert ladder.video_sigmas.tolist() == pytest.approx([0.9999166, 0.9728325, 0.9230769, 0.8, 0.0], abs=1e-6)
    assert ladder.audio_sigmas.tolist() == pytest.approx([0.9996664, 0.8995196, 0.75, 0.5, 0.0], abs=1e-6)
    assert sigma_summary(ladder) == "video 0.999917…0.8, audio 0.999666…0.5"


def _tampered(tmp_path, change, **kwargs):
    tensors = tiny_legacy_tensors(T2, seed=2)
    change(tensors)
    return write_legacy_adapter(tmp_path / "bad", tensors, rank=4, **kwargs)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.update({"transformer_blocks.0.attn.to_z.diff": torch.zeros(4)}),
         "unknown key transformer_blocks.0.attn.to_z.diff"),
        (lambda t: t.update({"transformer_blocks.0.attn.to_q.lora_C": torch.zeros(4)}),
         "unknown key transformer_blocks.0.attn.to_q.lora_C"),
        (lambda t: t.update({"transformer_blocks.1.ff.net.2.lora_A.weight": torch.zeros(3, T2.ffn_hidden_size),
                             "transformer_blocks.1.ff.net.2.lora_B.weight": torch.zeros(T2.hidden_size, 3)}),
         "wrong rank at transformer_blocks.1.ff.net.2.lora_A.weight"),
        (lambda t: t.update({"transformer_blocks.0.attn.norm_q.diff": torch.zeros(T2.attention_head_dim + 1)}),
         "shape mismatch at transformer_blocks.0.attn.norm_q.diff"),
        (lambda t: t.update({"transformer_blocks.0.attn.to_k.lora_A.weight": torch.zeros(4, T2.hidden_size - 1)}),
         "shape mismatch at transformer_blocks.0.attn.to_k.lora_A.weight"),
        (lambda t: t.pop("transformer_blocks.2.ff.net.2.lora_B.weight"),
         "transformer_blocks.2.ff.net.2.lora_A.weight: its pair is missing"),
        (lambda t: [t.pop(k) for k in list(t) if k.startswith("transformer_blocks.2.")],
         "edits no tensor of transformer_blocks.2"),
    ],
    ids=["unknown-module", "unknown-role", "wrong-rank", "norm-shape", "factor-shape", "lone-factor", "missing-block"],
)
def test_tampered_adapter_is_refused_and_nothing_is_written(tmp_path, change, message):
    """Each tampered adapter stops with H3BATCH_ADAPTER and the first bad key; the DiT's weights are unchanged."""
    oracle = make_oracle(T2, seed=0)
    model = native_from_oracle(T2, oracle)
    before = {k: v.clone() for k, v in model.named_parameters()}
    with pytest.raises(LegacyAdapterError, match=f"^H3BATCH_ADAPTER: .*{message}"):
        fuse_legacy_adapter(model, read_legacy_adapter(_tampered(tmp_path, change)))
    assert all(torch.equal(v, before[k]) for k, v in model.named_parameters())


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda folder: (folder / "adapter_manifest.json").unlink(), "adapter_manifest.json is missing"),
        (lambda folder: (folder / "adapter_manifest.json").write_text(json.dumps(
            {"sampling": {"dmd_denoising_steps": [250, 500]}})), "strictly decreasing"),
    ],
    ids=["no-manifest", "bad-steps"],
)
def test_bad_manifest_is_refused(tmp_path, edit, message):
    """A folder without its manifest, or with a schedule that is not a DMD2 ladder, is refused by name."""
    folder = write_tiny_legacy_adapter(tmp_path / "a", T2)
    edit(folder)
    with pytest.raises(LegacyAdapterError, match=message):
        read_legacy_adapter(folder)


def test_declared_counts_and_identity_are_checked(tmp_path):
    """A file whose metadata count disagrees with its tensors, or that is not a FastVideo FastH3 student, is refused."""
    with pytest.raises(LegacyAdapterError, match="diff_tensors='1' but the file holds"):
        read_legacy_adapter(_tampered(tmp_path, lambda t: None, extra_metadata={"diff_tensors": "1"}))
    with pytest.raises(LegacyAdapterError, match="is not a FastVideo FastH3 student"):
        read_legacy_adapter(write_legacy_adapter(tmp_path / "x", tiny_legacy_tensors(T2), rank=4,
                                                 identity="someone/style-lora"))


def test_refused_on_a_v2_release():
    """V2 is a full checkpoint: the adapter is refused with a message naming the variable and the release kind."""
    with pytest.raises(LegacyAdapterError, match="^H3BATCH_ADAPTER: the served release is 'v2'"):
        refuse_on_full_checkpoint("v2")
    refuse_on_full_checkpoint("native")
