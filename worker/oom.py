"""CUDA out-of-memory in a render: free what the failed render held, and the debug knob that injects one.

Failure handled: a request that does not fit the GPU after all (the advertised `max_rows` is a plan, and
fragmentation or another process on the GPU can take memory). torch raises `torch.OutOfMemoryError` (the same class
as `torch.cuda.OutOfMemoryError`) from some allocation deep in the DiT, a VAE or the text encoder. `worker/tasks.py`
catches it around the render; `worker/attempt.py` fails that job with `out_of_memory` (retryable false) through
the one transition, then `release_memory` drops what the exception still holds (its traceback pins every frame of
the render, and with them the latents, activations and decoded frames), collects, and gives the cached blocks back
to the driver, so the next job starts from the worker's resident footprint rather than OOMing again.

`H3BATCH_DEBUG_OOM_AT=<stage>[:<min rows>]` raises that real exception class from inside the pipeline (its progress
report at entry to `stage`, step 0 for `denoise`, with the stage's tensors alive) for every
job of at least `min rows` capacity rows: the CPU test of this path (tests/system/test_capacity.py).
"""
from __future__ import annotations

import gc
import logging
import traceback
from dataclasses import dataclass

import torch

log = logging.getLogger("h3batch.worker")

OutOfMemoryError = torch.OutOfMemoryError
"""What torch raises when an allocation fails on the GPU (torch.cuda.OutOfMemoryError is the same class)."""


@dataclass(frozen=True)
class InjectedOom:
    """H3BATCH_DEBUG_OOM_AT: raise OutOfMemoryError at `stage` for requests of at least `min_rows` rows."""

    stage: str
    min_rows: int = 0

    def check(self, stage: str, rows: int) -> None:
        """Called at every progress report of the render; raises once the chosen stage is reached."""
        if stage == self.stage and rows >= self.min_rows:
            raise OutOfMemoryError(f"CUDA out of memory (injected by H3BATCH_DEBUG_OOM_AT at stage {stage}, "
                                   f"{rows} rows >= {self.min_rows})")


def release_memory(exc: BaseException | None = None) -> None:
    """Free what a failed render held: clear the frames of `exc`'s traceback (their locals are the render's
    tensors) and drop it, run the garbage collector, and on CUDA return the allocator's cached blocks."""
    if exc is not None and exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def memory_summary() -> str:
    """Allocated / reserved GPU memory for the log line of an OOM ("cpu" without CUDA)."""
    if not torch.cuda.is_available():
        return "device=cpu"
    gib = 1 << 30
    return (f"allocated_gib={torch.cuda.memory_allocated() / gib:.2f} "
            f"reserved_gib={torch.cuda.memory_reserved() / gib:.2f}")
