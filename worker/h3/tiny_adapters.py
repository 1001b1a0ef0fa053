"""``h3batch build-tiny-adapters``: deterministic random adapters for the tiny release (T2 DiT), for tests and demos.

Writes into ``--out``:

* ``lora-style/pytorch_lora_weights.safetensors`` and ``lora-character/…``: per-job LoRAs in diffusers' H3 names
  (``transformer.<module>.lora_A/B.weight``, the layout ``MiniMaxH3LoraLoaderMixin`` writes), alpha-less, ranks 4
  and 8, on the attention, FFN and AdaLN projections of every block, two refiner projections and three top-level ones.
* ``legacy-fasth3/``: the legacy FastH3 four-step adapter (worker/h3/legacy_adapter.py describes the format).

Same seed -> the same tensors: the LoRA files are byte-identical; the legacy file's metadata header is written in
safetensors' own (unordered) map order, so only its tensors and metadata values are.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from h3batch.cli_args import OneLineArgumentParser
from h3batch.worker.h3.config import T2, H3Config
from h3batch.worker.h3.legacy_adapter import write_legacy_adapter

LORA_FILE = "pytorch_lora_weights.safetensors"
TINY_LORAS = {"lora-style": 4, "lora-character": 8}  # folder -> rank


def lora_target_shapes(config: H3Config) -> dict[str, tuple[int, int]]:
    """Diffusers module path -> (out, in) of every Linear a tiny LoRA touches."""
    hidden, inner, ffn, temb = config.hidden_size, config.inner_dim, config.ffn_hidden_size, config.time_embed_dim
    attention = {"attn.to_q": (inner, hidden), "attn.to_k": (inner, hidden), "attn.to_v": (inner, hidden),
                 "attn.to_out.0": (hidden, inner), "ff.net.0.proj": (2 * ffn, hidden), "ff.net.2": (hidden, ffn)}
    shapes = {}
    for i in range(config.num_layers):
        for suffix, shape in {**attention, "adaln_proj.linear": (config.adaln_out_features, temb)}.items():
            shapes[f"transformer_blocks.{i}.{suffix}"] = shape
    for suffix in ("attn.to_q", "ff.net.0.proj"):
        shapes[f"token_refiner.refiner_blocks.0.{suffix}"] = attention[suffix]
    shapes["proj_out"] = (config.video_patch_dim, hidden)
    shapes["context_embedder"] = (hidden, config.text_dim)
    shapes["norm_out.linear"] = (config.final_adaln_out_features, temb)
    return shapes


def random_lora_state_dict(config: H3Config = T2, *, rank: int, seed: int) -> dict[str, torch.Tensor]:
    """fp32 factors with A ~ N(0, 1/in) and B ~ 0.3·N(0, 1/r), so the delta moves the output visibly but not wildly."""
    generator = torch.Generator().manual_seed(seed)
    state_dict = {}
    for module, (rows, cols) in sorted(lora_target_shapes(config).items()):
        state_dict[f"transformer.{module}.lora_A.weight"] = torch.randn(rank, cols, generator=generator) / cols**0.5
        b = torch.randn(rows, rank, generator=generator)
        state_dict[f"transformer.{module}.lora_B.weight"] = 0.3 * b / rank**0.5
    return state_dict


def tiny_legacy_tensors(config: H3Config, *, rank: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random adapter tensors for ``config`` in the format above: factors on every attention/FFN/AdaLN projection of
    every block, full-rank diffs on norms (q/k norms and the refiner's final norm included), biases and the heads."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    shapes = lora_target_shapes(config)
    for j in range(config.token_refiner_num_layers):  # the whole refiner too: every block must be edited
        hidden, inner = config.hidden_size, config.inner_dim
        for suffix, shape in {"attn.to_q": (inner, hidden), "attn.to_k": (inner, hidden), "attn.to_v": (inner, hidden),
                              "attn.to_out.0": (hidden, inner)}.items():
            shapes[f"token_refiner.refiner_blocks.{j}.{suffix}"] = shape
    for module, (rows, cols) in sorted(shapes.items()):
        tensors[f"{module}.lora_A.weight"] = torch.randn(rank, cols, generator=generator) / cols**0.5
        tensors[f"{module}.lora_B.weight"] = 0.2 * torch.randn(rows, rank, generator=generator) / rank**0.5
    head = config.attention_head_dim
    norms = {"token_refiner.final_norm": config.hidden_size, "norm_out.norm": config.hidden_size}
    for i in range(config.num_layers):
        norms.update({f"transformer_blocks.{i}.norm1": config.hidden_size, f"transformer_blocks.{i}.attn.norm_q": head,
                      f"transformer_blocks.{i}.attn.norm_k": head})
    for module, width in sorted(norms.items()):
        tensors[f"{module}.diff"] = 0.05 * torch.randn(width, generator=generator)
    tensors["proj_out.diff_b"] = 0.05 * torch.randn(config.video_patch_dim, generator=generator)
    tensors["audio_proj_in.diff"] = 0.02 * torch.randn(config.hidden_size, config.audio_latents_dim,
                                                       generator=generator)
    return {k: v.to(torch.bfloat16) for k, v in tensors.items()}


def write_tiny_legacy_adapter(folder: str | Path, config: H3Config, *, seed: int = 0, rank: int = 4) -> Path:
    """The tiny legacy adapter ``build-tiny-adapters`` writes for the tiny native release."""
    return write_legacy_adapter(folder, tiny_legacy_tensors(config, rank=rank, seed=seed), rank=rank)


def build_tiny_adapters(out: str | Path, seed: int = 0) -> list[Path]:
    """Write the tiny adapters into ``out``; returns the folders written."""
    out = Path(out)
    written = []
    for index, (folder, rank) in enumerate(sorted(TINY_LORAS.items())):
        target = out / folder
        target.mkdir(parents=True, exist_ok=True)
        save_file(random_lora_state_dict(T2, rank=rank, seed=seed * 101 + index), str(target / LORA_FILE))
        written.append(target)
    written.append(write_tiny_legacy_adapter(out / "legacy-fasth3", T2, seed=seed))
    return written


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch build-tiny-adapters",
                                   description="write deterministic tiny adapters (per-job LoRAs, legacy FastH3)")
    parser.add_argument("--out", required=True, help="directory to write the adapter folders into")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed -> the same tensors)")
    args = parser.parse_args(argv)
    try:
        written = build_tiny_adapters(args.out, args.seed)
    except (OSError, ValueError) as err:
        print(f"h3batch build-tiny-adapters: {err}", file=sys.stderr)
        return 2
    print("tiny adapters: " + ", ".join(str(p) for p in written))
    return 0
