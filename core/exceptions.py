"""Named job failures. Each carries the stable `code` written to the job record's `error` and shown by the API."""
from __future__ import annotations

# Raised by h3batch.settings and the start-up checks; re-exported so job code finds every error here.
from h3batch.settings import ConfigError  # noqa: F401


class JobError(Exception):
    """Base: a job ended in `failed` for a reason the client can read."""

    code = "render_error"
    retryable = False

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ReleaseMismatch(JobError):
    """The job asked for a release this worker does not serve."""

    code = "release_mismatch"


class InvalidRequest(JobError):
    """The pipeline refused the request (Pipeline.validate raised ValueError)."""

    code = "invalid_request"


class WorkerLost(JobError):
    """The job's worker died too many times (attempts exhausted)."""

    code = "worker_lost"
    retryable = True


class RenderFailed(JobError):
    """The render raised something unexpected; the traceback stays in the worker log, not on the record."""

    code = "render_error"



class ExceedsWorkerCapacity(JobError):
    """The job needs more rows than this worker advertises (`max_rows`, worker/capacity.py); the API refuses such a
    request up front with 422 of the same code, so a worker sees one only when the fleet shrank after it was queued."""

    code = "exceeds_worker_capacity"


class LoraBaseMismatch(JobError):
    """The job names per-job LoRAs this worker's release cannot take (a FastH3 V2 release takes none; an adapter whose
    tensors do not fit the served DiT); the API refuses the first case up front with 422 of the same code."""

    code = "lora_base_mismatch"


class LoraUnavailable(JobError):
    """An accepted adapter could not be loaded on the worker (not in the Hub cache and downloads off, a folder gone)."""

    code = "lora_unavailable"
    retryable = True


class NoCapableWorker(JobError):
    """The job needs a task or precision this worker does not serve (core/routing.py); routing sends it only to
    workers that do and the API refuses it up front with 422 of the same code, so a worker sees one only when a
    message was sent to a queue by hand (`h3batch worker --queues`)."""

    code = "no_capable_worker"


class JobTimeout(JobError):
    """The job was not finished within its own `timeout_s` of its creation (queue time included): refused at claim
    when already past it, else stopped by the run deadline (worker/deadline.py). Not retryable."""

    code = "timeout"


class OutOfMemory(JobError):
    """The render ran out of host or GPU memory (worker/memory_errors.py tells which); the message names the memory,
    the stage, the request's rows and canvas and the allocation asked for. Not retryable: the same request on the
    same fleet would fail the same way; the worker freed the memory and serves the next job (worker/oom.py)."""

    code = "out_of_memory"
