"""Prompt -> DiT text features with the Qwen3-VL text stack (spec §8).

The prompt is tokenized verbatim (``add_special_tokens=False``: no chat template, BOS/EOS, padding or truncation)
and run through ``text_encoder.model`` (``Qwen3VLModel``; the LM head is never used) with an all-ones attention
mask, ``mm_token_type_ids`` all zero, ``output_hidden_states=True`` and no cache. The feature is
``hidden_states[hidden_layer]``: the residual stream after decoder layer ``hidden_layer - 1``, before the final norm.

Two decisions worth knowing:

* ``mm_token_type_ids`` are built here as zeros rather than through ``Qwen3VLProcessor.create_mm_token_type_ids``:
  loading that processor needs its image/video processors (torchvision), and for a text-only call the ids only
  steer M-RoPE when image/video grids are passed, which T2VA never does, so the output is identical either way.
* Decoder layers from ``hidden_layer`` on cannot change ``hidden_states[hidden_layer]`` (the stack is sequential),
  so the encoder is built with exactly ``hidden_layer`` layers, the weights of deeper ones are not loaded, and the
  final norm is replaced by an identity: the output of the last kept layer is then the pre-norm residual, read as
  ``last_hidden_state``. (transformers overwrites the last ``hidden_states`` entry with the final-normed output, §8
  pitfall, which is why an encoder built to the layer read must not keep its norm.) So a release may store exactly
  the layers it needs (FastVideo's encoder keeps 50) or more (the full 64): the features are bit-identical. For the
  full encoder this saves 14 layers (~13 GiB bf16) and their compute, which is what lets DiT, encoder and VAE share
  one H200 (§12).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, Qwen3VLForConditionalGeneration

MAX_PROMPT_TOKENS = 1024
"""h3batch policy: longest prompt in tokens (FastVideo's training loader caps at 1024)."""

_LAYER_KEY = re.compile(r"(?:^|\.)language_model\.layers\.(\d+)\.")


class TextEncoder:
    """A loaded tokenizer + Qwen3-VL text stack that maps one prompt to ``[1, L, text_dim]`` features."""

    def __init__(
        self,
        model: Qwen3VLForConditionalGeneration,
        tokenizer,
        hidden_layer: int,
        max_tokens: int = MAX_PROMPT_TOKENS,
    ) -> None:
        num_layers = model.config.text_config.num_hidden_layers
        if not 1 <= hidden_layer <= num_layers:
            raise ValueError(
                f"hidden_layer must be in [1, {num_layers}] for a {num_layers}-layer text encoder, got {hidden_layer}"
            )
        if hidden_layer < num_layers:
            # Deeper layers and the final norm cannot change hidden_states[hidden_layer]: drop them (docstring).
            model.model.language_model.layers = model.model.language_model.layers[:hidden_layer]
            model.config.text_config.num_hidden_layers = hidden_layer
        model.model.language_model.norm = torch.nn.Identity()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.hidden_layer = hidden_layer
        self.max_tokens = max_tokens
        self.device: torch.device | None = None  # where the inputs go; None = the model's (see text_placement.py)

    @property
    def text_stack(self) -> torch.nn.Module:
        """The part that runs for a text-only prompt: embeddings, the kept decoder layers, the rotary tables
        (the vision tower and the LM head never run)."""
        return self.model.model.language_model

    @classmethod
    def load(
        cls,
        text_encoder_dir: str | Path,
        tokenizer_dir: str | Path,
        hidden_layer: int,
        device: str | torch.device,
        dtype: torch.dtype = torch.bfloat16,
        max_tokens: int = MAX_PROMPT_TOKENS,
    ) -> "TextEncoder":
        """Load tokenizer and encoder, keeping decoder layers ``0 .. hidden_layer - 1`` only.

        The stored encoder may hold exactly ``hidden_layer`` layers or more. Raises ValueError when ``hidden_layer``
        is out of range for the stored depth, and when the checkpoint misses or mis-shapes a kept tensor or holds a
        tensor the (full-depth) model does not know.
        """
        config = AutoConfig.from_pretrained(text_encoder_dir)
        stored_layers = config.text_config.num_hidden_layers
        if not 1 <= hidden_layer <= stored_layers:
            raise ValueError(
                f"hidden_layer must be in [1, {stored_layers}] for the {stored_layers}-layer text encoder in "
                f"{text_encoder_dir}, got {hidden_layer}"
            )
        kept_layers = hidden_layer
        config.text_config.num_hidden_layers = kept_layers
        model, info = _prefix_class(kept_layers, stored_layers).from_pretrained(
            text_encoder_dir,
            config=config,
            dtype=dtype,
            device_map=str(torch.device(device)),
            output_loading_info=True,
        )
        _check_loading_info(info, kept_layers, stored_layers, text_encoder_dir)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        return cls(model, tokenizer, hidden_layer, max_tokens=max_tokens)

    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of the prompt presented verbatim; raises ValueError on bad or over-long prompts."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError("prompt must be a non-empty string, got an empty or whitespace-only one")
        token_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if len(token_ids) > self.max_tokens:
            raise ValueError(f"prompt is {len(token_ids)} tokens long, the limit is {self.max_tokens} tokens")
        if not token_ids:
            raise ValueError("prompt produced no tokens")
        return token_ids

    @torch.inference_mode()
    def encode(self, prompt: str) -> tuple[torch.Tensor, int]:
        """Return (features ``[1, L, text_dim]`` in the encoder dtype, L) for one prompt."""
        token_ids = self.tokenize(prompt)
        device = self.device if self.device is not None else self.model.device
        input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)  # [1, L]
        outputs = self.model.model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            mm_token_type_ids=torch.zeros_like(input_ids),  # all text (see module docstring)
            use_cache=False,
        )
        # Last kept layer = hidden_layer - 1, norm = identity: this is hidden_states[hidden_layer].
        features = outputs.last_hidden_state  # [1, L, text_dim], pre-final-norm residual
        return features, len(token_ids)


@torch.inference_mode()
def encode_presentation(encoder: TextEncoder, token_ids: list[int], mm_token_type_ids: list[int],
                        vision_inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Features ``[1, L, text_dim]`` of a tokenized presentation with vision blocks (native fl2va / ref2va: see
    worker/h3/conditioning.py): the same read as ``TextEncoder.encode``, with the vision tower run on
    ``pixel_values`` / ``image_grid_thw`` and ``mm_token_type_ids`` (1 on image pads) steering Qwen3-VL's M-RoPE."""
    if len(token_ids) > encoder.max_tokens:
        raise ValueError(f"prompt with its images is {len(token_ids)} tokens long, the limit is {encoder.max_tokens}")
    device = encoder.device if encoder.device is not None else encoder.model.device
    visual = encoder.model.model.visual  # the placement (text_placement.py) moves the text stack only
    if next(visual.parameters()).device != torch.device(device):
        visual.to(device)
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)  # [1, L]
    vision = {name: value.to(device, encoder.model.dtype) if name.startswith("pixel_") else value.to(device)
              for name, value in vision_inputs.items()}
    outputs = encoder.model.model(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        mm_token_type_ids=torch.tensor([mm_token_type_ids], dtype=torch.long, device=device),
        use_cache=False,
        **vision,
    )
    return outputs.last_hidden_state  # [1, L, text_dim]: hidden_states[hidden_layer], pre-final-norm


def _prefix_class(kept_layers: int, stored_layers: int) -> type[Qwen3VLForConditionalGeneration]:
    """The model class to load a ``kept_layers``-deep prefix with: the dropped layers' tensors are expected, so
    transformers need not print its load report for them (``_check_loading_info`` still vets every other key)."""
    if kept_layers == stored_layers:
        return Qwen3VLForConditionalGeneration
    dropped = "|".join(str(i) for i in range(kept_layers, stored_layers))
    return type("Qwen3VLForConditionalGenerationPrefix", (Qwen3VLForConditionalGeneration,),
                {"_keys_to_ignore_on_load_unexpected": {rf"(?:^|\.)language_model\.layers\.(?:{dropped})\."}})


def _check_loading_info(info: dict, kept_layers: int, stored_layers: int, where) -> None:
    """Fail loudly on missing/mismatched tensors; allow as unexpected only the dropped deeper decoder layers."""
    problems = []
    if info.get("missing_keys"):
        problems.append(f"missing {sorted(info['missing_keys'])[:5]}")
    if info.get("mismatched_keys"):
        problems.append(f"shape-mismatched {sorted(map(str, info['mismatched_keys']))[:5]}")
    foreign = []
    for key in info.get("unexpected_keys") or ():
        match = _LAYER_KEY.search(key)
        if match is None or not kept_layers <= int(match.group(1)) < stored_layers:
            foreign.append(key)
    if foreign:
        problems.append(f"unknown {sorted(foreign)[:5]}")
    if problems:
        raise ValueError(f"text encoder checkpoint {where} does not match its config: " + "; ".join(problems))
