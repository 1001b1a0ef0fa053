"""Text-encoder placement (worker/h3/text_placement.py): offloaded and streamed encoders give the resident one's
features bit for bit, the weights really visit (device copies, never the host master), and leave when told."""
from __future__ import annotations

import pytest
import torch

from h3batch.worker.h3.text_encoder import TextEncoder
from h3batch.worker.h3.text_placement import HostedTextEncoder, place_text_encoder
from h3batch.worker.h3.tiny_configs import TINY_TEXT_HIDDEN_LAYER

PROMPTS = ("A red fox runs across a snowy field at dawn.", "Rain falls on a tin roof as a kettle whistles.",
           "Waves crash against black rocks while seagulls circle above a lighthouse, again and again.")


def load(tiny_text_dirs) -> TextEncoder:
    text_dir, tok_dir = tiny_text_dirs
    return TextEncoder.load(text_dir, tok_dir, TINY_TEXT_HIDDEN_LAYER, "cpu")


@pytest.fixture(scope="module")
def resident_features(tiny_text_dirs):
    encoder = place_text_encoder(load(tiny_text_dirs), "cpu", "resident")
    return [encoder.encode(prompt) for prompt in PROMPTS]


def stack_tensors(encoder: TextEncoder) -> dict[str, torch.Tensor]:
    return dict(encoder.text_stack.named_parameters())


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # on a GPU machine: pinned host, async copies


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["offload", "stream"])
def test_hosted_encoder_gives_bit_identical_features(tiny_text_dirs, resident_features, mode, device):
    """Every prompt encodes to exactly the resident encoder's features and length, twice in a row."""
    if device == "cpu":
        expected_features = resident_features
    else:
        resident = place_text_encoder(load(tiny_text_dirs), device, "resident")
        expected_features = [resident.encode(prompt) for prompt in PROMPTS]
    hosted = place_text_encoder(load(tiny_text_dirs), device, mode)
    assert isinstance(hosted, HostedTextEncoder)
    for _ in range(2):
        for prompt, (expected, rows) in zip(PROMPTS, expected_features):
            features, length = hosted.encode(prompt)
            hosted.settle(10_000)
            assert length == rows and features.dtype == expected.dtype
            assert torch.equal(features, expected)


def test_offload_visits_with_copies_and_leaves_unless_the_clip_fits(tiny_text_dirs):
    """While encoding, every weight of the stack is a copy of its host master; `settle` drops the copies for a
    clip longer than keep_max_rows and keeps them for a shorter one; the masters never change."""
    encoder = load(tiny_text_dirs)
    hosted = place_text_encoder(encoder, "cpu", "offload", keep_max_rows=500)
    masters = {name: (p.data_ptr(), p.detach().clone()) for name, p in stack_tensors(encoder).items()}
    seen = {}

    def spy(module, args):
        seen.update({name: p.data_ptr() for name, p in stack_tensors(encoder).items()})

    handle = encoder.text_stack.layers[0].register_forward_pre_hook(spy)
    try:
        hosted.encode(PROMPTS[0])
    finally:
        handle.remove()
    assert seen and all(seen[name] != ptr for name, (ptr, _) in masters.items())
    assert hosted.on_device
    hosted.settle(500)  # fits beside it: stays
    assert hosted.on_device
    hosted.settle(501)  # needs the room: leaves
    assert not hosted.on_device
    for name, p in stack_tensors(encoder).items():
        ptr, value = masters[name]
        assert p.data_ptr() == ptr and torch.equal(p.detach(), value)


def test_stream_holds_at_most_one_unit_and_nothing_after(tiny_text_dirs):
    """Streaming moves the embedding table and then one decoder layer at a time, and leaves nothing behind."""
    encoder = load(tiny_text_dirs)
    hosted = place_text_encoder(encoder, "cpu", "stream")
    counts = []
    handles = [layer.register_forward_pre_hook(lambda module, args: counts.append(
        sum(unit.on_device for unit in hosted.units))) for layer in encoder.text_stack.layers]
    try:
        hosted.encode(PROMPTS[1])
    finally:
        for handle in handles:
            handle.remove()
    assert counts == [1] * len(encoder.text_stack.layers)
    assert not hosted.on_device
    assert hosted.largest_unit_bytes < hosted.nbytes


def test_bad_prompt_is_refused_before_any_weight_moves(tiny_text_dirs):
    """An empty prompt raises the encoder's ValueError and leaves the weights in host memory."""
    hosted = place_text_encoder(load(tiny_text_dirs), "cpu", "offload")
    with pytest.raises(ValueError, match="non-empty"):
        hosted.encode("   ")
    assert not hosted.on_device


def test_unknown_placement_is_refused(tiny_text_dirs):
    with pytest.raises(ValueError, match="expected one of resident, offload, stream"):
        place_text_encoder(load(tiny_text_dirs), "cpu", "gpu")


def test_placing_again_removes_the_stream_hooks(tiny_text_dirs, resident_features):
    """An encoder placed as `stream` and then resident keeps no streaming hooks and still encodes the same."""
    encoder = load(tiny_text_dirs)
    place_text_encoder(encoder, "cpu", "stream")
    assert all(layer._forward_pre_hooks for layer in encoder.text_stack.layers)
    resident = place_text_encoder(encoder, "cpu", "resident")
    assert not any(layer._forward_pre_hooks or layer._forward_hooks for layer in encoder.text_stack.layers)
    features, _ = resident.encode(PROMPTS[0])
    assert torch.equal(features, resident_features[0][0])
