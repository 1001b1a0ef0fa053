"""What the four fused modulation ops share: precision and backend knobs, input checks, row chunks, torch rounding.

Spec h3-model.md §5. Two precision modes (an Enum, never a string inside the package):

* GENERIC: fp32 math, one rounding at the output store. The gate+norm op always rounds `u` to bf16 and back
  (§5.2), even for fp32 inputs.
* SM90_BF16_AFFINE (§5.3): in the two RMSNorm ops the normalized row is rounded to bf16, then
  `out = bf16(bf16(n * bf16(scale + 1)) + shift)`, each op rounding as eager bf16 does. `indexed_scale_shift_` and
  `indexed_gate` keep GENERIC semantics in both modes.

The automatic choice lives in one predicate, `is_sm90_device`, so tests can patch it.
"""
from __future__ import annotations

import enum
import os
import weakref
from typing import Iterator

import torch

PRECISION_ENV = "H3BATCH_MODULATION_PRECISION"
"""Default precision mode when an op gets `precision=None`: `generic` or `sm90_bf16_affine` (unset = automatic)."""

BACKEND_ENV = "H3BATCH_KERNEL_BACKEND"
"""Default backend when an op gets `backend=None`: `triton` or `torch` (unset = automatic)."""

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


class Precision(enum.Enum):
    """Rounding semantics of the fused ops (spec §5.2, §5.3)."""

    GENERIC = "generic"
    SM90_BF16_AFFINE = "sm90_bf16_affine"


class Backend(enum.Enum):
    """Which implementation runs an op."""

    TRITON = "triton"
    TORCH = "torch"


# ---------------------------------------------------------------------------------------------------------------------
# Dispatch


def is_sm90_device(device: torch.device) -> bool:
    """True where the Hopper bf16-affine semantics are the default: a CUDA device of compute capability 9.x."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def _parse_enum(kind: type[enum.Enum], value: object, source: str) -> enum.Enum:
    if isinstance(value, kind):
        return value
    choices = [member.value for member in kind]
    if isinstance(value, str):
        for member in kind:
            if member.value == value.strip().lower():
                return member
    raise ValueError(f"{source}: expected one of {choices} or None, got {value!r}")


def resolve_precision(precision: Precision | str | None, x: torch.Tensor) -> Precision:
    """Argument, else env var, else SM90_BF16_AFFINE for bf16 inputs on a 9.x GPU and GENERIC elsewhere."""
    if precision is None and os.environ.get(PRECISION_ENV, "").strip():
        precision = _parse_enum(Precision, os.environ[PRECISION_ENV], f"env {PRECISION_ENV}")
    if precision is None:
        if x.dtype == torch.bfloat16 and is_sm90_device(x.device):
            return Precision.SM90_BF16_AFFINE
        return Precision.GENERIC
    mode = _parse_enum(Precision, precision, "precision")
    if mode is Precision.SM90_BF16_AFFINE and x.dtype != torch.bfloat16:
        raise ValueError(f"precision: sm90_bf16_affine needs bf16 inputs, got {x.dtype}")
    return mode


def triton_interpret_requested() -> bool:
    """True when TRITON_INTERPRET is set to a true value (Triton's own spelling: 1, true, on, yes)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def is_interpreted(kernel: object) -> bool:
    """True for a @triton.jit object built under TRITON_INTERPRET=1 (it runs on CPU; its bf16 casts truncate)."""
    return type(kernel).__name__ == "InterpretedFunction"


def resolve_backend(backend: Backend | str | None, device: torch.device, kernel: object) -> Backend:
    """Argument, else env var, else triton on CUDA and on CPU only under TRITON_INTERPRET=1 (torch otherwise).

    `kernel` is the op's @triton.jit object: choosing triton for CPU tensors needs it to have been built by the
    interpreter (TRITON_INTERPRET=1 set before the kernels were imported), and a compiled one needs CUDA tensors.
    """
    if backend is None and os.environ.get(BACKEND_ENV, "").strip():
        backend = _parse_enum(Backend, os.environ[BACKEND_ENV], f"env {BACKEND_ENV}")
    if backend is None:
        backend = Backend.TRITON if device.type == "cuda" or triton_interpret_requested() else Backend.TORCH
    choice = _parse_enum(Backend, backend, "backend")
    if choice is Backend.TRITON:
        if device.type == "cpu" and not is_interpreted(kernel):
            raise ValueError("backend: triton on CPU tensors needs TRITON_INTERPRET=1 set before `kernels` is "
                             "imported; use backend='torch' or CUDA tensors")
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"backend: triton runs on cuda (or cpu under TRITON_INTERPRET=1), got {device}")
    return choice


# ---------------------------------------------------------------------------------------------------------------------
# Input checks (ValueError naming the argument, what was expected and what arrived)


def check_activation(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    """Activations: [R, H] or [B, S, H], fp32/bf16, columns contiguous; `like` fixes shape, dtype and device."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if like is None:
        if t.dim() not in (2, 3):
            raise ValueError(f"{name}: expected a 2-D [R, H] or 3-D [B, S, H] tensor, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: expected dtype float32 or bfloat16, got {t.dtype}")
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


def check_weight(weight: torch.Tensor, x: torch.Tensor) -> None:
    """RMSNorm weight: contiguous [H], fp32 or bf16 (independent of the activations' dtype), device of x."""
    hidden = x.shape[-1]
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 1 or weight.shape[0] != hidden:
        raise ValueError(f"weight: expected shape ({hidden},), got {tuple(weight.shape)}")
    if weight.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"weight: expected dtype float32 or bfloat16, got {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"weight: expected device {x.device}, got {weight.device}")
    if hidden > 1 and weight.stride(0) != 1:
        raise ValueError(f"weight: expected a contiguous tensor, got stride {weight.stride()}")


def check_eps(eps: object) -> None:
    """eps: a finite non-negative Python number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= float(eps) < float("inf")):
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")


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


# ---------------------------------------------------------------------------------------------------------------------
# Launch helpers


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


# ---------------------------------------------------------------------------------------------------------------------
# Torch references' rounding


def round_bf16(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest bf16 (ties to even, as torch casts) -> back to fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


def reference_rms_modulate(u: torch.Tensor, weight: torch.Tensor, shift_rows: torch.Tensor, scale_rows: torch.Tensor,
                           eps: float, precision: Precision) -> torch.Tensor:
    """fp32 RMSNorm of u, then the affine of the chosen mode; returns fp32 holding the output values.

    u: fp32 [..., H]; shift_rows, scale_rows: the gathered table rows, broadcastable to u, in storage dtype.
    """
    variance = (u * u).sum(-1, keepdim=True) / u.shape[-1]
    normalized = u * torch.rsqrt(variance + eps) * weight.float()
    shift, scale = shift_rows.float(), scale_rows.float()
    if precision is Precision.GENERIC:
        return normalized * (1.0 + scale) + shift
    # SM90_BF16_AFFINE: n rounded to bf16, then each bf16 op rounds (eager bf16: (scale + 1), n * that, + shift).
    normalized = round_bf16(normalized)
    return round_bf16(round_bf16(normalized * round_bf16(scale + 1.0)) + shift)
