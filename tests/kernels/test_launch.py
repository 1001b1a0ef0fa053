"""launch: row chunks, launch plans, block sizes, the shared launch loop and the shared table check."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

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


@triton.jit
def _row_id_kernel(
    out_ptr,  # int64 [rows, COLUMNS], contiguous: each program writes its row number into its cell
    row_offset,  # first row of this launch
    NATIVE_CAST: tl.constexpr,  # unused here; launch_rows passes it to every kernel
    COLUMNS: tl.constexpr,  # grid axis 1
):
    # This program owns one cell: row row_offset + program id 0, column program id 1.
    row = tl.program_id(0).to(tl.int64) + row_offset
    tl.store(out_ptr + row * COLUMNS + tl.program_id(1), row)


def test_launch_rows_covers_every_row_and_column(device, monkeypatch):
    """With 4 rows per launch, 10 rows x 3 grid columns take 3 launches whose row offsets fill every cell once."""
    monkeypatch.setattr(launch, "MAX_ROWS_PER_LAUNCH", 4)
    monkeypatch.setattr(launch, "CUDA_MAX_GRID_ROWS", 4)
    assert launch.launch_plan(10, torch.device(device)) == [(0, 4), (4, 4), (8, 2)]
    out = torch.full((10, 3), -1, dtype=torch.int64, device=device)
    launch.launch_rows(_row_id_kernel, 10, out.device, out, grid_columns=3, COLUMNS=3)
    assert torch.equal(out.cpu(), torch.arange(10).repeat_interleave(3).view(10, 3))


def test_tables_indexed_together_must_match():
    """check_same_rows names the first table whose shape differs from the first one's."""
    gate, shift = torch.zeros(3, 8), torch.zeros(3, 8)
    launch.check_same_rows(("gate", gate), ("shift", shift))
    with pytest.raises(ValueError, match=r"^scale: expected the shape of gate \(3, 8\), got \(2, 8\)"):
        launch.check_same_rows(("gate", gate), ("shift", shift), ("scale", torch.zeros(2, 8)))
