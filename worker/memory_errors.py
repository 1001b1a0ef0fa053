"""Which failures of a render are memory running out, on the host or on the GPU, and the job error that says so.

torch reports the two differently: a failed GPU allocation raises `torch.OutOfMemoryError` ("CUDA out of memory.
Tried to allocate 2.00 GiB ..."); a failed host allocation raises a plain `RuntimeError` from the CPU allocator
("DefaultCPUAllocator: can't allocate memory: you tried to allocate 47606284288 bytes. Error code 12 ..."), and
Python's own allocations raise `MemoryError`. Before this module only the first was recognised; a host OOM failed the
job as `render_error (RuntimeError)`, with no hint that it was memory (issue 30). Written by hand because torch has no
public predicate for "this RuntimeError is an allocation failure"; the message patterns are torch's own
(c10/core/impl/alloc_cpu.cpp and the CUDA caching allocator).
"""
from __future__ import annotations

import re
from enum import Enum

import torch

from h3batch.core.exceptions import OutOfMemory


class MemoryKind(str, Enum):
    HOST = "host"
    GPU = "GPU"


_HOST_OOM = re.compile(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)|"
                       r"Cannot allocate memory|std::bad_alloc", re.IGNORECASE)
_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
_UNITS = re.compile(r"tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_SCALE = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def memory_kind(exc: BaseException) -> MemoryKind | None:
    """GPU for torch's out-of-memory error, HOST for MemoryError or the CPU allocator's RuntimeError, else None."""
    if isinstance(exc, torch.OutOfMemoryError):
        return MemoryKind.GPU
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _HOST_OOM.search(str(exc))):
        return MemoryKind.HOST
    return None


def bytes_asked(exc: BaseException) -> int | None:
    """The size of the allocation that failed, when the message names it (both allocators do)."""
    text = str(exc)
    if match := _BYTES.search(text):
        return int(match.group(1))
    if match := _UNITS.search(text):
        return round(float(match.group(1)) * _SCALE[match.group(2).lower()])
    return None


def out_of_memory(exc: BaseException, kind: MemoryKind, *, stage: str, rows: int, canvas: str,
                  max_rows: int) -> OutOfMemory:
    """The job's error: which memory, at which stage, for what request and how large an allocation."""
    asked = bytes_asked(exc)
    size = f", asking for {asked / 1e9:.1f} GB at once" if asked is not None else ""
    return OutOfMemory(f"{kind.value} memory ran out at stage {stage} rendering {rows} rows ({canvas}){size}; this "
                       f"worker advertises max_rows {max_rows}; a smaller canvas or a shorter clip needs fewer rows")
