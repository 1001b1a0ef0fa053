"""Test helpers for the native DiT: the diffusers oracle at tiny sizes and a hand-built T2VA packed layout (§4.2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from diffusers import MiniMaxH3Transformer3DModel

from h3batch.worker.h3.config import H3Config

# Top-level diffusers modules that the checkpoint keeps in fp32 (its `_keep_in_fp32_modules`).
ORACLE_FP32_MODULES = ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out")


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Re-draw every parameter so no path is trivially zero (diffusers zero-inits nothing here, but norms are 1).

    Linear weights ~ N(0, 1/fan_in), biases and norm offsets ~ 0.1·N(0, 1); AdaLN projections are scaled down so the
    (1 + scale) modulation stays O(1) and the signal survives several blocks; the output heads are scaled so the
    velocities come out with a standard deviation near 1, the scale the bf16 tolerance of spec §13.3 refers to.
    """
    device = next(module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32, device=device)
            if param.ndim == 1 and "norm" in name:
                value = 1.0 + 0.1 * noise
            elif param.ndim == 1:
                value = 0.1 * noise
            else:
                value = noise / param.shape[1] ** 0.5
                if "adaln_proj" in name or "norm_out.linear" in name:
                    value = 0.5 * value
                elif name.startswith(("proj_out", "audio_proj_out")):
                    value = 0.4 * value
            param.copy_(value.to(param.dtype))


def make_oracle(config: H3Config, seed: int = 0, device: str = "cpu") -> MiniMaxH3Transformer3DModel:
    """The diffusers model for ``config`` in fp32 with random non-trivial weights, in eval mode."""
    with torch.device(device):
        oracle = MiniMaxH3Transformer3DModel(**config.to_diffusers_config())
    randomize_(oracle, seed)
    return oracle.eval()


def oracle_to_mixed_bf16(oracle: MiniMaxH3Transformer3DModel) -> MiniMaxH3Transformer3DModel:
    """As ``from_pretrained(torch_dtype=bf16)`` loads it: bf16 except the fp32 modules; inv_freq stays fp32."""
    with torch.no_grad():
        for name, param in oracle.named_parameters():
            if name.split(".")[0] not in ORACLE_FP32_MODULES:
                param.data = param.data.to(torch.bfloat16)
    return oracle


def gate_tensors(config: H3Config, *, seed: int | None) -> dict[str, torch.Tensor]:
    """Diffusers-named V2 gates for every DiT block: zeros (seed None) or random."""
    shape = (config.inner_dim, config.hidden_size)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    gates = {}
    for i in range(config.num_layers):
        value = torch.zeros(shape) if seed is None else torch.randn(shape, generator=generator) / shape[1] ** 0.5
        gates[f"transformer_blocks.{i}.attn.to_gate_compress.weight"] = value
    return gates


@dataclass
class PackedInputs:
    """Keyword arguments of one forward (diffusers and native share them)."""

    hidden_states: torch.Tensor
    audio_hidden_states: torch.Tensor
    encoder_hidden_states: torch.Tensor
    timestep: torch.Tensor
    timestep_indices: torch.Tensor
    token_tags: torch.Tensor
    position_ids: torch.Tensor
    video_indices: torch.Tensor
    audio_indices: torch.Tensor
    text_indices: torch.Tensor

    def kwargs(self) -> dict[str, torch.Tensor]:
        return dict(self.__dict__)

    def to(self, device: str | torch.device) -> "PackedInputs":
        """The same inputs on ``device``."""
        return PackedInputs(**{k: v.to(device) for k, v in self.__dict__.items()})


def _spatial_grid(length: int, latent_height: int, latent_width: int) -> np.ndarray:
    side = (latent_height * latent_width) ** 0.5
    ratio = length / side
    left = (1.0 - ratio) / 2.0
    return 32.0 * np.linspace(left, left + ratio, length // 2, endpoint=False)


def t2va_inputs(
    config: H3Config,
    *,
    text_rows: int = 7,
    audio_latents: int = 5,
    latent_frames: int = 3,
    latent_height: int = 4,
    latent_width: int = 6,
    t_video: float = 0.23,
    t_audio: float = 0.5,
    batch: int = 1,
    seed: int = 1,
) -> PackedInputs:
    """Packed ``[text L | audio 2A | video T·Hl/2·Wl/2]`` layout of §4.2 with random latents and text features."""
    L, A = text_rows, audio_latents
    h_grid = _spatial_grid(latent_height, latent_height, latent_width)
    w_grid = _spatial_grid(latent_width, latent_height, latent_width)
    steps = [(5.0 / 3.0) * (1, 4, 4, 4, 4)[j % 5] for j in range(latent_frames)]
    frame_t = float(L) + np.concatenate(([0.0], np.cumsum(steps)[:-1]))

    positions = [(k, 0.0, 0.0) for k in range(L)]
    positions += [(L + j, 0.0, w_grid[0]) for j in range(A)]
    positions += [(L + j, 0.0, w_grid[-1]) for j in range(A)]
    positions += [(frame_t[f], h, w) for f in range(latent_frames) for h in h_grid for w in w_grid]
    position_ids = torch.tensor(positions, dtype=torch.float64)

    video_rows = latent_frames * (latent_height // 2) * (latent_width // 2)
    tags = [1] * L + [2] * (2 * A) + [0] * video_rows
    token_tags = torch.tensor(tags, dtype=torch.long)
    timestep = torch.tensor([t_video, t_audio], dtype=torch.float32)
    timestep_indices = (token_tags == 2).long()
    rows = L + 2 * A + video_rows

    generator = torch.Generator().manual_seed(seed)
    return PackedInputs(
        hidden_states=torch.randn(batch, video_rows, config.video_patch_dim, generator=generator),
        audio_hidden_states=torch.randn(batch, 2 * A, config.audio_latents_dim, generator=generator),
        encoder_hidden_states=torch.randn(batch, L, config.text_dim, generator=generator),
        timestep=timestep,
        timestep_indices=timestep_indices,
        token_tags=token_tags,
        position_ids=position_ids,
        video_indices=torch.arange(L + 2 * A, rows),
        audio_indices=torch.arange(L, L + 2 * A),
        text_indices=torch.arange(L),
    )


def oracle_forward(oracle: MiniMaxH3Transformer3DModel, inputs: PackedInputs) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return oracle(**inputs.kwargs(), return_dict=False)
