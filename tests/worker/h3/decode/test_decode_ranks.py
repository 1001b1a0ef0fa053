"""Tile split of the video decode across ranks (worker/h3/decode.py, `group=`), two gloo ranks on the CPU."""
from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from h3batch.worker.h3.decode import decode_video, iter_video_frames

WORLD = 2


def tiny_vae():
    from diffusers import AutoencoderKLMiniMaxH3

    from h3batch.worker.h3.tiny_configs import TINY_VIDEO_VAE
    from tests.worker.h3.decode.conftest import randomize_

    return randomize_(AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE), seed=1).eval()


def latents() -> torch.Tensor:
    return torch.randn(1, 24, 12, 24, 40, generator=torch.Generator().manual_seed(31))  # 2x3 tiles, 2 chunks


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        vae = tiny_vae()
        for tile_batch in (1, 0):
            chunks = list(iter_video_frames(vae, latents(), tile_batch=tile_batch, group=dist.group.WORLD))
            if rank == 0:
                torch.save(torch.cat(chunks), f"{out_dir}/frames_{tile_batch}.pt")
            else:
                assert chunks == []
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_decode_the_same_frames_as_one(tmp_path):
    """Rank 0 of a 2-rank gloo group yields exactly the 1-rank frames with one tile per call (each rank decodes
    every other tile of each chunk, rank 0 gathers and stitches), and within one level with a whole share per call;
    rank 1 yields nothing."""
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    vae = tiny_vae()
    reference = decode_video(vae, latents())  # diffusers' per-tile decode
    per_tile = torch.load(tmp_path / "frames_1.pt")
    shared = torch.load(tmp_path / "frames_0.pt")
    assert torch.equal(per_tile, reference)
    assert shared.shape == reference.shape and (shared.int() - reference.int()).abs().max() <= 1
