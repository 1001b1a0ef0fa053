"""The T2VA packed sequence (spec h3-model.md §4.2): row layout, RoPE positions, row timesteps, latent ⇄ row packing.

One DiT forward sees a single sequence `[text L | audio left A | audio right A | video T·(Hl/2)·(Wl/2)]`. This module
builds that layout once per request and converts latents to and from rows. Positions are reproduced bit-for-bit in
float64 as the diffusers oracle builds them (`modular_pipelines/minimax_h3/before_denoise.py`): spatial grids with
`numpy.linspace(endpoint=False)` (not `torch.linspace`, which computes different float64 values) and the temporal
offsets as a running float64 cumulative sum added to L afterwards.

Written here rather than called from diffusers (spec §1.1 assigns packing to h3batch, diffusers is the oracle): the
oracle functions are static methods of modular-pipeline blocks built for keyframe and reference layouts, flatten the
batch axis, and their block refuses the 4–5 s requests h3batch serves. Tests check bit-equality against them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from h3batch.core.geometry import AUDIO_CHANNELS, RequestGeometry

VIDEO_TAG = 0
TEXT_TAG = 1
AUDIO_TAG = 2
PATCH_SIZE = (1, 2, 2)
VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
VIDEO_ROW_DIM = VIDEO_LATENT_CHANNELS * PATCH_SIZE[0] * PATCH_SIZE[1] * PATCH_SIZE[2]  # 96

# One latent frame advances the rotary clock by 5/3 × (1, 4, 4, 4, 4)[f mod 5]: the first latent of a VAE chunk
# covers one pixel frame, the others four; 5/3 converts 24 fps frames to 40/s audio-latent units.
_FRAME_RESCALE = 5.0 / 3.0
_FRAMES_PER_LATENT = (1, 4, 4, 4, 4)
_SPATIAL_SCALE = 32


def patchify_video(latents: torch.Tensor) -> torch.Tensor:
    """Video latents [B, 24, T, Hl, Wl] → rows [B, T·(Hl/2)·(Wl/2), 96], channel-major features (c·4 + dy·2 + dx)."""
    if latents.ndim != 5 or latents.shape[1] != VIDEO_LATENT_CHANNELS:
        raise ValueError(f"video latents: expected [B, {VIDEO_LATENT_CHANNELS}, T, Hl, Wl], got {tuple(latents.shape)}")
    b, c, t, h, w = latents.shape
    if h % 2 or w % 2:
        raise ValueError(f"video latents: expected even Hl and Wl for the (1,2,2) patch, got Hl={h}, Wl={w}")
    x = latents.reshape(b, c, t, h // 2, 2, w // 2, 2)  # [B, C, T, Hp, dy, Wp, dx]
    x = x.permute(0, 2, 3, 5, 1, 4, 6)  # [B, T, Hp, Wp, C, dy, dx]
    return x.reshape(b, t * (h // 2) * (w // 2), c * 4).contiguous()


def unpatchify_video(rows: torch.Tensor, latent_frames: int, latent_height: int, latent_width: int) -> torch.Tensor:
    """Rows [B, T·(Hl/2)·(Wl/2), 96] → video latents [B, 24, T, Hl, Wl]; exact inverse of `patchify_video`."""
    t, hp, wp = latent_frames, latent_height // 2, latent_width // 2
    if rows.ndim != 3 or rows.shape[1] != t * hp * wp or rows.shape[2] != VIDEO_ROW_DIM:
        raise ValueError(
            f"video rows: expected [B, {t * hp * wp}, {VIDEO_ROW_DIM}] for T={t}, Hl={latent_height}, "
            f"Wl={latent_width}, got {tuple(rows.shape)}"
        )
    b = rows.shape[0]
    x = rows.reshape(b, t, hp, wp, VIDEO_LATENT_CHANNELS, 2, 2)  # [B, T, Hp, Wp, C, dy, dx]
    x = x.permute(0, 4, 1, 2, 5, 3, 6)  # [B, C, T, Hp, dy, Wp, dx]
    return x.reshape(b, VIDEO_LATENT_CHANNELS, t, latent_height, latent_width).contiguous()


def pack_audio(latents: torch.Tensor) -> torch.Tensor:
    """Audio latents [2, 32, A] (stereo as batch) → rows [2A, 32]: left channel rows 0…A−1, right A…2A−1."""
    if latents.ndim != 3 or latents.shape[0] != AUDIO_CHANNELS or latents.shape[1] != AUDIO_LATENT_CHANNELS:
        raise ValueError(
            f"audio latents: expected [{AUDIO_CHANNELS}, {AUDIO_LATENT_CHANNELS}, A], got {tuple(latents.shape)}"
        )
    return latents.permute(0, 2, 1).reshape(-1, AUDIO_LATENT_CHANNELS).contiguous()


def unpack_audio(rows: torch.Tensor) -> torch.Tensor:
    """Rows [2A, 32] → audio latents [2, 32, A] for the (mono, batch = channel) audio VAE; inverse of `pack_audio`."""
    if rows.ndim != 2 or rows.shape[1] != AUDIO_LATENT_CHANNELS or rows.shape[0] % AUDIO_CHANNELS:
        raise ValueError(f"audio rows: expected [2A, {AUDIO_LATENT_CHANNELS}], got {tuple(rows.shape)}")
    a = rows.shape[0] // AUDIO_CHANNELS
    return rows.reshape(AUDIO_CHANNELS, a, AUDIO_LATENT_CHANNELS).permute(0, 2, 1).contiguous()


def spatial_grid(length: int, latent_height: int, latent_width: int) -> np.ndarray:
    """RoPE coordinates of one spatial axis of latent length `length` (Hl or Wl): float64 [length/2]."""
    sqrt_area = np.sqrt(latent_height * latent_width)
    ratio = length / sqrt_area
    left = (1.0 - ratio) / 2.0
    return np.linspace(left, left + ratio, length // 2, endpoint=False) * _SPATIAL_SCALE


def temporal_grid(latent_frames: int, origin: float) -> np.ndarray:
    """RoPE time of every latent frame: origin + running float64 sum of 5/3·(1,4,4,4,4)[j mod 5], float64 [T]."""
    spans = np.array([_FRAME_RESCALE * _FRAMES_PER_LATENT[j % 5] for j in range(latent_frames)], dtype=np.float64)
    # np.cumsum on a 1-D array accumulates sequentially (left to right), matching the oracle's running sum.
    offsets = np.concatenate([np.zeros(1), np.cumsum(spans[:-1])])
    return origin + offsets


@dataclass(frozen=True, eq=False)
class PackedLayout:
    """Row layout of one request's packed sequence (CPU tensors; move what the model needs to its device)."""

    text_rows: int  # L
    audio_rows: int  # 2A
    video_grid: tuple[int, int, int]  # (T, Hl/2, Wl/2), raster order of the video rows
    token_tags: torch.Tensor  # long [S]: 0 video, 1 text, 2 audio
    position_ids: torch.Tensor  # float64 [S, 3]: (t, h, w)
    video_indices: torch.Tensor  # long [Nv_rows] = arange(L+2A, S)
    audio_indices: torch.Tensor  # long [2A] = arange(L, L+2A)
    text_indices: torch.Tensor  # long [L] = arange(L)
    condition_rows: int = 0  # C: fl2va keyframe rows between text and audio (video_indices lists them first)

    @property
    def video_rows(self) -> int:
        t, h, w = self.video_grid
        return t * h * w

    @property
    def sequence_length(self) -> int:
        return self.text_rows + self.condition_rows + self.audio_rows + self.video_rows

    def to(self, device: torch.device | str) -> "PackedLayout":
        """The same layout with its tensors on `device` (positions stay float64; the DiT casts them to fp32)."""
        return dataclasses.replace(
            self,
            token_tags=self.token_tags.to(device),
            position_ids=self.position_ids.to(device),
            video_indices=self.video_indices.to(device),
            audio_indices=self.audio_indices.to(device),
            text_indices=self.text_indices.to(device),
        )

    @property
    def prefix_segments(self) -> tuple[int, int]:
        """(L, 2A): the non-video segments in row order, as VSA tiles them (keyframe rows, fl2va's, are not tiled:
        the native release renders dense)."""
        if self.condition_rows:
            raise ValueError("VSA: a layout with keyframe rows has no VSA plan (the native release renders dense)")
        return (self.text_rows, self.audio_rows)


def last_anchor_time(latent_frames: int, origin: float) -> float:
    """RoPE time of a keyframe anchored at the last latent frame: origin + the frames' span summed by numpy's pairwise
    `sum` (the released model's order; the running sum of `temporal_grid` differs in the last ulp from 16 frames on)
    minus one 5/3 step."""
    spans = np.array([_FRAME_RESCALE * _FRAMES_PER_LATENT[j % 5] for j in range(latent_frames)], dtype=np.float64)
    return float(origin) + float(spans.sum()) - _FRAME_RESCALE


def build_packed_layout(text_rows: int, geometry: RequestGeometry, *, text_tags: list[int] | None = None,
                        keyframe_anchors: tuple[str, ...] = ()) -> PackedLayout:
    """Tags, float64 positions and index tensors of `[text L | keyframes C | audio 2A | video]` for a prompt of L
    tokens (§4.2; C = 0 for t2va). `text_tags` overrides the text rows' tags (an fl2va vision block is tagged video);
    each keyframe anchor ("first" / "last") adds one latent frame of rows at that end's RoPE time."""
    if isinstance(text_rows, bool) or not isinstance(text_rows, int) or text_rows < 1:
        raise ValueError(f"text_rows: expected a positive integer token count L, got {text_rows!r}")
    if text_tags is not None and len(text_tags) != text_rows:
        raise ValueError(f"text_tags: expected {text_rows} tags, got {len(text_tags)}")
    length = text_rows
    a = geometry.audio_latents
    t, hp, wp = geometry.patch_grid
    cond = len(keyframe_anchors) * hp * wp
    audio_start = length + cond
    video_start = audio_start + AUDIO_CHANNELS * a
    seq = video_start + t * hp * wp

    h_grid = spatial_grid(geometry.latent_height, geometry.latent_height, geometry.latent_width)  # [Hl/2]
    w_grid = spatial_grid(geometry.latent_width, geometry.latent_height, geometry.latent_width)  # [Wl/2]

    positions = np.zeros((seq, 3), dtype=np.float64)
    positions[:length, 0] = np.arange(length, dtype=np.float64)
    for index, anchor in enumerate(keyframe_anchors):
        if anchor not in ("first", "last"):
            raise ValueError(f"keyframe anchor: expected 'first' or 'last', got {anchor!r}")
        frame = positions[length + index * hp * wp: length + (index + 1) * hp * wp].reshape(hp, wp, 3)
        frame[..., 0] = float(length) if anchor == "first" else last_anchor_time(t, float(length))
        frame[..., 1] = h_grid[:, None]
        frame[..., 2] = w_grid[None, :]
    audio_time = float(length) + np.arange(a, dtype=np.float64)
    positions[audio_start:video_start, 0] = np.tile(audio_time, AUDIO_CHANNELS)
    positions[audio_start : audio_start + a, 2] = w_grid[0]
    positions[audio_start + a : video_start, 2] = w_grid[-1]
    video = positions[video_start:].reshape(t, hp, wp, 3)  # view: raster f → y → x
    video[..., 0] = temporal_grid(t, float(length))[:, None, None]
    video[..., 1] = h_grid[None, :, None]
    video[..., 2] = w_grid[None, None, :]

    tags = torch.full((seq,), VIDEO_TAG, dtype=torch.long)
    tags[:length] = TEXT_TAG if text_tags is None else torch.tensor(text_tags, dtype=torch.long)
    tags[audio_start:video_start] = AUDIO_TAG
    return PackedLayout(
        text_rows=length,
        audio_rows=AUDIO_CHANNELS * a,
        video_grid=(t, hp, wp),
        token_tags=tags,
        position_ids=torch.from_numpy(positions),
        video_indices=torch.cat([torch.arange(length, audio_start), torch.arange(video_start, seq)]),
        audio_indices=torch.arange(audio_start, video_start),
        text_indices=torch.arange(length),
        condition_rows=cond,
    )


def build_reference_layout(text_tags: list[int], geometry: RequestGeometry,
                           reference_sizes: tuple[tuple[int, int], ...]) -> PackedLayout:
    """ref2va's `[text L | reference blocks | audio 2A | video]`: one block per reference image of its own latent
    size (Hl_i, Wl_i) on its own spatial grid, at RoPE time L + i (an image takes one integer rotary slot); the
    generated audio and video start their clocks at L + n for n references. `text_tags` tags the L text rows (vision
    blocks as video)."""
    length = len(text_tags)
    if length < 1:
        raise ValueError("text_tags: expected at least one text row")
    a = geometry.audio_latents
    t, hp, wp = geometry.patch_grid
    blocks = [(lh // 2, lw // 2) for lh, lw in reference_sizes]
    cond = sum(h * w for h, w in blocks)
    audio_start = length + cond
    video_start = audio_start + AUDIO_CHANNELS * a
    seq = video_start + t * hp * wp
    positions = np.zeros((seq, 3), dtype=np.float64)
    positions[:length, 0] = np.arange(length, dtype=np.float64)
    cursor, clock = length, float(length)
    for (lh, lw), (h, w) in zip(reference_sizes, blocks):
        frame = positions[cursor: cursor + h * w].reshape(h, w, 3)
        frame[..., 0] = clock
        frame[..., 1] = spatial_grid(lh, lh, lw)[:, None]
        frame[..., 2] = spatial_grid(lw, lh, lw)[None, :]
        cursor += h * w
        clock += 1.0
    h_grid = spatial_grid(geometry.latent_height, geometry.latent_height, geometry.latent_width)  # [Hl/2]
    w_grid = spatial_grid(geometry.latent_width, geometry.latent_height, geometry.latent_width)  # [Wl/2]
    positions[audio_start:video_start, 0] = np.tile(clock + np.arange(a, dtype=np.float64), AUDIO_CHANNELS)
    positions[audio_start : audio_start + a, 2] = w_grid[0]
    positions[audio_start + a : video_start, 2] = w_grid[-1]
    video = positions[video_start:].reshape(t, hp, wp, 3)  # view: raster f → y → x
    video[..., 0] = temporal_grid(t, clock)[:, None, None]
    video[..., 1] = h_grid[None, :, None]
    video[..., 2] = w_grid[None, None, :]
    tags = torch.full((seq,), VIDEO_TAG, dtype=torch.long)
    tags[:length] = torch.tensor(text_tags, dtype=torch.long)
    tags[audio_start:video_start] = AUDIO_TAG
    return PackedLayout(
        text_rows=length,
        audio_rows=AUDIO_CHANNELS * a,
        video_grid=(t, hp, wp),
        token_tags=tags,
        position_ids=torch.from_numpy(positions),
        video_indices=torch.cat([torch.arange(length, audio_start), torch.arange(video_start, seq)]),
        audio_indices=torch.arange(audio_start, video_start),
        text_indices=torch.arange(length),
        condition_rows=cond,
    )


def row_timesteps(t_video: float, t_audio: float, layout: PackedLayout,
                  condition_time: float = 0.999) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct clean times and each row's index into them: (timestep fp32 [M], timestep_indices long [S]).

    Text and video rows carry `t_video`, audio rows `t_audio`; `torch.unique(sorted, return_inverse)` reduces them.
    For V2 `t_video < t_audio` at every step, so timestep = [t_v, t_a] and indices are 0 (text, video), 1 (audio).
    """
    device = layout.audio_indices.device  # built where the layout lives (see PackedLayout.to)
    rows = torch.full((layout.sequence_length,), float(t_video), dtype=torch.float32, device=device)
    if layout.condition_rows:  # fl2va keyframe anchors stay at their noise-augmentation time (or later)
        rows[layout.video_indices[:layout.condition_rows]] = max(float(t_video), condition_time)
    rows[layout.audio_indices] = float(t_audio)
    timestep, timestep_indices = torch.unique(rows, sorted=True, return_inverse=True)
    return timestep, timestep_indices


def adaln_row_indices(timestep_indices: torch.Tensor, token_tags: torch.Tensor) -> torch.Tensor:
    """AdaLN table row of every packed row, c = 3·timestep_index + tag (§4.3 step 6.1); long [S]."""
    return 3 * timestep_indices + token_tags
