"""launch: row chunks, launch plans and block sizes."""
from __future__ import annotations

import pytest
import torch

import h3batch.kernels.launch as launch


@pytest.mark.parametrize("rows,expected", [
    (0, []),
    (65535, [(0, 65535)]),
    (65536, [(0, 65535), (65535, 1)]),
    (69888, [(0, 65535), (65535, 4353)]),
])
def test_row_chunks_match_spec(rows, expected):
    """Spec §5.5 chunk iterator lists: (offset, count) with count <= 65535."""
    assert list(launch.row_chunks(rows)) == expected


def test_cuda_launches_one_grid_and_the_interpreter_chunks():
    """69888 rows: one CUDA grid at offset 0; chunked (65535, 4353) launches elsewhere."""
    assert launch.launch_plan(69888, torch.device("cuda")) == [(0, 69888)]
    assert launch.launch_plan(69888, torch.device("cpu")) == [(0, 65535), (65535, 4353)]


@pytest.mark.parametrize("hidden,block,warps", [(7, 8, 1), (336, 512, 2), (3072, 2048, 8), (5376, 2048, 8),
                                                (65536, 2048, 8)])
def test_block_config(hidden, block, warps):
    """Chunk = next power of two >= H capped at 2048 columns, warps from the chunk; H = 5376 streams 3 chunks."""
    assert launch.block_config(hidden) == (block, warps)


def test_block_config_refuses_wide_rows():
    """Rows wider than the supported maximum raise ValueError naming the hidden size."""
    with pytest.raises(ValueError, match="^hidden size: at most 65536"):
        launch.block_config(65537)
