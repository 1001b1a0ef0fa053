"""The FastH3 V2 8-step sampler (spec h3-model.md §9): shifted sigma ladders, Euler update, seeded initial noise.
The native MiniMax-H3 release uses the same Euler update and noise draw on its own ladder (`SigmaLadder.native`).

Why this is its own file rather than diffusers' `MiniMaxH3Scheduler` (which is the test oracle):
1. V2 runs a fixed 9-node ladder built from hand-picked base nodes (0.999, 0.874, …, 0) with shift 10 for video and 3
   for audio; the scheduler's own grid is `linspace(1, 0, n)` with a default shift of 12, so it can only be driven
   with explicit sigmas.
2. One forward serves both modalities, which share the step index k but not σ; a stateless `euler_step(x, v, k,
   sigmas)` keeps the two ladders in lockstep without two stateful scheduler objects and their timestep look-ups.
3. The noise draw order (video tensor first, then audio already in row layout, from one CPU generator) is part of
   what a seed reproduces, so it lives beside the ladder rather than in the pipeline loop.
All arithmetic is float32 as the released runtime does it; `t = f32(1 − σ)`, and x̂0 recovers σ from that t.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from h3batch.core.geometry import AUDIO_CHANNELS, RequestGeometry

BASE_NODES = (0.999, 0.874, 0.749, 0.624, 0.5, 0.375, 0.25, 0.125, 0.0)
"""The 9 V2 base nodes u; the shift maps each to σ. Not a uniform grid."""
VIDEO_SHIFT = 10.0
AUDIO_SHIFT = 3.0
NUM_FORWARDS = len(BASE_NODES) - 1  # 8 DiT forwards per request

VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
MAX_SEED = 2**64 - 1


def shifted_sigmas(
    shift: float, base_nodes: tuple[float, ...] = BASE_NODES, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """σ(u; s) = s·u / (1 + (s−1)·u) on the base nodes, all arithmetic in `dtype`; [9] on CPU.

    The runtime ladder is float32 (the released behaviour); float64 exists for the spec's contract values.
    """
    u = torch.tensor(base_nodes, dtype=dtype)
    return shift * u / (1 + (shift - 1) * u)


@dataclass(frozen=True, eq=False)
class SigmaLadder:
    """Paired video/audio σ ladders (fp32 [K+1] CPU tensors, strictly decreasing, ending at 0)."""

    video_sigmas: torch.Tensor
    audio_sigmas: torch.Tensor

    @classmethod
    def v2(cls) -> "SigmaLadder":
        """The FastH3 V2 ladder: base nodes with shift 10 (video) and 3 (audio)."""
        return cls(shifted_sigmas(VIDEO_SHIFT), shifted_sigmas(AUDIO_SHIFT))

    @classmethod
    def native(cls, grid_points: int, video_shift: float, audio_shift: float) -> "SigmaLadder":
        """The native MiniMax-H3 ladders: ``linspace(1, 0, grid_points)`` in float32 pushed through each shift, with
        consecutive float32 duplicates collapsed, as ``MiniMaxH3Scheduler.set_timesteps(grid_points)`` builds them
        (the published release: 50 points, 49 forwards, shifts 12 / 3 from its scheduler configs)."""
        if isinstance(grid_points, bool) or not isinstance(grid_points, int) or grid_points < 2:
            raise ValueError(f"grid_points: expected an integer >= 2, got {grid_points!r}")
        base = torch.linspace(1.0, 0.0, grid_points, dtype=torch.float32)
        ladders = [torch.unique_consecutive(shift * base / (1 + (shift - 1) * base))
                   for shift in (float(video_shift), float(audio_shift))]
        return cls(*ladders)

    def __post_init__(self) -> None:
        for name, sigmas in (("video_sigmas", self.video_sigmas), ("audio_sigmas", self.audio_sigmas)):
            if sigmas.dtype != torch.float32 or sigmas.ndim != 1 or sigmas.numel() < 2:
                raise ValueError(f"{name}: expected a 1-D float32 tensor of ≥ 2 sigmas, got {sigmas.dtype} "
                                 f"{tuple(sigmas.shape)}")
            if not bool((sigmas[1:] < sigmas[:-1]).all()) or float(sigmas[-1]) != 0.0:
                raise ValueError(f"{name}: expected strictly decreasing sigmas ending at 0.0, got {sigmas.tolist()}")
        if self.video_sigmas.numel() != self.audio_sigmas.numel():
            raise ValueError(f"ladders must have equal length, got video {self.video_sigmas.numel()} and audio "
                             f"{self.audio_sigmas.numel()}")

    @property
    def num_steps(self) -> int:
        """Number of DiT forwards (nodes − 1)."""
        return self.video_sigmas.numel() - 1

    def timesteps(self, k: int) -> tuple[float, float]:
        """(t_video, t_audio) = f32(1 − σ_k) of forward k, as Python floats holding exact float32 values."""
        self._check_step(k)
        return (_clean_time(self.video_sigmas, k), _clean_time(self.audio_sigmas, k))

    def step(
        self, k: int, video: torch.Tensor, video_velocity: torch.Tensor, audio: torch.Tensor,
        audio_velocity: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance both modalities from node k to k+1 (shared k, own σ); returns (video, audio) fp32 states."""
        self._check_step(k)
        return euler_step(video, video_velocity, k, self.video_sigmas), euler_step(
            audio, audio_velocity, k, self.audio_sigmas
        )

    def _check_step(self, k: int) -> None:
        if not 0 <= k < self.num_steps:
            raise IndexError(f"step k: expected 0 ≤ k < {self.num_steps}, got {k}")


def _clean_time(sigmas: torch.Tensor, k: int) -> float:
    return float(1.0 - sigmas[k])  # fp32 subtraction, then the exact f32 value as a Python float


def euler_step(x: torch.Tensor, v: torch.Tensor, k: int, sigmas: torch.Tensor) -> torch.Tensor:
    """One deterministic Euler step of one modality from σ_k to σ_{k+1}, float32 (§9).

    x: fp32 latent state (any shape, any device); v: the DiT's data-ward velocity, same shape.
    x̂0 = x + (1 − t)·v with t = f32(1 − σ_k); r = σ_{k+1}/σ_k; returns r·x + (1 − r)·x̂0 (k = last gives x̂0).
    """
    if not 0 <= k < sigmas.numel() - 1:
        raise IndexError(f"step k: expected 0 ≤ k < {sigmas.numel() - 1}, got {k}")
    if x.dtype != torch.float32:
        raise ValueError(f"latent state: expected float32, got {x.dtype}")
    if v.shape != x.shape:
        raise ValueError(f"velocity: expected shape {tuple(x.shape)} like the latent state, got {tuple(v.shape)}")
    # Scalars are computed as fp32 CPU tensors and handed over as Python floats holding exact fp32 values, so the
    # device tensors see the same numbers without a host-device copy per step.
    sigma, sigma_next = sigmas[k], sigmas[k + 1]
    t = 1.0 - sigma  # the fp32 clean time the DiT was conditioned on
    one_minus_t = float(1.0 - t)  # σ recovered from t (not σ_k itself: f32(1 − (1 − σ)) ≠ σ for σ < 0.5)
    ratio = sigma_next / sigma
    r = float(ratio)
    one_minus_r = float(1.0 - ratio)
    denoised = x + one_minus_t * v.to(torch.float32)  # x̂0
    return r * x + one_minus_r * denoised


def initial_noise(seed: int, geometry: RequestGeometry,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit Gaussian noise of one request from a CPU generator seeded with `seed` (§9), on CPU.

    Returns (video latents fp32 [1, 24, T, Hl, Wl], audio rows fp32 [2A, 32]); video is drawn first, then audio from
    the same generator, directly in row layout. No σ_0 scaling. `generator`: the request's generator (seeded with
    `seed`) when something was drawn from it before (fl2va's keyframe noise comes first).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed: expected an integer in [0, 2**64 - 1], got {seed!r}")
    generator = generator if generator is not None else torch.Generator(device="cpu").manual_seed(seed)
    video = torch.randn(
        (1, VIDEO_LATENT_CHANNELS, geometry.latent_frames, geometry.latent_height, geometry.latent_width),
        generator=generator,
        dtype=torch.float32,
    )
    audio = torch.randn(
        (AUDIO_CHANNELS * geometry.audio_latents, AUDIO_LATENT_CHANNELS), generator=generator, dtype=torch.float32
    )
    return video, audio
