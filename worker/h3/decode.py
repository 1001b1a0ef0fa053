"""Denoised latents -> uint8 RGB frames and a stereo waveform with the diffusers MiniMax-H3 VAEs (spec §11.1, §11.2).

The VAEs themselves are reused unchanged (``AutoencoderKLMiniMaxH3``, ``AutoencoderKLMiniMaxH3Audio``, spatial tiling
left at its on-by-default release setting). What is written here is the post-processing that diffusers keeps in its
modular ``decoders.py`` blocks (which need a whole ``ModularPipeline`` state to run): per-channel latent
denormalization, ImageNet pixel de-normalization, clamping, uint8 rounding, and the stereo-rows unpacking.

Two video paths compute the same blended-tile frames:

* ``decode_video(vae, latents)`` with ``tile_batch=None`` calls ``vae.decode``: diffusers runs the ViT decoder once
  per 256-px tile of each temporal chunk (28 tiles x 6 chunks = 168 calls at 1344x768, 4.4 s).
* ``iter_video_frames`` (and ``decode_video(..., tile_batch=k)``) re-traces diffusers' temporal chunking and tile
  layout (its own ``_split_tiles``/``_stitch_tiles``/``_blend``) but stacks the equal-sized tiles into one batch, up
  to ``tile_batch`` tiles per decoder call (0: all tiles of one temporal chunk), and yields each chunk's finished
  frames as soon as its cross-fade with the previous chunk is done, so the MP4 encode can start on it.

``prepare_video_decoder`` makes the serving copy: the encoder dropped, decoder weights cast to fp16 (the modules
diffusers pins stay fp32), optionally each ViT block ``torch.compile``d. Under the fp16 autocast that the
fp32-weight decode already uses, fp16 weights change only where fp32 weights were read directly (none of the
matmuls), so the frames match the fp32-weight decode closely (tests/worker/h3/decode/test_decode_batched.py; measured at
real size in docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUDIO_CHANNELS = 2  # stereo; the mono audio VAE takes the two channels as a batch of 2


def _latent_stats(config, name: str, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = config.latents_mean, config.latents_std
    if mean is None or std is None or len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"{name} config must hold {channels} latents_mean and latents_std values, got "
            f"{None if mean is None else len(mean)} and {None if std is None else len(std)}"
        )
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)


def _check_video_latents(vae, latents: torch.Tensor) -> None:
    channels = vae.config.latent_channels
    if latents.ndim != 5 or latents.shape[0] != 1 or latents.shape[1] != channels:
        raise ValueError(f"video latents must be [1, {channels}, T, Hl, Wl], got {list(latents.shape)}")
    num_latent_frames = latents.shape[2]
    if num_latent_frames < 7 or (num_latent_frames - 2) % 5 != 0:
        raise ValueError(f"video latent frames must be 5n+2 with n >= 1 (7, 12, ..., 32, ...), got {num_latent_frames}")


def _precision(device: torch.device, cuda_autocast_dtype: torch.dtype | None):
    if device.type == "cuda" and cuda_autocast_dtype is not None:
        return torch.autocast("cuda", dtype=cuda_autocast_dtype)
    return contextlib.nullcontext()


def _denormalize(vae, latents: torch.Tensor) -> torch.Tensor:
    mean, std = _latent_stats(vae.config, "video VAE", vae.config.latent_channels)
    device = latents.device
    return latents.float() * std.to(device).view(1, -1, 1, 1, 1) + mean.to(device).view(1, -1, 1, 1, 1)


def _to_frames(video: torch.Tensor) -> torch.Tensor:
    """ImageNet-normalized ``[1, 3, n, H, W]`` -> uint8 ``[n, H, W, 3]`` on the same device."""
    pixel_mean = torch.tensor(IMAGENET_MEAN, device=video.device).view(1, 3, 1, 1, 1)
    pixel_std = torch.tensor(IMAGENET_STD, device=video.device).view(1, 3, 1, 1, 1)
    pixels = (video.float() * pixel_std + pixel_mean).clamp(0.0, 1.0)
    frames = torch.round(pixels * 255.0).to(torch.uint8)  # [1, 3, n, H, W]
    return frames[0].permute(1, 2, 3, 0).contiguous()


def prepare_video_decoder(vae, dtype: torch.dtype | None = torch.float16, *, compile_blocks: bool = False,
                          compile_mode: str | None = None, copy_module: bool = False):
    """The serving form of a loaded ``AutoencoderKLMiniMaxH3``: encoder and ``quant_conv`` dropped (decode never
    runs them), parameters cast to ``dtype`` except in the modules diffusers pins to fp32 (as
    ``vae_checkpoint_convert.load_video_vae(dtype=...)`` would load them), and with ``compile_blocks`` each ViT block
    wrapped by ``torch.compile`` (one compiled graph serves all 36 blocks: same code, same shapes).
    ``copy_module`` works on a deep copy (for benchmarks that keep the original); otherwise in place."""
    if copy_module:
        original, encoder, quant_conv = vae, vae.encoder, vae.quant_conv
        original.encoder = original.quant_conv = None  # not worth copying
        try:
            vae = copy.deepcopy(original)
        finally:
            original.encoder, original.quant_conv = encoder, quant_conv
    vae.encoder = None
    vae.quant_conv = None
    if dtype is not None:
        keep_fp32 = tuple(getattr(vae, "_keep_in_fp32_modules", None) or ())
        with torch.no_grad():
            for name, parameter in vae.named_parameters():
                if parameter.is_floating_point() and not any(part in keep_fp32 for part in name.split(".")):
                    parameter.data = parameter.data.to(dtype)
    if compile_blocks:
        for block in vae.decoder.transformer_blocks:
            block.compile(mode=compile_mode, dynamic=False)
    return vae


def iter_video_frames(
    vae,
    latents: torch.Tensor,
    *,
    tile_batch: int = 0,
    cuda_autocast_dtype: torch.dtype | None = torch.float16,
    group=None,
) -> Iterator[torch.Tensor]:
    """Decode ``[1, 24, T, Hl, Wl]`` normalized latents chunk by chunk: yields uint8 frames ``[n_i, H, W, 3]`` on the
    latents' device, in order, ``17n+5`` frames in all, equal to ``vae.decode``'s (up to the batch-size dependence of
    the matmul kernels). ``tile_batch`` caps the tiles per decoder call (0: all tiles of a chunk; larger values
    batch several chunks' tiles into one call).

    With a ``torch.distributed`` process ``group`` of more than one rank, every rank of the group must call this
    with the same latents: rank r decodes tiles r, r + W, ... of each chunk (``tile_batch`` then caps its own calls)
    and the tiles are gathered on the group's rank 0, which alone yields frames; the other ranks yield nothing."""
    _check_video_latents(vae, latents)
    if tile_batch < 0:
        raise ValueError(f"tile_batch must be >= 0 (0 = one temporal chunk per call), got {tile_batch}")
    with torch.inference_mode():
        z = _denormalize(vae, latents).to(next(vae.post_quant_conv.parameters()).dtype)
        plan = _ChunkPlan(vae, z)
        precision = _precision(z.device, cuda_autocast_dtype)
        if group is not None and torch.distributed.get_world_size(group) > 1:
            clips = _split_clips(vae, plan, tile_batch, precision, group)
            if torch.distributed.get_rank(group) != 0:
                for _ in clips:
                    pass
                return
        else:
            clips = _local_clips(vae, plan, tile_batch, precision)
        yield from _frames_from_clips(vae, plan, clips)


def _tile_layout(vae, latent_height: int, latent_width: int):
    """Latent-space (y, x) tile slices and the pixel overlaps, exactly as ``vae._decode_clip`` lays them out."""
    ratio = vae.spatial_compression_ratio
    y_indices, y_lengths, y_overlaps = vae._split_tiles(
        latent_height * ratio, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
    x_indices, x_lengths, x_overlaps = vae._split_tiles(
        latent_width * ratio, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)
    if not vae.use_tiling:
        y_indices, y_lengths, y_overlaps = [0], [latent_height * ratio], []
        x_indices, x_lengths, x_overlaps = [0], [latent_width * ratio], []
    xs = [slice(x // ratio, (x + w) // ratio) for x, w in zip(x_indices, x_lengths)]
    rows = [[(slice(y // ratio, (y + h) // ratio), x) for x in xs] for y, h in zip(y_indices, y_lengths)]
    return rows, y_overlaps, x_overlaps


class _ChunkPlan:
    """``vae._decode``'s temporal chunking (latent windows of 5 + 2 frames every 5) and ``_decode_clip``'s tiles."""

    def __init__(self, vae, z: torch.Tensor):
        chunk_tokens, token_drop = vae.tokens_chunk_size, vae.config.token_drop
        num_tokens = z.shape[2] + token_drop
        pad_tokens = (-num_tokens) % chunk_tokens
        if pad_tokens > 0:  # diffusers repeats the last latent frame and trims frames afterwards; 5n+2 never needs it
            raise ValueError(f"{z.shape[2]} latent frames need {pad_tokens} padding tokens with this VAE's chunking")
        num_chunks = num_tokens // chunk_tokens - int(token_drop > 0)
        span = chunk_tokens + vae.token_overlap  # latent frames per chunk window (7 at 5 + 2)
        self.windows = [z[:, :, i * chunk_tokens: i * chunk_tokens + span] for i in range(num_chunks)]
        self.rows, self.y_overlaps, self.x_overlaps = _tile_layout(vae, z.shape[-2], z.shape[-1])
        self.tiles = [tile for row in self.rows for tile in row]  # row-major
        self.chunk_frames = chunk_tokens * vae.temporal_compression_ratio
        self.token_drop = token_drop

    def stitch(self, vae, flat: list[torch.Tensor]) -> torch.Tensor:
        """Row-major decoded tiles ``[1, 3, F, h, w]`` of one chunk -> the blended clip ``[1, 3, F, H, W]``."""
        grid, k = [], 0
        for row in self.rows:
            grid.append(flat[k: k + len(row)])
            k += len(row)
        return vae._stitch_tiles(grid, self.y_overlaps, self.x_overlaps)


def _decode_tiles(vae, plan: _ChunkPlan, items, precision) -> torch.Tensor:
    """One decoder call on the stacked (chunk, tile index) items: ``[b, 3, F, 16h, 16w]``."""
    stack = torch.cat([plan.windows[i][..., plan.tiles[k][0], plan.tiles[k][1]] for i, k in items], dim=0)
    with precision:
        return vae.decoder(vae.post_quant_conv(stack))


def _local_clips(vae, plan: _ChunkPlan, tile_batch: int, precision) -> Iterator[torch.Tensor]:
    """Stitched clips in chunk order, decoding ``tile_batch`` tiles per call across chunk boundaries."""
    per_chunk = len(plan.tiles)
    work = [(i, k) for i in range(len(plan.windows)) for k in range(per_chunk)]
    batch = tile_batch or per_chunk
    decoded: dict[int, list[torch.Tensor]] = {}
    next_chunk = 0
    for start in range(0, len(work), batch):
        items = work[start: start + batch]
        for (i, _), tile in zip(items, _decode_tiles(vae, plan, items, precision).split(1)):
            decoded.setdefault(i, []).append(tile)
        while len(decoded.get(next_chunk, ())) == per_chunk:
            yield plan.stitch(vae, decoded.pop(next_chunk))
            next_chunk += 1


def _split_clips(vae, plan: _ChunkPlan, tile_batch: int, precision, group) -> Iterator[torch.Tensor | None]:
    """Per chunk: this rank's tiles (k = rank mod W), gathered on group rank 0, which yields the stitched clip;
    the other ranks yield None. Shorter tile lists are padded so every rank sends the same shape."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    per_chunk = len(plan.tiles)
    mine = list(range(rank, per_chunk, world))
    share = -(-per_chunk // world)
    for i in range(len(plan.windows)):
        items = [(i, k) for k in mine]
        batch = tile_batch or max(1, len(items))
        outs = [_decode_tiles(vae, plan, items[s: s + batch], precision) for s in range(0, len(items), batch)]
        local = torch.cat(outs) if outs else None
        if local is None or local.shape[0] < share:  # pad (a rank with no tile sends zeros of a tile's shape)
            template = local if local is not None else _decode_tiles(vae, plan, [(i, 0)], precision)
            pad = template.new_zeros((share - (0 if local is None else local.shape[0]), *template.shape[1:]))
            local = pad if local is None else torch.cat([local, pad])
        local = local.contiguous()
        if rank == 0:
            gathered = [torch.empty_like(local) for _ in range(world)]
            dist.gather(local, gathered, group=group, group_dst=0)
            yield plan.stitch(vae, [gathered[k % world][k // world: k // world + 1] for k in range(per_chunk)])
        else:
            dist.gather(local, None, group=group, group_dst=0)
            yield None


def _frames_from_clips(vae, plan: _ChunkPlan, clips: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Cut each stitched clip to its own frames and cross-fade it with the previous clip's overlap, as
    ``vae._decode`` does; yields uint8 frames per chunk, then the last overlap."""
    overlap = None
    for clip in clips:
        first = clip[:, :, vae.frame_pre_padding: plan.chunk_frames]
        if overlap is not None:
            first = vae._blend(overlap, first, vae.frame_overlap, dim=-3)
        if plan.token_drop > 0:
            overlap = clip[:, :, plan.chunk_frames: 2 * plan.chunk_frames][:, :, vae.frame_pre_padding:]
        yield _to_frames(first)
    if overlap is not None:
        yield _to_frames(overlap)


@torch.inference_mode()
def decode_video(
    vae,
    latents: torch.Tensor,
    cuda_autocast_dtype: torch.dtype | None = torch.float16,
    *,
    tile_batch: int | None = None,
) -> torch.Tensor:
    """Decode ``[1, 24, T, Hl, Wl]`` normalized latents (T = 5n+2, n >= 1) to uint8 frames ``[17n+5, 16Hl, 16Wl, 3]``.

    Steps: ``z = latents·std + mean`` (per channel, from ``vae.config``); ``vae.decode(z)`` -> ``[1, 3, N, H, W]`` in
    ImageNet-normalized space; ``x·imagenet_std + imagenet_mean``; clamp to [0, 1]; ``round(255·x)``. On CUDA the
    decode runs under autocast in ``cuda_autocast_dtype`` (fp16, as the references do; None for full fp32). The
    returned frames are on the CPU. ``tile_batch=None`` is diffusers' per-tile ``vae.decode``; an int decodes
    through ``iter_video_frames`` with that many tiles per call (0: a whole chunk's tiles).
    """
    _check_video_latents(vae, latents)
    if tile_batch is not None:
        chunks = list(iter_video_frames(vae, latents, tile_batch=tile_batch, cuda_autocast_dtype=cuda_autocast_dtype))
        return torch.cat(chunks).cpu()
    z = _denormalize(vae, latents)
    with _precision(z.device, cuda_autocast_dtype):
        video = vae.decode(z, return_dict=False)[0]  # [1, 3, N, H, W], ImageNet-normalized
    return _to_frames(video).cpu()  # [N, H, W, 3]


@torch.inference_mode()
def decode_audio(audio_vae, audio_rows: torch.Tensor) -> torch.Tensor:
    """Decode the ``[2A, 32]`` channel-major audio rows to a float32 stereo waveform ``[2, 800A]`` in [-1, 1].

    Rows ``0..A-1`` are the left channel's latents, ``A..2A-1`` the right's; they are unpacked to ``[2, 32, A]``,
    denormalized per channel with ``audio_vae.config`` statistics, and decoded with the stereo channels as the batch.
    The VAE runs in its own dtype (fp32 in the release; bf16 decodes come out ~20 dB quieter). Returned on the CPU.
    """
    channels = audio_vae.config.latent_channels
    if audio_rows.ndim != 2 or audio_rows.shape[1] != channels or audio_rows.shape[0] % AUDIO_CHANNELS != 0:
        raise ValueError(f"audio rows must be [2A, {channels}] with A >= 1, got {list(audio_rows.shape)}")
    num_latents = audio_rows.shape[0] // AUDIO_CHANNELS
    if num_latents < 1:
        raise ValueError(f"audio rows must be [2A, {channels}] with A >= 1, got {list(audio_rows.shape)}")

    device = audio_rows.device
    latents = audio_rows.float().reshape(AUDIO_CHANNELS, num_latents, channels).permute(0, 2, 1)  # [2, 32, A]
    mean, std = _latent_stats(audio_vae.config, "audio VAE", channels)
    z = latents * std.to(device).view(1, -1, 1) + mean.to(device).view(1, -1, 1)

    waveform = audio_vae.decode(z, return_dict=False)[0]  # [2, 1, 800A]
    return waveform.float().clamp(-1.0, 1.0)[:, 0, :].contiguous().cpu()  # [2, 800A]
