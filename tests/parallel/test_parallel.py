"""Ulysses sequence parallelism (worker/h3/parallel.py) on gloo: N ranks reproduce the single-process DiT."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from sp_ranks import SEQUENCE, DitInputs, dit_outputs, free_port, load_dit, sp_dit_rank
from worker.h3.parallel import RowShard

FP32_ATOL = 1e-5


def run_ranks(world: int, release, out_dir, dtype_name: str) -> list[dict[str, torch.Tensor]]:
    """Spawn `world` gloo ranks of the SP DiT; each saves its outputs; returns them in rank order."""
    mp.start_processes(sp_dit_rank, args=(world, free_port(), str(release), str(out_dir), dtype_name),
                       nprocs=world, start_method="spawn")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_sequence_parallel_matches_one_process_fp32(tiny_release, tmp_path, world):
    """N gloo ranks (S = 337, not divisible by N) give every rank the single-process fp32 outputs, dense and VSA."""
    torch.set_num_threads(1)  # as in the ranks: the matmul reduction order then matches row for row
    model = load_dit(tiny_release, torch.float32)
    reference = dit_outputs(model, DitInputs.make(model.config))
    ranks = run_ranks(world, tiny_release, tmp_path, "float32")
    for name, expected in reference.items():
        for rank, outputs in enumerate(ranks):
            got = outputs[name]
            assert got.shape == expected.shape and got.dtype == torch.float32
            diff = (got - expected).abs().max().item()
            assert diff <= FP32_ATOL, f"{name} rank {rank}/{world}: max abs diff {diff:.3g}"
        assert torch.equal(ranks[0][name], ranks[-1][name])  # the gathered output is the same tensor everywhere


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
