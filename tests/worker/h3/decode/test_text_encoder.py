"""TextEncoder against an independently run tiny Qwen3-VL (spec §8)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

from h3batch.worker.h3.text_encoder import MAX_PROMPT_TOKENS, TextEncoder
from h3batch.worker.h3.tiny_configs import TINY_TEXT_DIM, TINY_TEXT_HIDDEN_LAYER

PROMPT = "A red fox runs across a snowy field at dawn, while rain falls on a tin roof."


@pytest.fixture(scope="module")
def encoder(tiny_text_dirs):
    text_dir, tok_dir = tiny_text_dirs
    return TextEncoder.load(text_dir, tok_dir, TINY_TEXT_HIDDEN_LAYER, "cpu")


@pytest.fixture(scope="module")
def full_model(tiny_text_dirs):
    """The whole stored model (all layers), loaded without any TextEncoder logic."""
    return Qwen3VLForConditionalGeneration.from_pretrained(tiny_text_dirs[0], dtype=torch.bfloat16).eval()


def reference_residual(model, token_ids: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual after decoder layer ``layer - 1`` captured by a forward hook, and the final normed output."""
    captured = {}
    block = model.model.language_model.layers[layer - 1]
    handle = block.register_forward_hook(lambda _m, _i, out: captured.setdefault("h", out.detach().clone()))
    try:
        with torch.no_grad():
            ids = torch.tensor([token_ids])
            out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        handle.remove()
    return captured["h"], out.last_hidden_state


def test_features_equal_pre_norm_residual_of_layer(encoder, full_model, tiny_text_dirs):
    """encode() returns exactly the residual after decoder layer hidden_layer-1 of the full-depth model, not a normed one."""
    features, length = encoder.encode(PROMPT)
    tokenizer = AutoTokenizer.from_pretrained(tiny_text_dirs[1])
    token_ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    residual, final_normed = reference_residual(full_model, token_ids, TINY_TEXT_HIDDEN_LAYER)

    assert features.shape == (1, length, TINY_TEXT_DIM)
    assert features.dtype == torch.bfloat16
    assert torch.equal(features, residual)
    normed = full_model.model.language_model.norm(features)
    assert not torch.allclose(features.float(), normed.float(), atol=1e-2)
    assert not torch.allclose(features.float(), final_normed.float(), atol=1e-2)


def test_length_is_verbatim_token_count_without_special_tokens(encoder, tiny_text_dirs):
    """L equals the token count of the prompt with add_special_tokens=False (the tokenizer would add a BOS otherwise)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_text_dirs[1])
    plain = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    with_bos = tokenizer(PROMPT)["input_ids"]
    assert len(with_bos) == len(plain) + 1
    _, length = encoder.encode(PROMPT)
    assert length == len(plain)
    assert encoder.tokenize(PROMPT) == plain


def test_encoding_is_deterministic_and_prompt_sensitive(encoder):
    """The same prompt encodes bit-identically twice; a different prompt gives different features."""
    first, _ = encoder.encode(PROMPT)
    second, _ = encoder.encode(PROMPT)
    other, _ = encoder.encode(PROMPT.replace("fox", "cat"))
    assert torch.equal(first, second)
    assert other.shape != first.shape or not torch.equal(other, first)


def test_loader_keeps_only_layers_up_to_the_one_read(tiny_text_dirs, full_model):
    """Loading for hidden_layer=1 builds 1 decoder layer, no final norm, and returns the full hidden_states[1]."""
    text_dir, tok_dir = tiny_text_dirs
    shallow = TextEncoder.load(text_dir, tok_dir, 1, "cpu")
    assert len(shallow.model.model.language_model.layers) == 1
    features, length = shallow.encode(PROMPT)
    token_ids = shallow.tokenize(PROMPT)
    with torch.no_grad():
        ids = torch.tensor([token_ids])
        reference = full_model.model(
            input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, output_hidden_states=True
        ).hidden_states[1]
    assert torch.equal(features, reference)


def test_reading_the_last_stored_layer_gives_its_pre_norm_output(tiny_text_dirs, full_model):
    """hidden_layer equal to the stored depth (3 of 3) returns layer 2's residual, not the final-normed output."""
    text_dir, tok_dir = tiny_text_dirs
    deepest = TextEncoder.load(text_dir, tok_dir, 3, "cpu")
    features, _ = deepest.encode(PROMPT)
    residual, final_normed = reference_residual(full_model, deepest.tokenize(PROMPT), 3)
    assert torch.equal(features, residual)
    assert not torch.allclose(features.float(), final_normed.float(), atol=1e-2)


@pytest.mark.parametrize("bad", ["", "   \n\t", None, 42, b"bytes prompt", ["a list"]])
def test_rejects_empty_and_non_string_prompts(encoder, bad):
    """Empty, whitespace-only and non-string prompts raise ValueError."""
    with pytest.raises(ValueError, match="prompt must be"):
        encoder.encode(bad)


def test_token_limit_is_1024_inclusive(encoder):
    """A 1024-token prompt encodes; a 1025-token prompt raises ValueError naming the 1024 limit."""
    assert MAX_PROMPT_TOKENS == 1024
    unit = " fox"
    per_unit = len(encoder.tokenize(unit * 2)) // 2
    assert len(encoder.tokenize(unit * 10)) == 10 * per_unit  # the unit tokenizes the same every repetition
    # Build exactly 1024 tokens from whole units plus single-byte filler tokens.
    units = 1024 // per_unit
    prompt = unit * units + "~" * (1024 - units * per_unit)
    assert len(encoder.tokenize(prompt)) == 1024
    features, length = encoder.encode(prompt)
    assert length == 1024 and features.shape[1] == 1024
    with pytest.raises(ValueError, match="limit is 1024 tokens"):
        encoder.encode(prompt + "~")


@pytest.mark.parametrize("layer", [0, 4, 7])
def test_rejects_hidden_layer_outside_stored_range(tiny_text_dirs, layer):
    """hidden_layer must be in [1, num_layers]: 0 is the embedding, 4 of 3 was never stored."""
    with pytest.raises(ValueError, match=r"hidden_layer must be in \[1, 3\]"):
        TextEncoder.load(*tiny_text_dirs, layer, "cpu")


def test_loader_rejects_checkpoint_missing_a_kept_tensor(tiny_text_dirs, tmp_path):
    """A checkpoint without a tensor of a kept layer raises ValueError naming it instead of random-initialising it."""
    text_dir, tok_dir = tiny_text_dirs
    state = load_file(text_dir / "model.safetensors")
    del state[next(key for key in state if "language_model.layers.0.mlp.up_proj" in key)]
    with pytest.raises(ValueError, match="missing.*layers.0.mlp.up_proj"):
        TextEncoder.load(_edited_checkpoint(text_dir, tmp_path, state), tok_dir, TINY_TEXT_HIDDEN_LAYER, "cpu")


def test_loader_rejects_checkpoint_with_unknown_tensor(tiny_text_dirs, tmp_path):
    """A tensor the model does not know (other than the dropped deeper layers) raises ValueError naming it."""
    text_dir, tok_dir = tiny_text_dirs
    state = load_file(text_dir / "model.safetensors")
    state["model.language_model.extra_gate.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown.*extra_gate"):
        TextEncoder.load(_edited_checkpoint(text_dir, tmp_path, state), tok_dir, 1, "cpu")


def _edited_checkpoint(text_dir, tmp_path, state) -> Path:
    """A text_encoder/ folder with the tiny config and `state` as its weights."""
    out = tmp_path / "text_encoder"
    out.mkdir()
    (out / "config.json").write_text((text_dir / "config.json").read_text())
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out
