"""What every op's launcher shares: argument checks, block sizes, the row launch plan and the one launch loop.

Checks raise ValueError naming the argument, what was expected and what arrived. Every kernel has one program per
row along grid axis 0 (`row_offset` + program id); `launch_rows` makes the launches `launch_plan` lists and passes
the meta-parameters all kernels share. The op files keep their kernel, launcher (which picks the block size and the
other arguments) and torch reference.
"""
from __future__ import annotations

import weakref
from typing import Iterator

import torch

from h3batch.kernels.backend import is_interpreted

MAX_ROWS_PER_LAUNCH = 65535
"""Row-chunk size for grids that are limited to a 16-bit dimension (spec §5.5 chunk lists)."""

CUDA_MAX_GRID_ROWS = 2**31 - 1
"""CUDA grid x-dimension limit: CUDA launches one grid of R rows (spec §5.1)."""

CHUNK_COLUMNS = 2048
"""Columns one program handles per loop step; rows wider than this are streamed in chunks (H200 sweep in
docs/benchmarks.md). Both RMS ops must use the same chunking: it fixes their fp32 summation order, and the spec's
residual-boundary test needs the two to normalize a row bit-identically."""

MAX_HIDDEN = 65536
"""Widest row the one-program-per-row kernels accept; wider rows would want a split-row kernel."""

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------------------
# Input checks


def check_dtype(name: str, t: torch.Tensor) -> None:
    """A tensor the kernels compute from: fp32 or bf16."""
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}: expected dtype float32 or bfloat16, got {t.dtype}")


def check_eps(eps: object) -> None:
    """eps: a finite non-negative Python number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= float(eps) < float("inf")):
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")


def check_activation(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    """Activations: [R, H] or [B, S, H], fp32/bf16, columns contiguous; `like` fixes shape, dtype and device."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if like is None:
        if t.dim() not in (2, 3):
            raise ValueError(f"{name}: expected a 2-D [R, H] or 3-D [B, S, H] tensor, got shape {tuple(t.shape)}")
        check_dtype(name, t)
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
        if t.shape[-1] == 0:
            raise ValueError(f"{name}: hidden size must be at least 1, got shape {tuple(t.shape)}")
    else:
        if t.shape != like.shape:
            raise ValueError(f"{name}: expected shape {tuple(like.shape)}, got {tuple(t.shape)}")
        if t.dtype != like.dtype:
            raise ValueError(f"{name}: expected dtype {like.dtype} (same as the first activation), got {t.dtype}")
        if t.device != like.device:
            raise ValueError(f"{name}: expected device {like.device}, got {t.device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: columns must be contiguous (stride 1 along H), got strides {t.stride()}; "
                         "call .contiguous() first")


def check_table(name: str, table: torch.Tensor, x: torch.Tensor) -> None:
    """Modulation tables: [K, H], dtype of x, device of x, columns contiguous; row stride free (e.g. 6H views)."""
    hidden = x.shape[-1]
    if not isinstance(table, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(table).__name__}")
    if table.dim() != 2 or table.shape[1] != hidden:
        raise ValueError(f"{name}: expected a 2-D [K, {hidden}] table, got shape {tuple(table.shape)}")
    if table.dtype != x.dtype:
        raise ValueError(f"{name}: expected dtype {x.dtype} (same as the activations), got {table.dtype}")
    if table.device != x.device:
        raise ValueError(f"{name}: expected device {x.device}, got {table.device}")
    if hidden > 1 and table.stride(1) != 1:
        raise ValueError(f"{name}: columns must be contiguous (stride 1 along H), got strides {table.stride()}")


def check_same_rows(first: tuple[str, torch.Tensor], *others: tuple[str, torch.Tensor]) -> None:
    """Tables indexed together (already checked with `check_table`) have the first one's shape, (name, table) each."""
    first_name, first_table = first
    for name, table in others:
        if table.shape != first_table.shape:
            raise ValueError(f"{name}: expected the shape of {first_name} {tuple(first_table.shape)}, "
                             f"got {tuple(table.shape)}")


def check_weight(weight: torch.Tensor, x: torch.Tensor) -> None:
    """RMSNorm weight: contiguous [H], fp32 or bf16 (independent of the activations' dtype), device of x."""
    hidden = x.shape[-1]
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 1 or weight.shape[0] != hidden:
        raise ValueError(f"weight: expected shape ({hidden},), got {tuple(weight.shape)}")
    check_dtype("weight", weight)
    if weight.device != x.device:
        raise ValueError(f"weight: expected device {x.device}, got {weight.device}")
    if hidden > 1 and weight.stride(0) != 1:
        raise ValueError(f"weight: expected a contiguous tensor, got stride {weight.stride()}")


# Indices tensors whose values were already range-checked: id -> (weakref, version, table rows). Checking values on
# CUDA costs a host sync, so a tensor is checked once until it changes (its `_version` moves on any in-place write).
_CHECKED_INDICES: dict[int, tuple[weakref.ref, int, int]] = {}


def check_indices(indices: torch.Tensor, x: torch.Tensor, table_rows: int) -> None:
    """indices: 1-D int32/int64 of length S (x.shape[-2]) on x's device, values in [0, table_rows)."""
    seq_len = x.shape[-2]
    if not isinstance(indices, torch.Tensor):
        raise ValueError(f"indices: expected a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices: expected dtype int64 or int32, got {indices.dtype}")
    if indices.dim() != 1 or indices.shape[0] != seq_len:
        raise ValueError(f"indices: expected shape ({seq_len},) (one table row per row of x), "
                         f"got {tuple(indices.shape)}")
    if indices.device != x.device:
        raise ValueError(f"indices: expected device {x.device}, got {indices.device}")
    if seq_len == 0:
        return
    # Inference tensors keep no version counter: such a tensor is checked once and trusted after (the pipeline
    # builds its index tensors once per request and never writes them).
    version = -1 if indices.is_inference() else indices._version
    cached = _CHECKED_INDICES.get(id(indices))
    if cached is not None and cached[0]() is indices and cached[1] == version and cached[2] == table_rows:
        return
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= table_rows:
        raise ValueError(f"indices: values must lie in [0, {table_rows}) (table rows), got min {low} max {high}")
    if indices.device.type != "cpu":
        if len(_CHECKED_INDICES) > 256:
            for key in [k for k, v in _CHECKED_INDICES.items() if v[0]() is None]:
                del _CHECKED_INDICES[key]
        _CHECKED_INDICES[id(indices)] = (weakref.ref(indices), version, table_rows)


def check_indexed_tables(x: torch.Tensor, indices: torch.Tensor, *tables: tuple[str, torch.Tensor]) -> None:
    """Tables that one `indices` tensor indexes, (name, table) each: each a table for x (`check_table`), all of the
    first one's shape, and indices valid rows of them (`check_indices`)."""
    for name, table in tables:
        check_table(name, table, x)
    check_same_rows(*tables)
    check_indices(indices, x, tables[0][1].shape[0])


# ---------------------------------------------------------------------------------------------------------------------
# Shapes and launches


def block_config(hidden: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for rows of `hidden` columns: a power-of-two chunk <= CHUNK_COLUMNS, 8 bf16 per
    thread per chunk (one 16-byte load) up to 8 warps; refuses rows over MAX_HIDDEN."""
    if hidden > MAX_HIDDEN:
        raise ValueError(f"hidden size: at most {MAX_HIDDEN} columns per row are supported, got {hidden}")
    block = min(1 << max(0, (hidden - 1).bit_length()), CHUNK_COLUMNS)
    return block, min(max(block // 256, 1), 8)


def rows_of(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(total rows, S, batch stride, row stride) of an activation viewed as B x S rows (B = 1 for 2-D)."""
    if x.dim() == 2:
        return x.shape[0], x.shape[0], 0, x.stride(0)
    return x.shape[0] * x.shape[1], x.shape[1], x.stride(0), x.stride(1)


def new_rows(x: torch.Tensor) -> torch.Tensor:
    """An uninitialized contiguous output shaped like x, in x's dtype and on its device."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def row_chunks(rows: int, max_rows: int = MAX_ROWS_PER_LAUNCH) -> Iterator[tuple[int, int]]:
    """(offset, count) pairs covering [0, rows) with count <= max_rows: 65536 -> (0, 65535), (65535, 1)."""
    for offset in range(0, rows, max_rows):
        yield offset, min(max_rows, rows - offset)


def max_grid_rows(device: torch.device) -> int:
    """Rows one launch may cover: one CUDA grid holds any realistic R; elsewhere (interpreter) 65535 per chunk."""
    return CUDA_MAX_GRID_ROWS if device.type == "cuda" else MAX_ROWS_PER_LAUNCH


def launch_plan(rows: int, device: torch.device) -> list[tuple[int, int]]:
    """The (row_offset, grid_rows) launches an op makes: CUDA one grid (69888 -> [(0, 69888)]), else chunks."""
    return list(row_chunks(rows, max_grid_rows(device)))


def launch_rows(kernel, rows: int, device: torch.device, *args: object, grid_columns: int = 1,
                **meta: object) -> None:
    """Run `kernel` over `rows` rows: one launch of grid (grid_rows, grid_columns) per `launch_plan` entry.

    `args` are the kernel's arguments before `row_offset`, which is passed by name; `meta` holds the arguments
    after it by name (eps, constexprs, num_warps). Every launch also gets NATIVE_CAST (compiled kernels round with
    the hardware cast; the interpreter's truncates) and enable_fp_fusion=False (no FMA: each op rounds like torch's).
    """
    native_cast = not is_interpreted(kernel)
    for row_offset, grid_rows in launch_plan(rows, device):
        kernel[(grid_rows, grid_columns)](*args, row_offset=row_offset, NATIVE_CAST=native_cast,
                                          enable_fp_fusion=False, **meta)
