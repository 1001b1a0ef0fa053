"""The one timer every bench script uses: CUDA-event times of a callable, after warm-up (wall clock without a GPU).

Imported as a sibling module (`python bench/x.py` puts bench/ on sys.path); the h3batch package itself must be
installed (`make setup`, or `pip install --no-deps -e .` on a GPU machine).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def times_ms(fn: Callable[[], object], reps: int, warmup: int = 2, inner: int = 1) -> list[float]:
    """Per-call ms of `reps` timed rounds of `inner` back-to-back calls each, after `warmup` untimed calls.

    Back-to-back calls (inner > 1) let the host run ahead of the GPU as it does inside the DiT, so Python dispatch
    time is hidden unless it exceeds the kernel time.
    """
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        out = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append(1e3 * (time.perf_counter() - start) / inner)
        return out
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / inner)
    return out


def median_ms(fn: Callable[[], object], reps: int = 10, warmup: int = 2, inner: int = 1) -> float:
    """Median of `times_ms`."""
    return statistics.median(times_ms(fn, reps, warmup, inner))
