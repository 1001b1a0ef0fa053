"""MiniMax native (remote-code) VAE folders -> diffusers ``AutoencoderKLMiniMaxH3`` / ``AutoencoderKLMiniMaxH3Audio``.

The FastH3 V2 release takes its VAEs from the base repo's ``FL2VA/video_vae/`` and ``FL2VA/audio_vae/`` (spec §6.3),
which hold MiniMax's native format, not diffusers'. diffusers ships the facts of the translation only inside its
one-off conversion script (``scripts/convert_minimax_h3_to_diffusers.py``, not in the wheel), so h3batch keeps its own
table here. Native layout:

* ``video_vae/config.json`` (wrapper: ``source_path``, ``source_safetensors_path``, ``vae_clip_length``,
  ``vae_token_drop``, tiling, ``latents_mean``/``latents_std``) and ``video_vae/<source_path>/config.json``
  (``AutoencoderKLLegacy`` kwargs: ``ch``/``ch_mult``, ``num_res_blocks``, ``space_down``/``time_down``,
  ``vit_decoder_kwargs``...), weights ``video_vae/<source_path>/<source_safetensors_path>``, fp32.
* ``audio_vae/metadata.json`` (``{"metadata": {"kwargs": ...}}`` of the DAC/BigVGAN constructor),
  ``audio_vae/config.json`` (``latent_channels``, ``sample_rate``, ``latents_mean``/``latents_std``),
  weights ``audio_vae/model.safetensors``, fp32, with diffusers' names already (identity mapping).

Key mapping: each ``KeyRule`` pairs a native name template with its diffusers template(s) and a tensor transform;
both directions are derived from the same table (``native_to_diffusers`` for loading, ``diffusers_to_native`` to
write the tiny base repo). Loading is as strict as the DiT loader (spec §3.5): duplicate, unknown, shape-mismatched
and missing keys raise ``ValueError`` naming them. ``decoder.mask_token`` (an all-zero training-only buffer) is the one
native key dropped on purpose.

Config fields with no native spelling in the release (``num_register_tokens``, ``ffn_mult`` and ``eps`` of the ViT
decoder; the audio VAE's attention heads and AMP kernel tables, which the reference hard-codes) are read from
optional native keys and default to the release values; the tiny base repo writes them only where it differs.
"""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors.torch import load_file

VIDEO_VAE_DIR = "video_vae"
AUDIO_VAE_DIR = "audio_vae"


class Transform(enum.Enum):
    """How a tensor changes between its native and diffusers form."""

    RENAME = "rename"
    SWAP_HALVES = "swap_halves"  # SwiGLU fc: native [gate; up] <-> diffusers [up; gate]; its own inverse
    SPLIT_QKV = "split_qkv"  # native per-head interleaved [h0: q k v, h1: q k v, ...] <-> diffusers to_q/to_k/to_v
    DROP = "drop"  # native-only buffer, no diffusers counterpart


# Placeholder name -> what it may match. `{param}` is a parameter leaf, `{n}`/`{m}` are module indices.
_PLACEHOLDERS = {
    "n": r"\d+",
    "m": r"\d+",
    "param": r"weight|bias",
    "resnet_layer": r"norm1|conv1|norm2|conv2",
    "block_norm": r"norm1|norm2",
    "residual_scale": r"scale1|scale2",
    "stem": r"conv_in|norm_out|conv_out",
    "head": r"norm_out|proj_out",
    "any": r".+",
}


def _compile(template: str) -> re.Pattern[str]:
    pattern, pos = "", 0
    for match in re.finditer(r"\{(\w+)\}", template):
        pattern += re.escape(template[pos:match.start()]) + f"(?P<{match.group(1)}>{_PLACEHOLDERS[match.group(1)]})"
        pos = match.end()
    return re.compile(pattern + re.escape(template[pos:]))


@dataclass(frozen=True)
class KeyRule:
    native: str
    diffusers: tuple[str, ...]  # one template; three (q, k, v) for SPLIT_QKV; none for DROP
    transform: Transform = Transform.RENAME

    def __post_init__(self) -> None:
        expected = {Transform.SPLIT_QKV: 3, Transform.DROP: 0}.get(self.transform, 1)
        if len(self.diffusers) != expected:
            raise ValueError(f"{self.transform.name} rule {self.native!r} needs {expected} diffusers templates")
        object.__setattr__(self, "_native_re", _compile(self.native))
        object.__setattr__(self, "_diffusers_re", tuple(_compile(t) for t in self.diffusers))

    def match_native(self, name: str) -> dict[str, str] | None:
        m = self._native_re.fullmatch(name)  # type: ignore[attr-defined]
        return m.groupdict() if m else None

    def match_diffusers(self, name: str) -> tuple[int, dict[str, str]] | None:
        """(part index, placeholder values) of the diffusers template ``name`` fits."""
        for part, regex in enumerate(self._diffusers_re):  # type: ignore[attr-defined]
            m = regex.fullmatch(name)
            if m:
                return part, m.groupdict()
        return None


def _rename(native: str, diffusers: str) -> KeyRule:
    return KeyRule(native, (diffusers,))


def _same(name: str) -> KeyRule:
    return KeyRule(name, (name,))


_VIT = "decoder.transformer_blocks.{n}"
VIDEO_VAE_RULES: tuple[KeyRule, ...] = (
    # Encoder: CompVis spelling -> diffusers down_blocks/resnets/downsamplers.
    _same("encoder.{stem}.{param}"),
    _rename(
        "encoder.down.{n}.block.{m}.{resnet_layer}.{param}",
        "encoder.down_blocks.{n}.resnets.{m}.{resnet_layer}.{param}",
    ),
    _rename(
        "encoder.down.{n}.block.{m}.nin_shortcut.{param}", "encoder.down_blocks.{n}.resnets.{m}.conv_shortcut.{param}"
    ),
    _rename("encoder.down.{n}.downsample.conv.{param}", "encoder.down_blocks.{n}.downsamplers.0.conv.{param}"),
    _same("quant_conv.{param}"),
    _same("post_quant_conv.{param}"),
    # ViT decoder.
    _rename("decoder.x_embedder.{param}", "decoder.proj_in.{param}"),
    _same("decoder.register_tokens"),
    _same("decoder.{head}.{param}"),
    _same(f"{_VIT}.{{block_norm}}.weight"),
    _same(f"{_VIT}.{{residual_scale}}"),
    KeyRule(
        f"{_VIT}.attn.to_qkv.{{param}}",
        (f"{_VIT}.attn.to_q.{{param}}", f"{_VIT}.attn.to_k.{{param}}", f"{_VIT}.attn.to_v.{{param}}"),
        Transform.SPLIT_QKV,
    ),
    _rename(f"{_VIT}.attn.to_out.{{param}}", f"{_VIT}.attn.to_out.0.{{param}}"),
    KeyRule(f"{_VIT}.ff.w1.{{param}}", (f"{_VIT}.ff.net.0.proj.{{param}}",), Transform.SWAP_HALVES),
    _rename(f"{_VIT}.ff.w2.{{param}}", f"{_VIT}.ff.net.2.{{param}}"),
    KeyRule("decoder.mask_token", (), Transform.DROP),
)

# diffusers reproduces the native audio module tree name for name (incl. weight_norm's weight_g/weight_v and the
# Kaiser `filter` buffers); the model's own key set is what makes this strict.
AUDIO_VAE_RULES: tuple[KeyRule, ...] = (_same("{any}"),)


# ---------------------------------------------------------------------------------------------------------------
# Tensor transforms


def _split_interleaved_qkv(tensor: torch.Tensor, heads: int, name: str) -> tuple[torch.Tensor, ...]:
    rows = tensor.shape[0]
    if heads <= 0 or rows % (3 * heads):
        raise ValueError(f"fused QKV {name} has {rows} rows, not divisible into {heads} heads x (q, k, v)")
    grouped = tensor.reshape(heads, 3, rows // (3 * heads), *tensor.shape[1:])  # [heads, qkv, head_dim, ...]
    return tuple(grouped[:, part].reshape(rows // 3, *tensor.shape[1:]).contiguous() for part in range(3))


def _merge_interleaved_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    rows = q.shape[0]
    parts = [t.reshape(heads, rows // heads, *t.shape[1:]) for t in (q, k, v)]  # [heads, head_dim, ...] each
    return torch.stack(parts, dim=1).reshape(3 * rows, *q.shape[1:]).contiguous()


def _swap_halves(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if tensor.shape[0] % 2:
        raise ValueError(f"{name} rows must split evenly into gate/up halves, got shape {list(tensor.shape)}")
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0).contiguous()


# ---------------------------------------------------------------------------------------------------------------
# Both directions of the mapping


def _find_native_rule(rules: Iterable[KeyRule], name: str) -> tuple[KeyRule, dict[str, str]] | None:
    for rule in rules:
        values = rule.match_native(name)
        if values is not None:
            return rule, values
    return None


def native_to_diffusers(
    weights: Iterable[tuple[str, torch.Tensor]],
    rules: Iterable[KeyRule],
    expected_shapes: Mapping[str, torch.Size],
    *,
    qkv_heads: int = 0,
) -> dict[str, torch.Tensor]:
    """Map native (name, tensor) pairs to a diffusers state dict that matches ``expected_shapes`` exactly.

    Raises ValueError, naming the keys, for: a native name seen twice or two native names landing on one diffusers
    key (duplicate), a name no rule knows (unsupported), a mapped name the model lacks (no model parameter), a
    shape that differs from the model's, and model keys nobody provided (missing).
    """
    rules = tuple(rules)
    out: dict[str, torch.Tensor] = {}
    source_of: dict[str, str] = {}
    seen: set[str] = set()
    errors: dict[str, list[str]] = {"duplicate": [], "unsupported": [], "no parameter": [], "shape": []}
    for name, tensor in weights:
        if name in seen:
            errors["duplicate"].append(name)
            continue
        seen.add(name)
        found = _find_native_rule(rules, name)
        if found is None:
            errors["unsupported"].append(name)
            continue
        rule, values = found
        if rule.transform is Transform.DROP:
            continue
        targets = [template.format(**values) for template in rule.diffusers]
        if rule.transform is Transform.SPLIT_QKV:
            tensors = _split_interleaved_qkv(tensor, qkv_heads, name)
        elif rule.transform is Transform.SWAP_HALVES:
            tensors = (_swap_halves(tensor, name),)
        else:
            tensors = (tensor,)
        for target, value in zip(targets, tensors):
            if target not in expected_shapes:
                errors["no parameter"].append(f"{name} -> {target}")
            elif target in out:
                errors["duplicate"].append(f"{name} -> {target} (also from {source_of[target]})")
            elif tuple(value.shape) != tuple(expected_shapes[target]):
                errors["shape"].append(
                    f"{name} -> {target}: got {list(value.shape)} vs expected {list(expected_shapes[target])}"
                )
            else:
                out[target] = value
                source_of[target] = name
    messages = {
        "duplicate": "duplicate native VAE weight",
        "unsupported": "unsupported native VAE weight",
        "no parameter": "native VAE weight has no model parameter",
        "shape": "shape mismatch for native VAE weight",
    }
    for kind, names in errors.items():
        if names:
            raise ValueError(f"{messages[kind]}: {', '.join(names)}")
    # A shape-mismatched key was reported above, so anything still absent was never provided at all.
    missing = sorted(set(expected_shapes) - set(out))
    if missing:
        raise ValueError(f"missing native VAE weights for diffusers keys: {', '.join(missing)}")
    return out


def diffusers_to_native(
    state_dict: Mapping[str, torch.Tensor], rules: Iterable[KeyRule], *, qkv_heads: int = 0
) -> dict[str, torch.Tensor]:
    """Inverse of ``native_to_diffusers`` over the same rules (DROP keys are not produced)."""
    rules = tuple(rules)
    parts: dict[str, tuple[KeyRule, dict[int, torch.Tensor]]] = {}
    for name, tensor in state_dict.items():
        for rule in rules:
            hit = rule.match_diffusers(name)
            if hit is not None:
                part, values = hit
                native = rule.native.format(**values)
                parts.setdefault(native, (rule, {}))[1][part] = tensor
                break
        else:
            raise ValueError(f"diffusers VAE key has no native name: {name}")
    out: dict[str, torch.Tensor] = {}
    for native, (rule, pieces) in parts.items():
        if len(pieces) != len(rule.diffusers):
            raise ValueError(f"incomplete diffusers QKV group for {native}: parts {sorted(pieces)}")
        if rule.transform is Transform.SPLIT_QKV:
            out[native] = _merge_interleaved_qkv(pieces[0], pieces[1], pieces[2], qkv_heads)
        elif rule.transform is Transform.SWAP_HALVES:
            out[native] = _swap_halves(pieces[0], native)
        else:
            out[native] = pieces[0]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Config translation. Each field: (path in the native source config, diffusers name, default or _REQUIRED).

_REQUIRED = object()

VIDEO_SOURCE_FIELDS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("in_channels",), "in_channels", _REQUIRED),
    (("out_ch",), "out_channels", _REQUIRED),
    (("z_channels",), "latent_channels", _REQUIRED),
    (("num_res_blocks",), "layers_per_block", _REQUIRED),
    (("space_down",), "spatial_downsample_factors", _REQUIRED),
    (("time_down",), "temporal_downsample_factors", _REQUIRED),
    (("norm_num_groups",), "norm_num_groups", 32),
    (("norm_eps",), "norm_eps", 1e-6),
    (("padding_mode",), "spatial_padding_mode", _REQUIRED),
    (("vit_decoder_kwargs", "num_layers"), "decoder_num_layers", _REQUIRED),
    (("vit_decoder_kwargs", "heads"), "decoder_num_attention_heads", _REQUIRED),
    (("vit_decoder_kwargs", "dim_head"), "decoder_attention_head_dim", _REQUIRED),
    (("vit_decoder_kwargs", "num_register_tokens"), "decoder_num_register_tokens", 4),
    (("vit_decoder_kwargs", "ffn_mult"), "decoder_ffn_mult", 4),
    (("vit_decoder_kwargs", "rope_theta"), "decoder_rope_theta", _REQUIRED),
    (("vit_decoder_kwargs", "rope_dim_ratio"), "decoder_rope_dim_ratio", _REQUIRED),
    (("vit_decoder_kwargs", "eps"), "decoder_norm_eps", 1e-5),
)
# (wrapper key, diffusers name): temporal chunking and latent statistics live in the outer video_vae/config.json.
VIDEO_WRAPPER_FIELDS = (
    ("vae_clip_length", "clip_length"),
    ("vae_token_drop", "token_drop"),
    ("latents_mean", "latents_mean"),
    ("latents_std", "latents_std"),
)
# Architecture switches the diffusers port bakes in: a native config that says otherwise is a different model.
VIDEO_SOURCE_FIXED: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("_class_name",), "AutoencoderKLLegacy"),
    (("use_3d_conv",), True),
    (("use_vit_decoder",), True),
    (("causal_encoder",), True),
    (("causal_decoder",), False),
    (("use_t_isolated_gn",), True),
    (("pixel_norm_type",), "imagenet"),
    (("vit_decoder_kwargs", "norm_type"), "rms_norm"),
    (("vit_decoder_kwargs", "norm_affine"), True),
    (("vit_decoder_kwargs", "qk_norm_type"), "rms_norm"),
    (("vit_decoder_kwargs", "qk_norm_affine"), False),
    (("vit_decoder_kwargs", "ffn_activation_fn"), "silu"),
    (("vit_decoder_kwargs", "ffn_use_gated"), True),
)
VIDEO_WRAPPER_FIXED = (
    ("_class_name", "MiniMaxH3VideoVAE"),
    ("mode", "standalone"),
    ("source_class_name", "AutoencoderKLLegacy"),
)

AUDIO_KWARG_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("encoder_dim", "encoder_dim", _REQUIRED),
    ("encoder_rates", "encoder_rates", _REQUIRED),
    ("latent_dim", "latent_dim", _REQUIRED),
    ("vae_latent_channels", "latent_channels", _REQUIRED),
    ("decoder_dim", "decoder_dim", _REQUIRED),
    ("decoder_rates", "decoder_rates", _REQUIRED),
    ("sample_rate", "sampling_rate", _REQUIRED),
    # Hard-coded by the reference DAC/BigVGAN code; h3batch's tiny base repo may override them.
    ("num_attention_heads", "num_attention_heads", 8),
    ("resblock_kernel_sizes", "resblock_kernel_sizes", [3, 7, 11]),
    ("resblock_dilation_sizes", "resblock_dilation_sizes", [[1, 3, 5], [1, 3, 5], [1, 3, 5]]),
)
AUDIO_KWARG_FIXED = (("decoder_type", "bigvgan"), ("attn_proj", True))


def bigvgan_kernel_sizes(rates: Iterable[int]) -> list[int]:
    """The reference pairs upsampling rate u with kernel 2u (even u) or 2u - 1 (odd u): [5, 5, 2] -> [9, 9, 4]."""
    return [2 * int(u) - int(u) % 2 for u in rates]


def _get(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = config
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return _REQUIRED
        value = value[key]
    return value


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"native VAE config missing: expected {path}") from None
    if not isinstance(data, dict):
        raise ValueError(f"native VAE config {path}: expected a JSON object, found {type(data).__name__}")
    return data


def _norm(value: Any) -> Any:
    return [_norm(v) for v in value] if isinstance(value, (list, tuple)) else value


def video_config_from_native(wrapper: Mapping[str, Any], source: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """``AutoencoderKLMiniMaxH3`` kwargs from the wrapper and source configs of a native ``video_vae/``."""
    for key, expected in VIDEO_WRAPPER_FIXED:
        if key in wrapper and wrapper[key] != expected:
            raise ValueError(f"{where}/config.json: {key}={wrapper[key]!r}, expected {expected!r}")
    for path, expected in VIDEO_SOURCE_FIXED:
        found = _get(source, path)
        if found is not _REQUIRED and found != expected:
            raise ValueError(f"{where}/source config: {'.'.join(path)}={found!r}, expected {expected!r}")
    config: dict[str, Any] = {}
    for path, name, default in VIDEO_SOURCE_FIELDS:
        value = _get(source, path)
        if value is _REQUIRED:
            if default is _REQUIRED:
                raise ValueError(f"{where}/source config: missing {'.'.join(path)} (needed for {name})")
            value = default
        config[name] = value
    ch, ch_mult = source.get("ch"), source.get("ch_mult")
    if not isinstance(ch, int) or not isinstance(ch_mult, list) or not ch_mult:
        raise ValueError(
            f"{where}/source config: expected int ch and list ch_mult, found ch={ch!r} ch_mult={ch_mult!r}"
        )
    config["block_out_channels"] = [ch * int(m) for m in ch_mult]
    embed_dim = source.get("embed_dim", config["latent_channels"])
    if embed_dim != config["latent_channels"]:
        raise ValueError(
            f"{where}/source config: embed_dim={embed_dim!r}, expected z_channels={config['latent_channels']!r}"
        )
    for key, name in VIDEO_WRAPPER_FIELDS:
        if key not in wrapper:
            raise ValueError(f"{where}/config.json: missing {key} (needed for {name})")
        config[name] = wrapper[key]
    latent = config["latent_channels"]
    for name in ("latents_mean", "latents_std"):
        if len(config[name]) != latent:
            raise ValueError(f"{where}/config.json: {name} has {len(config[name])} entries, expected {latent}")
    if "latent_channels" in wrapper and wrapper["latent_channels"] != latent:
        raise ValueError(f"{where}/config.json: latent_channels={wrapper['latent_channels']!r}, expected {latent}")
    return {k: _norm(v) for k, v in config.items()}


def video_config_to_native(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(wrapper config, source config) in native spelling for diffusers kwargs; inverse of the function above."""
    channels = [int(c) for c in config["block_out_channels"]]
    ch = channels[0]
    if any(c % ch for c in channels):
        raise ValueError(f"block_out_channels {channels} are not multiples of the first (native ch * ch_mult)")
    source: dict[str, Any] = {}
    for path, expected in VIDEO_SOURCE_FIXED:
        _put(source, path, expected)
    for path, name, default in VIDEO_SOURCE_FIELDS:
        value = _norm(config[name])
        if default is _REQUIRED or value != default:
            _put(source, path, value)
    source.update(ch=ch, ch_mult=[c // ch for c in channels], embed_dim=int(config["latent_channels"]))
    wrapper: dict[str, Any] = dict(VIDEO_WRAPPER_FIXED)
    wrapper.update(
        source_path="source",
        source_safetensors_path="model.safetensors",
        vae_encoder_tiling=1,
        vae_decoder_tiling=1,
        vae_tile_size=256,
        vae_tile_overlap_min=64,
        latent_channels=int(config["latent_channels"]),
    )
    for key, name in VIDEO_WRAPPER_FIELDS:
        wrapper[key] = _norm(config[name])
    return wrapper, source


def _put(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value


def audio_config_from_native(metadata: Mapping[str, Any], wrapper: Mapping[str, Any], where: Path) -> dict[str, Any]:
    """``AutoencoderKLMiniMaxH3Audio`` kwargs from ``metadata.json`` kwargs and ``config.json`` of ``audio_vae/``."""
    kwargs = _get(metadata, ("metadata", "kwargs"))
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"{where}/metadata.json: expected metadata.kwargs object, found {kwargs!r}")
    for key, expected in AUDIO_KWARG_FIXED:
        if kwargs.get(key) != expected:
            raise ValueError(f"{where}/metadata.json: {key}={kwargs.get(key)!r}, expected {expected!r}")
    config: dict[str, Any] = {}
    for key, name, default in AUDIO_KWARG_FIELDS:
        if key in kwargs:
            config[name] = kwargs[key]
        elif default is _REQUIRED:
            raise ValueError(f"{where}/metadata.json: missing kwargs.{key} (needed for {name})")
        else:
            config[name] = default
    config["decoder_kernel_sizes"] = bigvgan_kernel_sizes(config["decoder_rates"])
    for key, name in (("latent_channels", "latent_channels"), ("sample_rate", "sampling_rate")):
        if wrapper.get(key) != config[name]:
            raise ValueError(
                f"{where}/config.json: {key}={wrapper.get(key)!r}, expected {config[name]!r} (metadata.json)"
            )
    for name in ("latents_mean", "latents_std"):
        values = wrapper.get(name)
        if not isinstance(values, list) or len(values) != config["latent_channels"]:
            raise ValueError(
                f"{where}/config.json: {name} must list {config['latent_channels']} floats, found {values!r}"
            )
        config[name] = values
    return {k: _norm(v) for k, v in config.items()}


def audio_config_to_native(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata.json, config.json) in native spelling for diffusers audio-VAE kwargs."""
    if _norm(config["decoder_kernel_sizes"]) != bigvgan_kernel_sizes(config["decoder_rates"]):
        raise ValueError(
            f"decoder_kernel_sizes {list(config['decoder_kernel_sizes'])} cannot be expressed natively: the "
            f"reference derives {bigvgan_kernel_sizes(config['decoder_rates'])} from decoder_rates"
        )
    kwargs: dict[str, Any] = dict(AUDIO_KWARG_FIXED)
    for key, name, default in AUDIO_KWARG_FIELDS:
        value = _norm(config[name])
        if default is _REQUIRED or value != default:
            kwargs[key] = value
    wrapper = {
        "_class_name": "MiniMaxH3AudioVAE",
        "latent_channels": int(config["latent_channels"]),
        "sample_rate": int(config["sampling_rate"]),
        "source_safetensors_path": "model.safetensors",
        "source_metadata_path": "metadata.json",
        "latents_mean": _norm(config["latents_mean"]),
        "latents_std": _norm(config["latents_std"]),
    }
    return {"metadata": {"kwargs": kwargs}}, wrapper


# ---------------------------------------------------------------------------------------------------------------
# Loaders


def _sorted_items(path: Path) -> list[tuple[str, torch.Tensor]]:
    if not path.is_file():
        raise ValueError(f"native VAE weights missing: expected {path}")
    return sorted(load_file(str(path)).items())


def _load_strict(model_cls, config: dict[str, Any], weights, rules, qkv_heads: int, dtype: torch.dtype):
    """Build ``model_cls(**config)`` without initialising parameters, then assign the mapped weights."""
    from accelerate import init_empty_weights  # parameters on meta; buffers (RoPE, Kaiser filters) real

    with init_empty_weights(include_buffers=False):
        model = model_cls(**config)
    expected = model.state_dict()
    state = native_to_diffusers(weights, rules, {k: v.shape for k, v in expected.items()}, qkv_heads=qkv_heads)
    # Parameters take `dtype` except in the modules diffusers pins to fp32; buffers keep the model's own dtype.
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    parameters = {name for name, _ in model.named_parameters()}
    for name, tensor in state.items():
        if name not in parameters:
            state[name] = tensor.to(expected[name].dtype)
        elif any(part in keep_fp32 for part in name.split(".")):
            state[name] = tensor.to(torch.float32)
        else:
            state[name] = tensor.to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def load_video_vae(fl2va_root: str | Path, dtype: torch.dtype = torch.float32):
    """``AutoencoderKLMiniMaxH3`` from ``<fl2va_root>/video_vae`` (native format), strict; tiling as configured."""
    from diffusers import AutoencoderKLMiniMaxH3

    where = Path(fl2va_root) / VIDEO_VAE_DIR
    wrapper = _read_json(where / "config.json")
    source_dir = where / str(wrapper.get("source_path", "source"))
    source = _read_json(source_dir / "config.json")
    config = video_config_from_native(wrapper, source, where)
    weights = _sorted_items(source_dir / str(wrapper.get("source_safetensors_path", "model.safetensors")))
    vae = _load_strict(
        AutoencoderKLMiniMaxH3, config, weights, VIDEO_VAE_RULES, config["decoder_num_attention_heads"], dtype
    )
    if int(wrapper.get("vae_decoder_tiling", 1)):
        tile, overlap = int(wrapper.get("vae_tile_size", 256)), int(wrapper.get("vae_tile_overlap_min", 64))
        vae.enable_tiling(tile, tile, overlap, overlap)
    else:
        vae.disable_tiling()
    return vae


def load_audio_vae(fl2va_root: str | Path):
    """``AutoencoderKLMiniMaxH3Audio`` from ``<fl2va_root>/audio_vae`` (native format), strict, fp32 only (§11.2)."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    where = Path(fl2va_root) / AUDIO_VAE_DIR
    metadata = _read_json(where / "metadata.json")
    wrapper = _read_json(where / "config.json")
    config = audio_config_from_native(metadata, wrapper, where)
    weights = _sorted_items(where / str(wrapper.get("source_safetensors_path", "model.safetensors")))
    return _load_strict(AutoencoderKLMiniMaxH3Audio, config, weights, AUDIO_VAE_RULES, 0, torch.float32)
