"""h3batch.worker.h3.packing: §4.2 layout and positions, latent ⇄ row packing, row timesteps, against the diffusers oracle."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers.modular_pipelines.minimax_h3.before_denoise import (
    MiniMaxH3PrepareLayoutStep,
    MiniMaxH3SetTimestepsStep,
    patchify_video_latents,
)

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3.packing import (
    AUDIO_TAG,
    TEXT_TAG,
    VIDEO_TAG,
    adaln_row_indices,
    build_packed_layout,
    pack_audio,
    patchify_video,
    row_timesteps,
    spatial_grid,
    temporal_grid,
    unpack_audio,
    unpatchify_video,
)
from h3batch.worker.h3.sampler import SigmaLadder


def tiny_geometry() -> RequestGeometry:
    return RequestGeometry.from_frames(256, 128, 22, check_duration_window=False)  # T 7, Hl×Wl 8×16, A 37


def oracle_layout(text_rows: int, geometry: RequestGeometry):
    """diffusers' T2VA layout: (position_ids, token_tags, video_indices, audio_indices, text_indices, ...)."""
    return MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.full((text_rows,), TEXT_TAG, dtype=torch.long),
        geometry.latent_frames,
        geometry.latent_height,
        geometry.latent_width,
        geometry.audio_latents,
        (1, 2, 2),
        2,
        AUDIO_TAG,
        VIDEO_TAG,
    )


def test_spatial_grids_48x84_match_spec():
    """The 48×84 h and w RoPE grids start and end at the §4.2 values and are float64."""
    h_grid, w_grid = spatial_grid(48, 48, 84), spatial_grid(84, 48, 84)
    assert h_grid.dtype == np.float64 and (h_grid.size, w_grid.size) == (24, 42)
    np.testing.assert_allclose(h_grid[:2], [3.905137, 4.913042], atol=1e-6)
    np.testing.assert_allclose(h_grid[-1], 27.086958, atol=1e-6)
    np.testing.assert_allclose(w_grid[:2], [-5.166010, -4.158105], atol=1e-6)
    np.testing.assert_allclose(w_grid[-1], 36.158105, atol=1e-6)


def test_square_grid_spans_zero_to_32():
    """On a square latent the spatial grid is 32·k/(D/2) for k = 0…D/2−1 (exact endpoint excluded)."""
    np.testing.assert_array_equal(spatial_grid(48, 48, 48), np.arange(24) * (32 / 24))


def test_temporal_offsets_match_spec():
    """Latent-frame times are L + 0, 5/3, 25/3, 15, 65/3, 85/3, 30, 110/3 (5/3·(1,4,4,4,4) running sum)."""
    offsets = temporal_grid(8, 30.0) - 30.0
    np.testing.assert_allclose(
        offsets, [0, 5 / 3, 25 / 3, 15, 65 / 3, 85 / 3, 30, 110 / 3], atol=1e-12
    )
    np.testing.assert_allclose(np.round(offsets, 4), [0, 1.6667, 8.3333, 15, 21.6667, 28.3333, 30, 36.6667])


@pytest.mark.parametrize(
    "geometry, text_rows",
    [
        (RequestGeometry.from_frames(256, 128, 22, check_duration_window=False), 12),
        # T = 12, L = 30: where the running-sum order shows in the last bit
        (RequestGeometry.from_frames(64, 96, 39, check_duration_window=False), 30),
        (RequestGeometry.from_frames(96, 32, 5, check_duration_window=False), 1),  # T = 2, aspect 3
        (RequestGeometry(1344, 768, 4.4), 30),  # the full 4.4 s request, S = 32,642
        (RequestGeometry(768, 1344, 15), 517),
    ],
)
def test_layout_bit_equal_to_diffusers(geometry, text_rows):
    """Positions (float64), tags and index tensors equal diffusers' build_packed_sequence bit for bit."""
    layout = build_packed_layout(text_rows, geometry)
    positions, tags, video_idx, audio_idx, text_idx, _, _ = oracle_layout(text_rows, geometry)
    assert layout.position_ids.dtype == torch.float64
    assert torch.equal(layout.position_ids, positions)
    assert torch.equal(layout.token_tags, tags)
    assert torch.equal(layout.video_indices, video_idx)
    assert torch.equal(layout.audio_indices, audio_idx)
    assert torch.equal(layout.text_indices, text_idx)
    assert layout.sequence_length == geometry.sequence_rows(text_rows) == positions.shape[0]


def test_layout_segments_and_positions_follow_table():
    """Text rows sit at (k,0,0), audio left/right at (L+j, 0, w_grid[0] / w_grid[-1]), video raster f → y → x."""
    geometry, length = tiny_geometry(), 12
    layout = build_packed_layout(length, geometry)
    a = geometry.audio_latents
    pos = layout.position_ids.numpy()
    w_grid = spatial_grid(16, 8, 16)
    h_grid = spatial_grid(8, 8, 16)
    np.testing.assert_array_equal(pos[:length], np.stack([np.arange(length), np.zeros(length), np.zeros(length)], 1))
    np.testing.assert_array_equal(pos[length : length + a, 0], length + np.arange(a))
    np.testing.assert_array_equal(pos[length + a : length + 2 * a, 0], length + np.arange(a))
    assert set(pos[length : length + a, 2]) == {w_grid[0]} and set(pos[length + a : length + 2 * a, 2]) == {w_grid[-1]}
    assert not pos[length : length + 2 * a, 1].any()
    # video row (f=1, y=2, x=3) of the (7, 4, 8) grid
    row = length + 2 * a + (1 * 4 + 2) * 8 + 3
    np.testing.assert_array_equal(pos[row], [length + 5 / 3, h_grid[2], w_grid[3]])
    assert layout.prefix_segments == (length, 2 * a) and layout.video_grid == (7, 4, 8)
    assert (layout.token_tags[:length] == TEXT_TAG).all()
    assert (layout.token_tags[layout.audio_indices] == AUDIO_TAG).all()
    assert (layout.token_tags[layout.video_indices] == VIDEO_TAG).all()


def test_layout_rejects_empty_prompt():
    """A layout needs at least one text row."""
    with pytest.raises(ValueError, match="text_rows"):
        build_packed_layout(0, tiny_geometry())


def test_patchify_bit_equal_to_diffusers_and_channel_major():
    """Video rows equal diffusers' patchify (B=2) and feature c·4 + dy·2 + dx holds latent (c, f, 2y+dy, 2x+dx)."""
    latents = torch.randn(2, 24, 3, 6, 10)
    rows = patchify_video(latents)
    assert rows.shape == (2, 3 * 3 * 5, 96)
    assert torch.equal(rows.reshape(-1, 96), patchify_video_latents(latents, (1, 2, 2)))
    f, y, x, c, dy, dx = 2, 1, 4, 17, 1, 0
    assert rows[1, (f * 3 + y) * 5 + x, c * 4 + dy * 2 + dx] == latents[1, c, f, 2 * y + dy, 2 * x + dx]


def test_unpatchify_inverts_patchify():
    """unpatchify ∘ patchify is the identity on latents, and patchify ∘ unpatchify on rows."""
    latents = torch.randn(1, 24, 7, 8, 16)
    assert torch.equal(unpatchify_video(patchify_video(latents), 7, 8, 16), latents)
    rows = torch.randn(1, 7 * 4 * 8, 96)
    assert torch.equal(patchify_video(unpatchify_video(rows, 7, 8, 16)), rows)


def test_patchify_shape_errors():
    """Odd latent sides and row counts that do not match the grid raise ValueError quoting the shape."""
    with pytest.raises(ValueError, match="even Hl and Wl"):
        patchify_video(torch.zeros(1, 24, 2, 5, 4))
    with pytest.raises(ValueError, match=r"\[B, 24, T, Hl, Wl\]"):
        patchify_video(torch.zeros(1, 16, 2, 4, 4))
    with pytest.raises(ValueError, match=r"expected \[B, 56, 96\]"):
        unpatchify_video(torch.zeros(1, 55, 96), 7, 4, 8)


def test_audio_pack_is_channel_major_and_invertible():
    """Rows 0…A−1 are the left channel, A…2A−1 the right; unpack ∘ pack and pack ∘ unpack are identities."""
    latents = torch.randn(2, 32, 37)
    rows = pack_audio(latents)
    assert rows.shape == (74, 32)
    assert torch.equal(rows[5], latents[0, :, 5]) and torch.equal(rows[37 + 5], latents[1, :, 5])
    assert torch.equal(unpack_audio(rows), latents)
    assert torch.equal(pack_audio(unpack_audio(rows)), rows)
    with pytest.raises(ValueError, match=r"\[2A, 32\]"):
        unpack_audio(torch.zeros(75, 32))


def test_row_timesteps_bit_equal_to_diffusers_for_every_step():
    """For each of the 8 V2 steps, (timestep, timestep_indices) equal diffusers' build_row_timesteps."""
    geometry, length = tiny_geometry(), 12
    layout = build_packed_layout(length, geometry)
    ladder = SigmaLadder.v2()
    for k in range(ladder.num_steps):
        t_v, t_a = ladder.timesteps(k)
        timestep, indices = row_timesteps(t_v, t_a, layout)
        want_t, want_i = MiniMaxH3SetTimestepsStep.build_row_timesteps(
            layout.video_indices, layout.audio_indices, 0, 0, length, t_v, t_a, 0.999, 1.0
        )
        assert timestep.dtype == torch.float32 and indices.dtype == torch.long
        assert torch.equal(timestep, want_t) and torch.equal(indices, want_i)


def test_v2_step_plan_indices():
    """Every V2 step has timestep = [t_v, t_a]; AdaLN index c is 1 text, 0 video, 5 audio; final index 0/0/1."""
    layout = build_packed_layout(12, tiny_geometry())
    ladder = SigmaLadder.v2()
    for k in range(ladder.num_steps):
        t_v, t_a = ladder.timesteps(k)
        timestep, indices = row_timesteps(t_v, t_a, layout)
        assert timestep.tolist() == [t_v, t_a]
        c = adaln_row_indices(indices, layout.token_tags)
        assert set(c[layout.text_indices].tolist()) == {1}
        assert set(c[layout.video_indices].tolist()) == {0}
        assert set(c[layout.audio_indices].tolist()) == {5}
        assert set(indices[layout.text_indices].tolist()) == {0} == set(indices[layout.video_indices].tolist())
        assert set(indices[layout.audio_indices].tolist()) == {1}


def test_equal_times_collapse_to_one_timestep():
    """When t_v equals t_a the rows reduce to a single timestep (M = 1) and every index is 0."""
    layout = build_packed_layout(3, tiny_geometry())
    timestep, indices = row_timesteps(0.25, 0.25, layout)
    assert timestep.tolist() == [0.25] and not indices.any()


def test_temporal_grid_is_a_running_sum_not_an_exact_sum():
    """At T = 12, L = 30 the running float64 sum differs in the last bit from exact (fsum) summation, by design."""
    import math

    spans = [5 / 3 * (1, 4, 4, 4, 4)[j % 5] for j in range(12)]
    running, total = [], 0.0
    for span in [0.0] + spans[:-1]:
        total += span
        running.append(30.0 + total)
    got = temporal_grid(12, 30.0)
    assert got.tolist() == running
    assert got[10] != 30.0 + math.fsum(spans[:10])


def test_layout_to_device_keeps_values():
    """PackedLayout.to returns a layout with equal tensors (float64 positions kept) on the target device."""
    layout = build_packed_layout(12, tiny_geometry())
    moved = layout.to("cpu")
    assert moved is not layout and moved.video_grid == layout.video_grid
    assert moved.position_ids.dtype == torch.float64 and torch.equal(moved.position_ids, layout.position_ids)
    assert torch.equal(moved.token_tags, layout.token_tags)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_row_timesteps_on_cuda_layout():
    """With the layout on CUDA, row_timesteps builds its tensors there and equals the CPU result."""
    layout = build_packed_layout(12, tiny_geometry())
    t_v, t_a = SigmaLadder.v2().timesteps(2)
    cpu_t, cpu_i = row_timesteps(t_v, t_a, layout)
    gpu_t, gpu_i = row_timesteps(t_v, t_a, layout.to("cuda"))
    assert gpu_t.device.type == gpu_i.device.type == "cuda"
    assert torch.equal(gpu_t.cpu(), cpu_t) and torch.equal(gpu_i.cpu(), cpu_i)
