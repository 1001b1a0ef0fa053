"""Load MiniMax-H3 DiT weights into the native ``H3Transformer``: Diffusers (D) names or native (N) names.

Diffusers checkpoints (FastH3 V2 ``transformer/``) are mapped name by name (spec h3-model.md §3.1): prefixes are matched
refiner first (``token_refiner.refiner_blocks.j.`` before ``transformer_blocks.i.``, never a substring replace of
``blocks.``), ``to_q/to_k/to_v`` fill the three row thirds of ``qkv_proj``, the SwiGLU ``fc1`` halves are swapped
(D ``[value; gate]`` -> N ``[gate; up]``), ``rope.inv_freq`` is recomputed and counted as loaded. Every rule of §3.5
raises a ``ValueError`` naming the weight. Native checkpoints (original MiniMax layout) carry per-head interleaved QKV
rows (§3.2); unknown native names are logged and skipped.

Written by hand rather than through diffusers' ``from_pretrained``: the target is a different module tree (packed QKV,
gate-first SwiGLU), and the FastH3 V2 gates are not parameters of the diffusers class (they would be dropped).
Tensors are streamed one at a time from safetensors into a model materialised once on the target device.
"""

from __future__ import annotations

import enum
import json
import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch
from safetensors import safe_open

from h3batch.worker.h3.config import DIFFUSERS_CLASS_NAME, H3Config
from h3batch.worker.h3.model import H3Transformer, rope_inv_freq

logger = logging.getLogger(__name__)

WeightStream = Iterable[tuple[str, torch.Tensor]]

INV_FREQ = "rope.inv_freq"
QKV_PARTS = ("q", "k", "v")


class WeightFormat(enum.Enum):
    """Naming and layout of the tensors in a checkpoint."""

    DIFFUSERS = "diffusers"
    NATIVE = "native"


def detect_weight_format(config: Mapping, override: WeightFormat | None = None) -> WeightFormat:
    """Diffusers iff ``_class_name`` is the diffusers DiT class, unless the caller says otherwise.

    The override exists because the native MiniMax-H3 repo root also advertises the diffusers class while its
    partitions hold native weights (§2.1).
    """
    if override is not None:
        return override
    if config.get("_class_name") == DIFFUSERS_CLASS_NAME:
        return WeightFormat.DIFFUSERS
    return WeightFormat.NATIVE


# Name mapping D -> N -----------------------------------------------------------------------------------------------

# Module paths outside the blocks (the leaf, weight or bias, is kept).
_TOP_LEVEL = {
    "proj_in": "video_patch_proj",
    "audio_proj_in": "audio_patch_proj",
    "context_embedder": "condition_proj",
    "time_embedder.linear_1": "time_embedder.proj_in",
    "time_embedder.linear_2": "time_embedder.proj_out",
    "token_refiner.final_norm": "token_refiner.final_norm",
    "norm_out.norm": "final_layer.norm",
    "norm_out.linear": "final_layer.adaln_proj.linear",
    "proj_out": "final_layer.video_out",
    "audio_proj_out": "final_layer.audio_out",
}

# Module paths inside a block -> (N module path, QKV part or None). One table for DiT and refiner blocks: a refiner
# key like `adaln_proj` maps fine and is then refused because the refiner module has no such parameter.
_BLOCK = {
    "norm1": ("norm1", None),
    "norm2": ("norm2", None),
    "attn.to_q": ("attn.qkv_proj", "q"),
    "attn.to_k": ("attn.qkv_proj", "k"),
    "attn.to_v": ("attn.qkv_proj", "v"),
    "attn.norm_q": ("attn.q_norm", None),
    "attn.norm_k": ("attn.k_norm", None),
    "attn.to_out.0": ("attn.out_proj", None),
    "attn.to_gate_compress": ("attn.to_gate_compress", None),
    "ff.net.0.proj": ("mlp.fc1", None),
    "ff.net.2": ("mlp.fc2", None),
    "adaln_proj.linear": ("adaln_proj.linear", None),
}

# Refiner first: `token_refiner.refiner_blocks.` must never be read as a DiT block.
_BLOCK_PREFIXES = (
    (re.compile(r"token_refiner\.refiner_blocks\.(0|[1-9][0-9]*)\.(.+)"), "token_refiner.blocks"),
    (re.compile(r"transformer_blocks\.(0|[1-9][0-9]*)\.(.+)"), "blocks"),
)


@dataclass(frozen=True)
class WeightTarget:
    """Where one Diffusers tensor goes in the native model."""

    name: str  # native parameter name
    qkv_part: str | None = None  # "q" | "k" | "v": which row third of qkv_proj
    swap_halves: bool = False  # fc1: D [value; gate] -> N [gate; up]


def map_diffusers_name(name: str) -> WeightTarget:
    """D key -> native target; ``ValueError('unsupported Diffusers H3 weight: …')`` when no rule covers it."""
    module, _, leaf = name.rpartition(".")
    if leaf not in ("weight", "bias") or not module:
        raise ValueError(f"unsupported Diffusers H3 weight: {name}")
    for pattern, native_prefix in _BLOCK_PREFIXES:
        match = pattern.fullmatch(module)
        if match is None:
            continue
        index, suffix = match.groups()
        if suffix not in _BLOCK:
            raise ValueError(f"unsupported Diffusers H3 weight: {name}")
        native_suffix, part = _BLOCK[suffix]
        return WeightTarget(
            name=f"{native_prefix}.{index}.{native_suffix}.{leaf}",
            qkv_part=part,
            swap_halves=native_suffix == "mlp.fc1",
        )
    if module not in _TOP_LEVEL:
        raise ValueError(f"unsupported Diffusers H3 weight: {name}")
    return WeightTarget(name=f"{_TOP_LEVEL[module]}.{leaf}")


# Layout rules -------------------------------------------------------------------------------------------------------


def swap_fc1_halves(weight: torch.Tensor) -> torch.Tensor:
    """[a; b] -> [b; a] over rows (D value-first <-> N gate-first SwiGLU, §3.3); rows must split evenly."""
    rows = weight.shape[0]
    if rows % 2:
        raise ValueError(
            f"MiniMax H3 fc1 checkpoint rows must split evenly into gate/up matrices, got {tuple(weight.shape)}"
        )
    return torch.cat((weight[rows // 2 :], weight[: rows // 2]), dim=0)


def deinterleave_qkv(weight: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Per-head interleaved [h0:q, h0:k, h0:v, h1:q, …] rows -> [Q_all; K_all; V_all] (§3.2). [3I, H] -> [3I, H]."""
    rows = weight.shape[0]
    if rows % (3 * head_dim):
        raise ValueError(f"native QKV rows must be a multiple of 3 * head_dim = {3 * head_dim}, got {rows}")
    heads = rows // (3 * head_dim)
    return weight.reshape(heads, 3, head_dim, -1).transpose(0, 1).reshape(rows, *weight.shape[1:])


# Loading into a model -----------------------------------------------------------------------------------------------


def _model_tensors(model: H3Transformer) -> dict[str, torch.Tensor]:
    """Every state-dict tensor of the model by native name (parameters and the persistent ``rope.inv_freq``)."""
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    return tensors


def _gate_names(model: H3Transformer) -> list[str]:
    return [
        f"blocks.{i}.attn.to_gate_compress.weight"
        for i, block in enumerate(model.blocks)
        if block.attn.to_gate_compress is not None
    ]


def _check_shape(name: str, got: torch.Size, expected: torch.Size) -> None:
    if tuple(got) != tuple(expected):
        raise ValueError(f"shape mismatch for {name}: {list(got)} vs {list(expected)}")


def _check_complete(model: H3Transformer, loaded: set[str], *, optional: frozenset[str] = frozenset()) -> None:
    """V2 gates first (their own message), then every other model tensor."""
    missing_gates = sorted(n for n in _gate_names(model) if n not in loaded)
    if missing_gates:
        raise ValueError(f"FastH3 V2 checkpoint is missing compression gates: {missing_gates}")
    missing = sorted(n for n in _model_tensors(model) if n not in loaded and n not in optional)
    if missing:
        raise ValueError(f"missing H3 weights: {missing}")


@torch.no_grad()
def assign_diffusers_weights(
    targets: Mapping[str, torch.Tensor],
    weights: WeightStream | Mapping[str, torch.Tensor],
    inv_freq: torch.Tensor,
) -> set[str]:
    """Write Diffusers-named tensors into the native ``targets`` by name; returns the native names loaded.

    Applies the per-tensor rules of §3.5 in order (duplicate, unsupported, no model parameter, fc1 split, shape), then
    checks every QKV group, writes the recomputed ``inv_freq`` into ``targets['rope.inv_freq']`` when present and
    counts it as loaded. No completeness check (``load_diffusers_weights`` adds it). Tensors are cast to each target's
    dtype and device.
    """
    if isinstance(weights, Mapping):
        weights = weights.items()
    seen: set[str] = set()
    loaded: set[str] = set()
    qkv_parts: dict[str, set[str]] = defaultdict(set)

    for name, tensor in weights:
        if name in seen:
            raise ValueError(f"duplicate Diffusers H3 weight: {name}")
        seen.add(name)
        target = map_diffusers_name(name)
        param = targets.get(target.name)
        if param is None:
            raise ValueError(f"Diffusers H3 weight has no model parameter: {name}")
        if target.swap_halves:
            tensor = swap_fc1_halves(tensor)
        if target.qkv_part is not None:
            third = param.shape[0] // 3
            _check_shape(name, tensor.shape, (third, *param.shape[1:]))
            start = QKV_PARTS.index(target.qkv_part) * third
            param[start : start + third].copy_(tensor)
            qkv_parts[target.name].add(target.qkv_part)
        else:
            _check_shape(name, tensor.shape, param.shape)
            param.copy_(tensor)
            loaded.add(target.name)

    for qkv_name, parts in sorted(qkv_parts.items()):
        if parts != set(QKV_PARTS):
            raise ValueError(f"incomplete Diffusers H3 QKV group {qkv_name}: {sorted(parts)}")
        loaded.add(qkv_name)

    # Not stored in Diffusers checkpoints: recomputed and counted as loaded.
    if INV_FREQ in targets:
        targets[INV_FREQ].copy_(inv_freq)
    loaded.add(INV_FREQ)
    return loaded


@torch.no_grad()
def assign_native_weights(
    targets: Mapping[str, torch.Tensor],
    weights: WeightStream | Mapping[str, torch.Tensor],
    *,
    head_dim: int,
    interleaved_qkv: bool = True,
) -> set[str]:
    """Write native-named tensors into ``targets``; unknown names are logged and skipped; returns the names loaded.

    ``interleaved_qkv``: the original MiniMax files store QKV rows per head interleaved (§3.2) and are re-ordered to
    ``[Q; K; V]``; set False for a state dict saved from ``H3Transformer`` itself. ``rope.inv_freq`` is copied only
    when the checkpoint has it (never recomputed).
    """
    if isinstance(weights, Mapping):
        weights = weights.items()
    seen: set[str] = set()
    loaded: set[str] = set()
    for name, tensor in weights:
        if name in seen:
            raise ValueError(f"duplicate native H3 weight: {name}")
        seen.add(name)
        param = targets.get(name)
        if param is None:
            logger.warning("skipping native H3 weight with no model parameter: %s", name)
            continue
        _check_shape(name, tensor.shape, param.shape)
        if interleaved_qkv and name.endswith("attn.qkv_proj.weight"):
            tensor = deinterleave_qkv(tensor, head_dim)
        param.copy_(tensor)
        loaded.add(name)
    return loaded


def load_diffusers_weights(model: H3Transformer, weights: WeightStream | Mapping[str, torch.Tensor]) -> set[str]:
    """Load a Diffusers checkpoint into ``model``; every model tensor must be written.

    Gates are required on every DiT block iff the model was built with them (``config.vsa_gates``, FastH3 V2).
    """
    inv_freq = rope_inv_freq(model.config.rope_inv_freq_len, model.config.rope_theta)
    loaded = assign_diffusers_weights(_model_tensors(model), weights, inv_freq)
    _check_complete(model, loaded)
    return loaded


def load_native_weights(
    model: H3Transformer, weights: WeightStream | Mapping[str, torch.Tensor], *, interleaved_qkv: bool = True
) -> set[str]:
    """Load a native checkpoint into ``model``; every model tensor except ``rope.inv_freq`` must be written."""
    loaded = assign_native_weights(
        _model_tensors(model), weights, head_dim=model.config.attention_head_dim, interleaved_qkv=interleaved_qkv
    )
    _check_complete(model, loaded, optional=frozenset({INV_FREQ}))
    return loaded


# Checkpoint directories ---------------------------------------------------------------------------------------------


def _safetensors_files(directory: Path) -> tuple[list[Path], dict[str, str] | None]:
    """Shards named by the one ``*.safetensors.index.json`` (with its weight map), else every ``*.safetensors``."""
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise ValueError(f"expected at most one safetensors index in {directory}, found {[p.name for p in indexes]}")
    if indexes:
        weight_map: dict[str, str] = json.loads(indexes[0].read_text())["weight_map"]
        files = list(dict.fromkeys(weight_map.values()))  # first-appearance order, no repeats
        return [directory / f for f in files], weight_map
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {directory}")
    return files, None


def iter_safetensors(directory: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, CPU tensor) one at a time from a (possibly sharded) safetensors checkpoint directory."""
    directory = Path(directory)
    files, weight_map = _safetensors_files(directory)
    for path in files:
        if not path.is_file():
            raise ValueError(f"safetensors shard listed in the index is missing: {path}")
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                if weight_map is not None and weight_map.get(name) != path.name:
                    raise ValueError(
                        f"safetensors index maps {name} to {weight_map.get(name)!r}, but it is stored in {path.name}"
                    )
                yield name, handle.get_tensor(name)


def read_transformer_config(directory: str | Path) -> dict:
    """The raw ``config.json`` of a transformer directory."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ValueError(f"transformer config not found: {path}")
    return json.loads(path.read_text())


def materialize(model: H3Transformer, device: torch.device | str) -> H3Transformer:
    """Allocate a meta-built model on ``device`` (uninitialised) and fill ``rope.inv_freq``; loading fills the rest."""
    model = model.to_empty(device=device)
    with torch.no_grad():
        model.rope.inv_freq.copy_(rope_inv_freq(model.config.rope_inv_freq_len, model.config.rope_theta))
    return model


def load_transformer(
    directory: str | Path,
    *,
    vsa_gates: bool,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    weight_format: WeightFormat | None = None,
) -> H3Transformer:
    """Build the DiT described by ``directory/config.json`` on ``device`` and load its safetensors weights.

    ``vsa_gates=True`` is FastH3 V2: gates are built on all DiT blocks and every one must be in the checkpoint.
    The model is built on the meta device and allocated once, so peak host memory is one tensor at a time.
    """
    raw_config = read_transformer_config(directory)
    config = H3Config.from_diffusers_config(raw_config, vsa_gates=vsa_gates)
    weight_format = detect_weight_format(raw_config, weight_format)
    with torch.device("meta"):
        model = H3Transformer(config, dtype=dtype)
    model = materialize(model, device)
    if weight_format is WeightFormat.DIFFUSERS:
        load_diffusers_weights(model, iter_safetensors(directory))
    else:
        load_native_weights(model, iter_safetensors(directory))
    model.eval()
    model.requires_grad_(False)
    return model
