"""Ulysses sequence parallelism (worker/h3/parallel.py) on gloo: N ranks reproduce the single-process DiT."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from h3batch.worker.h3.parallel import RowShard
from tests.worker.h3.parallel.sp_ranks import SEQUENCE, DitInputs, dit_outputs, free_port, load_dit, sp_dit_rank

FP32_ATOL = 1e-5


@pytest.fixture(scope="module")
def rank_outputs(tiny_release, tmp_path_factory):
    """world -> per-rank saved outputs of one spawned gloo run (each world size is spawned once per module)."""
    runs: dict[int, list[dict]] = {}

    def get(world: int) -> list[dict]:
        if world not in runs:
            out_dir = tmp_path_factory.mktemp(f"sp{world}")
            mp.start_processes(sp_dit_rank, args=(world, free_port(), str(tiny_release), str(out_dir), "float32"),
                               nprocs=world, start_method="spawn")
            runs[world] = [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]
        return runs[world]

    return get


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sequence_parallel_matches_one_process_fp32(tiny_release, rank_outputs, world):
    """N gloo ranks (S = 337, not divisible by N) give every rank the single-process fp32 outputs, dense and VSA."""
    torch.set_num_threads(1)  # as in the ranks: the matmul reduction order then matches row for row
    model = load_dit(tiny_release, torch.float32)
    reference = dit_outputs(model, DitInputs.make(model.config))
    ranks = rank_outputs(world)
    for name, expected in reference.items():
        for rank, outputs in enumerate(ranks):
            got = outputs[name]
            assert got.shape == expected.shape and got.dtype == torch.float32
            diff = (got - expected).abs().max().item()
            assert diff <= FP32_ATOL, f"{name} rank {rank}/{world}: max abs diff {diff:.3g}"
        assert torch.equal(ranks[0][name], ranks[-1][name])  # the gathered output is the same tensor everywhere


def test_sequence_parallel_refuses_reapplication_and_indivisible_heads(rank_outputs):
    """Applying SP twice, or over a group that does not divide the head count, is a ValueError saying which."""
    messages = rank_outputs(2)[1]["refusals"]
    assert len(messages) == 2
    assert "already sequence-parallel" in messages[0]
    assert "5 attention heads" in messages[1] and "2 ranks" in messages[1]


def test_row_shard_pads_the_last_blocks():
    """S = 337 over 4 ranks: blocks of 85 rows, 3 pad rows on the last rank, and a rank with no real rows is legal."""
    shards = [RowShard(SEQUENCE, 4, r) for r in range(4)]
    assert [s.local_rows for s in shards] == [85] * 4 and shards[0].padded_rows == 340
    assert [s.valid_rows for s in shards] == [85, 85, 85, 82]
    rows = torch.arange(SEQUENCE)
    taken = torch.cat([s.take(rows, 0) for s in shards])
    assert torch.equal(taken[:SEQUENCE], rows) and taken[SEQUENCE:].tolist() == [0, 0, 0]
    tiny = [RowShard(5, 4, r) for r in range(4)]  # s = 2: ranks hold 2, 2, 1, 0 real rows
    assert [s.valid_rows for s in tiny] == [2, 2, 1, 0]
    assert tiny[3].take(torch.ones(5), 0).tolist() == [0.0, 0.0]
