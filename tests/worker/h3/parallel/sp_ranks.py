"""Rank entry points for the SP tests (imported by spawned processes, so they live in a plain module)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

TEXT_ROWS = 7
AUDIO_ROWS = 10  # 2A
VIDEO_GRID = (5, 8, 8)  # (T, Hl/2, Wl/2): 2·2·2 = 8 video tiles, top-k 2 at sparsity 0.8, so VSA is really sparse
SEQUENCE = TEXT_ROWS + AUDIO_ROWS + VIDEO_GRID[0] * VIDEO_GRID[1] * VIDEO_GRID[2]  # 337: prime, divides by no N


@dataclass(frozen=True)
class DitInputs:
    """Positional arguments of `H3Transformer.forward` for one T2VA-shaped packed sequence (text, audio, video)."""

    args: tuple

    @classmethod
    def make(cls, config, seed: int = 0) -> "DitInputs":
        g = torch.Generator().manual_seed(seed)
        video_rows = SEQUENCE - TEXT_ROWS - AUDIO_ROWS
        tags = torch.zeros(SEQUENCE, dtype=torch.long)
        tags[:TEXT_ROWS] = 1
        tags[TEXT_ROWS:TEXT_ROWS + AUDIO_ROWS] = 2
        timestep_indices = (tags == 2).long()  # text and video at t_v, audio at t_a
        return cls((
            torch.randn(1, video_rows, config.video_patch_dim, generator=g),
            torch.randn(1, AUDIO_ROWS, config.audio_latents_dim, generator=g),
            torch.randn(1, TEXT_ROWS, config.text_dim, generator=g),
            torch.tensor([0.25, 0.625]),
            timestep_indices,
            tags,
            torch.rand(SEQUENCE, 3, generator=g, dtype=torch.float64) * 40.0,
            torch.arange(TEXT_ROWS + AUDIO_ROWS, SEQUENCE),
            torch.arange(TEXT_ROWS, TEXT_ROWS + AUDIO_ROWS),
            torch.arange(TEXT_ROWS),
        ))


def vsa_plan():
    from h3batch.worker.h3.vsa_plan import build_vsa_plan

    return build_vsa_plan((TEXT_ROWS, AUDIO_ROWS), VIDEO_GRID)


def load_dit(release_dir: Path, dtype: torch.dtype):
    from h3batch.worker.h3.loader import load_transformer

    return load_transformer(Path(release_dir) / "transformer", vsa_gates=True, dtype=dtype)


@torch.inference_mode()
def dit_outputs(model, inputs: DitInputs) -> dict[str, torch.Tensor]:
    """Dense and VSA outputs of one model on the same inputs."""
    dense_video, dense_audio = model(*inputs.args)
    vsa_video, vsa_audio = model(*inputs.args, vsa_plan=vsa_plan())
    return {"dense_video": dense_video, "dense_audio": dense_audio, "vsa_video": vsa_video, "vsa_audio": vsa_audio}


def refusals(model, world: int) -> list[str]:
    """Messages of the ValueErrors raised by applying SP twice and by a head count the group does not divide."""
    from h3batch.worker.h3.parallel import SequenceParallel, apply_sequence_parallel, parallelize_attention

    messages = []
    for attempt in (lambda: apply_sequence_parallel(model),
                    lambda: parallelize_attention([], SequenceParallel(None), heads=2 * world + 1)):
        try:
            attempt()
        except ValueError as err:
            messages.append(str(err))
    return messages


def sp_dit_rank(rank: int, world: int, port: int, release_dir: str, out_dir: str, dtype_name: str) -> None:
    """One gloo rank: load the tiny DiT, make it sequence-parallel, save its dense and VSA outputs."""
    from h3batch.worker.h3.parallel import apply_sequence_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = apply_sequence_parallel(load_dit(Path(release_dir), getattr(torch, dtype_name)))
        outputs = dit_outputs(model, DitInputs.make(model.config))
        outputs["refusals"] = refusals(model, world)
        torch.save(outputs, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (the gloo rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
