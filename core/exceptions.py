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

