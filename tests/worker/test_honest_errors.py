"""Errors that say what happened (issue 30): a failure in the first denoise step is attributed to `denoise`, and
host or GPU memory running out is `out_of_memory` naming the memory, the stage and the size asked."""
from __future__ import annotations

import pytest
import torch

from h3batch.core.exceptions import OutOfMemory
from h3batch.worker import memory_errors
from h3batch.worker.memory_errors import MemoryKind
from h3batch.worker.pipeline import Pipeline, RenderRequest


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    from h3batch.worker.h3.tiny_release import build_tiny_release

    base = tmp_path_factory.mktemp("honest")
    release = build_tiny_release(base / "release", base / "hf-cache").release_dir
    return Pipeline.load(release, device="cpu", hf_cache=base / "hf-cache")


class StepOneFails(RuntimeError):
    """Raised from inside the first denoise step (at its step boundary, before its DiT forward)."""


def test_a_failure_in_the_first_denoise_step_is_reported_at_stage_denoise(pipe, monkeypatch):
    """The denoise stage is reported (step 0 of 8) before its first forward, so whatever fails inside step 1 finds
    the stage already `denoise`; it used to be reported only after step 1, leaving `text_encode` on the record."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reports: list[tuple[str, int, int]] = []
    boundaries = []

    def should_cancel() -> bool:  # boundary 1: before text_encode; boundary 2: inside step 1, before its forward
        boundaries.append(len(reports))
        if len(boundaries) == 2:
            raise StepOneFails("boom in step 1")
        return False

    with pytest.raises(StepOneFails):
        pipe.denoise(RenderRequest(prompt="rain", seconds=4.0, width=64, height=64, seed=1),
                     on_progress=lambda *r: reports.append(r), should_cancel=should_cancel)
    assert reports == [("text_encode", 0, 0), ("denoise", 0, 8)]


def test_host_allocation_failures_are_out_of_memory_with_the_size_asked():
    """The CPU allocator's RuntimeError and Python's MemoryError (both real, from impossible allocations) are host
    memory; the job error names the memory, the stage, rows, canvas and the bytes asked."""
    with pytest.raises(RuntimeError) as torch_host:
        torch.empty(1 << 62, dtype=torch.uint8)
    with pytest.raises(MemoryError) as python_host:
        bytearray(1 << 62)
    assert memory_errors.memory_kind(torch_host.value) is MemoryKind.HOST
    assert memory_errors.memory_kind(python_host.value) is MemoryKind.HOST
    assert memory_errors.bytes_asked(torch_host.value) == 1 << 62
    error = memory_errors.out_of_memory(torch_host.value, MemoryKind.HOST, stage="decode", rows=110086,
                                        canvas="768x1344, 15 s", max_rows=3000)
    assert isinstance(error, OutOfMemory) and error.code == "out_of_memory" and error.retryable is False
    assert error.message.startswith("host memory ran out at stage decode rendering 110086 rows (768x1344, 15 s)")
    assert f"asking for {(1 << 62) / 1e9:.1f} GB" in error.message


def test_gpu_out_of_memory_and_other_errors_are_told_apart():
    """torch.OutOfMemoryError is GPU memory (its `Tried to allocate 2.00 GiB` read as bytes); an unrelated
    RuntimeError is no memory error at all."""
    gpu = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)")
    assert memory_errors.memory_kind(gpu) is MemoryKind.GPU and memory_errors.bytes_asked(gpu) == 2 << 30
    assert memory_errors.memory_kind(RuntimeError("shape mismatch: [1, 2] vs [3]")) is None
    message = memory_errors.out_of_memory(gpu, MemoryKind.GPU, stage="denoise", rows=2896, canvas="256x128, 4 s",
                                          max_rows=2000).message
    assert message.startswith("GPU memory ran out at stage denoise rendering 2896 rows") and "2.1 GB" in message
