"""MiniMax-H3 DiT configuration: one frozen dataclass in native (N) field names, read from a Diffusers config.json.

Diffusers saves every ``__init__`` argument of ``MiniMaxH3Transformer3DModel`` to ``transformer/config.json``; seven of
those names differ from the native MiniMax names used here (spec h3-model.md §2.1). ``H3Config.from_diffusers_config``
translates exactly those seven, fills the two derived AdaLN widths and coerces ``patch_size`` to a tuple. Tiny configs
for CPU tests (§2.2) sit beside the real 33B one in ``CONFIGS``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Mapping

logger = logging.getLogger(__name__)

# Rows of the packed sequence carry one of three modality tags (0 video, 1 text, 2 audio); every AdaLN projection holds
# one set of six modulation vectors per modality.
MODALITY_COUNT = 3

DIFFUSERS_CLASS_NAME = "MiniMaxH3Transformer3DModel"

# The seven Diffusers config names that have a different native name (§2.1). All other fields share their name.
DIFFUSERS_TO_NATIVE_FIELD = {
    "num_refiner_layers": "token_refiner_num_layers",
    "ffn_dim": "ffn_hidden_size",
    "in_channels": "latents_dim",
    "audio_in_channels": "audio_latents_dim",
    "freq_dim": "timestep_input_dim",
    "time_embed_hidden_dim": "time_embed_hidden_size",
    "rope_freq_dim": "rope_inv_freq_len",
}


@dataclass(frozen=True)
class H3Config:
    """Shape of one MiniMax-H3 DiT; defaults are the 33B release. Derived widths are filled in ``__post_init__``."""

    num_attention_heads: int = 56  # attention heads (MHA: K/V heads = Q heads)
    attention_head_dim: int = 128  # channels per head; heads x head_dim = attention width I, may differ from H
    hidden_size: int = 5376  # H: residual stream width, channels
    num_layers: int = 50  # DiT blocks
    token_refiner_num_layers: int = 2  # text token-refiner blocks
    ffn_hidden_size: int = 14336  # F: SwiGLU inner width, channels
    latents_dim: int = 24  # video latent channels
    audio_latents_dim: int = 32  # audio latent channels
    patch_size: tuple[int, int, int] = (1, 2, 2)  # video patch (t, h, w) in latent frames and latent pixels
    text_dim: int = 5120  # text encoder (Qwen3-VL) hidden width, channels
    timestep_input_dim: int = 256  # sinusoidal timestep embedding width
    time_embed_hidden_size: int = 5376  # timestep MLP inner width
    time_embed_dim: int = 2688  # timestep embedding width that every AdaLN projection takes
    rope_inv_freq_len: int = 16  # RoPE frequencies per axis: 3 axes x 2 x this many head channels rotate
    rope_theta: float = 10000.0  # RoPE base of the inverse frequencies
    norm_eps: float = 1e-5  # RMSNorm eps of the block and refiner norms (added to the mean square)
    qk_norm_eps: float = 1e-5  # RMSNorm eps of the per-head q and k norms
    final_norm_eps: float = 1e-5  # RMSNorm eps of the final norm before the output projection
    # Derived (0 = fill from hidden_size): 3 modalities x 6 vectors, and the final layer's shift + scale.
    adaln_out_features: int = 0  # block AdaLN projection width, 18 x H
    final_adaln_out_features: int = 0  # final-layer AdaLN projection width, 2 x H
    # FastH3 V2 adds a bf16 `attn.to_gate_compress` [I, H] to every DiT block (never the refiner), used by VSA-H3.
    vsa_gates: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "patch_size", tuple(int(p) for p in self.patch_size))
        if len(self.patch_size) != 3:
            raise ValueError(f"patch_size must have 3 entries (t, h, w), got {self.patch_size}")
        expected_adaln = 6 * MODALITY_COUNT * self.hidden_size
        expected_final = 2 * self.hidden_size
        if self.adaln_out_features == 0:
            object.__setattr__(self, "adaln_out_features", expected_adaln)
        if self.final_adaln_out_features == 0:
            object.__setattr__(self, "final_adaln_out_features", expected_final)
        if self.adaln_out_features != expected_adaln:
            raise ValueError(
                f"adaln_out_features must be 18 * hidden_size = {expected_adaln}, got {self.adaln_out_features}"
            )
        if self.final_adaln_out_features != expected_final:
            raise ValueError(
                f"final_adaln_out_features must be 2 * hidden_size = {expected_final}, "
                f"got {self.final_adaln_out_features}"
            )
        # Partial RoPE: 2 * 3 axes * rope_inv_freq_len channels rotate, the rest of each head passes through.
        if not 0 < self.rotary_dim < self.attention_head_dim:
            raise ValueError(
                f"rotary width 6 * rope_inv_freq_len = {self.rotary_dim} must be in (0, attention_head_dim = "
                f"{self.attention_head_dim})"
            )
        if self.attention_head_dim % 2:
            raise ValueError(f"attention_head_dim must be even, got {self.attention_head_dim}")

    # Derived sizes --------------------------------------------------------------------------------------------------
    @property
    def inner_dim(self) -> int:
        """I = heads * head_dim (7168 for H3; larger than hidden_size)."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def video_patch_dim(self) -> int:
        """P = latents_dim * prod(patch_size) (96 for H3): width of one packed video row."""
        t, h, w = self.patch_size
        return self.latents_dim * t * h * w

    @property
    def rotary_dim(self) -> int:
        """Channels of each head that RoPE rotates: 2 * 3 axes * rope_inv_freq_len (96 of 128 for H3)."""
        return 2 * 3 * self.rope_inv_freq_len

    # Construction ---------------------------------------------------------------------------------------------------
    @classmethod
    def from_diffusers_config(cls, config: Mapping[str, Any], *, vsa_gates: bool = False) -> H3Config:
        """Build from a Diffusers ``config.json`` dict: the seven aliases become N names, ``_``-keys are ignored.

        Native names are accepted as well (the alias rule only touches the seven Diffusers names). Unknown keys are
        logged and skipped, so an unverified extra field in a release config does not stop loading.
        """
        known = {f.name for f in dataclasses.fields(cls)} - {"vsa_gates"}
        values: dict[str, Any] = {}
        for key, value in config.items():
            if key.startswith("_"):
                continue
            name = DIFFUSERS_TO_NATIVE_FIELD.get(key, key)
            if name not in known:
                logger.warning("ignoring unknown MiniMax-H3 config field %r=%r", key, value)
                continue
            if name in values:
                raise ValueError(f"MiniMax-H3 config sets {name!r} twice (Diffusers and native spelling): {key!r}")
            values[name] = value
        return cls(**values, vsa_gates=vsa_gates)

    def to_diffusers_config(self) -> dict[str, Any]:
        """``MiniMaxH3Transformer3DModel`` keyword arguments (and config.json fields) for this shape; drops gates."""
        native_to_diffusers = {n: d for d, n in DIFFUSERS_TO_NATIVE_FIELD.items()}
        derived = {"adaln_out_features", "final_adaln_out_features", "vsa_gates"}
        values = {
            native_to_diffusers.get(f.name, f.name): getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in derived
        }
        values["patch_size"] = list(self.patch_size)
        return values

    def with_gates(self, vsa_gates: bool = True) -> H3Config:
        """The same shape with or without the V2 compression gates."""
        return dataclasses.replace(self, vsa_gates=vsa_gates)


def parameter_count(config: H3Config) -> int:
    """Parameters of the DiT from the closed formula of spec §12 (``rope.inv_freq`` is a buffer, not counted)."""
    c = config
    hidden, inner, ffn, temb = c.hidden_size, c.inner_dim, c.ffn_hidden_size, c.time_embed_dim
    attention = 3 * inner * hidden + hidden * inner + 2 * c.attention_head_dim  # qkv, out, q/k norm weights
    mlp = 3 * ffn * hidden  # fc1 [2Ff, H] + fc2 [H, Ff]
    norms = 2 * hidden
    refiner_block = attention + mlp + norms
    dit_block = refiner_block + c.adaln_out_features * temb + c.adaln_out_features
    if c.vsa_gates:
        dit_block += inner * hidden
    top = (
        (c.video_patch_dim + 1) * hidden  # video patch projection
        + (c.audio_latents_dim + 1) * hidden  # audio patch projection
        + (c.text_dim + 1) * hidden  # condition projection
        + (c.timestep_input_dim + 1) * c.time_embed_hidden_size  # time MLP in
        + (c.time_embed_hidden_size + 1) * temb  # time MLP out
        + hidden  # refiner final norm
        + hidden  # final norm
        + (temb + 1) * c.final_adaln_out_features  # final AdaLN
        + (hidden + 1) * c.video_patch_dim  # video head
        + (hidden + 1) * c.audio_latents_dim  # audio head
    )
    return c.num_layers * dit_block + c.token_refiner_num_layers * refiner_block + top


H3_33B = H3Config()

# Diffusers conversion-script test config: I = H. Rows as in spec §2.2's table.
T1 = H3Config(
    num_attention_heads=2, attention_head_dim=32, hidden_size=64,  # heads x head_dim = I = H = 64
    num_layers=2, token_refiner_num_layers=2,
    ffn_hidden_size=128, text_dim=48,
    timestep_input_dim=16, time_embed_hidden_size=64, time_embed_dim=32,
    rope_inv_freq_len=4,  # rotates 24 of the 32 head channels
)

# Recommended test config: I = 128 != H = 96, so every [I, H] / [H, I] transpose mistake shows.
T2 = H3Config(
    num_attention_heads=4, attention_head_dim=32, hidden_size=96,  # I = 4 x 32 = 128, not H
    num_layers=3, token_refiner_num_layers=2,
    ffn_hidden_size=160, text_dim=80,
    timestep_input_dim=16, time_embed_hidden_size=96, time_embed_dim=48,
    rope_inv_freq_len=4,
)

CONFIGS: dict[str, H3Config] = {"minimax-h3-33b": H3_33B, "T1": T1, "T2": T2}
