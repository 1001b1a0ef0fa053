"""Interpreter setup, input builders and comparison rules shared by the kernel tests.

Triton fixes interpreter-or-compiler for the whole process when it is first imported (its own standard library is
decorated then), so importing this module sets TRITON_INTERPRET=1 on CPU-only hosts before anything imports triton,
and leaves it set (with H3BATCH_KERNEL_BACKEND=torch as the default for everyone else). When another room's test
imported triton earlier in the same run, the interpreter cases cannot run in this process: they are skipped, and
`test_interpreter_subprocess.py` runs them in a fresh `pytest tests/kernels`.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
SUBPROCESS_ENV = "H3BATCH_KERNEL_TESTS_SUBPROCESS"
"""Set in the child pytest that `test_interpreter_subprocess.py` starts (stops it recursing)."""

INTERPRETER_IN_PROCESS = False
if not CUDA:
    if "triton" not in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        # Only these tests asked for the interpreter: other rooms' CPU tests in the same run keep the torch
        # reference as their automatic backend (these tests clear the variable and pick backends explicitly).
        os.environ.setdefault("H3BATCH_KERNEL_BACKEND", "torch")
    INTERPRETER_IN_PROCESS = os.environ.get("TRITON_INTERPRET") == "1"

import h3batch.kernels  # noqa: E402,F401  (after TRITON_INTERPRET: @triton.jit reads it when decorating)

BF16_TOL = 5e-2
FP32_TOL = 1e-5


@dataclass(frozen=True)
class Case:
    """One input geometry: activations `lead + (hidden,)`, K table rows, index pattern."""

    lead: tuple[int, ...]  # (R,) or (B, S)
    hidden: int
    table_rows: int = 6
    pattern: str = "random"  # random | sorted | constant
    index_dtype: torch.dtype = torch.int64


CASES = [
    Case((37,), 336),  # R not a multiple of anything, H = 5376 / 16
    Case((5,), 672, pattern="sorted"),  # H = 5376 / 8
    Case((2, 9), 100, table_rows=3, index_dtype=torch.int32),  # [B, S, H], indices shared over the batch
    Case((13,), 7, table_rows=1, pattern="constant"),  # tiny non power of two, one table row
    Case((0,), 336),  # R = 0
]


def make_indices(case: Case, device: str, generator: torch.Generator) -> torch.Tensor:
    """Duplicate, unsorted indices in [0, K) (or sorted / constant) of length S."""
    seq_len = case.lead[-1]
    idx = torch.randint(0, case.table_rows, (seq_len,), generator=generator)
    if case.pattern == "sorted":
        idx = idx.sort().values
    if case.pattern == "constant":
        idx = torch.zeros(seq_len, dtype=torch.int64)
    return idx.to(device=device, dtype=case.index_dtype)


def make_inputs(case: Case, dtype: torch.dtype, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Activations (x/residual, branch), [K, 6H] adaLN rows sliced into shift/scale/gate views, weight, indices."""
    g = torch.Generator().manual_seed(seed)
    hidden = case.hidden

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    rows6 = randn(case.table_rows, 6 * hidden)  # row views with row stride 6H, as the DiT slices its projection
    return {
        "x": randn(*case.lead, hidden) * 2,
        "branch": randn(*case.lead, hidden),
        "shift": rows6[:, 0:hidden],
        "scale": rows6[:, hidden:2 * hidden] * 0.5,
        "gate": rows6[:, 2 * hidden:3 * hidden],
        "weight": 1 + 0.1 * randn(hidden),
        "indices": make_indices(case, device, g),
    }


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, *, exact: bool) -> None:
    """Bit-equality where the design gives it; else fp32 1e-5 / bf16 5e-2 with at most 0.1% of elements differing."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if exact:
        assert torch.equal(actual, expected), f"{(actual != expected).sum().item()} elements differ"
        return
    tol = BF16_TOL if actual.dtype == torch.bfloat16 else FP32_TOL
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
    if actual.dtype == torch.bfloat16 and actual.numel():
        # Only the fp32 reduction order (and rsqrt) may differ: a rare last-bit flip, never a systematic error.
        assert (actual != expected).float().mean().item() <= 1e-3
