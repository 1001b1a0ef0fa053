"""One exception class per error code, under one base, so a caller catches exactly what it can act on:

    try:
        job = client.create(prompt="rain", width=100)
    except h3batch.client.UnsupportedSize as exc:
        print(exc.message)

`APIError` subclasses are the API's refusals (the envelope `{"error": {"code", "message", "retryable"}}` with the
HTTP status), grouped under one class per status (`BadRequest`, `NotFound`, `Conflict`, `RateLimited`, ...) so
`except NotFound` covers `JobNotFound` and `BatchNotFound`. `JobFailed` subclasses are jobs that ended without a
video, by the `error.code` on the job record. `ConnectionFailed`, `WaitTimeout` and `DownloadError` happen on the
client's side. A code this version does not know still maps to its status class (or `APIError`), never lost.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from h3batch.client.models import ErrorInfo

if TYPE_CHECKING:
    from h3batch.client.models import Job


class H3BatchError(Exception):
    """Base of every error h3batch.client raises."""


class ConnectionFailed(H3BatchError):
    """The API could not be reached, or the connection broke, after every retry."""


class WaitTimeout(H3BatchError):
    """`wait` gave up before the job finished (the job keeps running on the server)."""


class DownloadError(H3BatchError):
    """A download ended short of the announced size, or the server resumed at the wrong byte (run it again to
    continue from the partial file)."""


class OriginError(H3BatchError):
    """A URL from an answer points at another host; the client never sends its key there."""


# --- refusals by the API ------------------------------------------------------------------------------------------

class APIError(H3BatchError):
    """The API refused a request: `status` (HTTP), `code`, `message`, `retryable`, `retry_after` (seconds, from the
    Retry-After header), `request_id`, `details` (a refused batch's lines)."""

    status: int = 0
    code: str = ""

    def __init__(self, status: int, error: ErrorInfo, retry_after: float | None = None):
        super().__init__(f"{error.code}: {error.message}")
        self.status, self.error, self.retry_after = status, error, retry_after
        self.code, self.message, self.retryable = error.code, error.message, error.retryable
        self.request_id, self.details = error.request_id, error.details or []


class BadRequest(APIError):
    status = 400


class Unauthorized(APIError):
    status, code = 401, "unauthorized"


class Forbidden(APIError):
    status, code = 403, "forbidden"


class NotFound(APIError):
    status = 404


class Conflict(APIError):
    status = 409


class Gone(APIError):
    status = 410


class RequestTooLarge(APIError):
    status, code = 413, "request_too_large"


class Unprocessable(APIError):
    status = 422


class RateLimited(APIError):
    status, code = 429, "rate_limited"


class Unavailable(APIError):
    status = 503


def _code(base: type[APIError], code: str, doc: str) -> type[APIError]:
    return type("".join(part.title() for part in code.split("_")), (base,), {"code": code, "__doc__": doc,
                                                                             "__module__": __name__})


InvalidRequest = _code(BadRequest, "invalid_request", "A field or parameter is malformed; the message names it.")
InvalidJson = _code(BadRequest, "invalid_json", "The body is not a JSON object.")
InvalidCursor = _code(BadRequest, "invalid_cursor", "`after` is not the id of one of your jobs or batches.")
InvalidLimit = _code(BadRequest, "invalid_limit", "`limit` is outside 1..100.")
UnsupportedParameter = _code(BadRequest, "unsupported_parameter", "A field the API does not accept.")
UnsupportedSize = _code(BadRequest, "unsupported_size", "width/height/size/aspect_ratio off the contract.")
UnsupportedDuration = _code(BadRequest, "unsupported_duration", "seconds outside the contract.")
UnsupportedVariant = _code(BadRequest, "unsupported_variant", "A content variant the API does not offer.")
ModelNotFound = _code(BadRequest, "model_not_found", "A model name the API does not serve.")
WebhooksNotConfigured = _code(BadRequest, "webhooks_not_configured", "webhook_url given, no signing secret set.")
JobNotFound = _code(NotFound, "job_not_found", "No job with that id for this key.")
BatchNotFound = _code(NotFound, "batch_not_found", "No batch with that id for this key.")
NotOffered = _code(NotFound, "not_offered", "A route the API does not offer.")
JobAlreadyTerminal = _code(Conflict, "job_already_terminal", "The job is already finished; nothing to cancel.")
JobNotCompleted = _code(Conflict, "job_not_completed", "The job's video exists only once it is completed.")
BatchAlreadyFinished = _code(Conflict, "batch_already_finished", "The batch is already finished.")
BatchNotFinished = _code(Conflict, "batch_not_finished", "The batch's archive exists once it is finished.")
IdempotencyKeyInUse = _code(Conflict, "idempotency_key_in_use", "The first request with this key is still running.")
ArtifactExpired = _code(Gone, "artifact_expired", "The video expired and was removed.")
PreconditionFailed = _code(APIError, "precondition_failed", "If-Match did not match (412).")
RangeNotSatisfiable = _code(APIError, "range_not_satisfiable", "The byte range starts past the end (416).")
IdempotencyKeyReused = _code(Unprocessable, "idempotency_key_reused", "The key was used with another body.")
InvalidBatch = _code(Unprocessable, "invalid_batch", "Lines of a batch were refused; `details` names each.")
InvalidWebhookUrl = _code(Unprocessable, "invalid_webhook_url", "The webhook URL is not allowed.")
JsonTooComplex = _code(Unprocessable, "json_too_complex", "The body nests or holds more than the API parses.")
ExceedsWorkerCapacity = _code(Unprocessable, "exceeds_worker_capacity", "Larger than any live worker serves.")
NoCapableWorker = _code(Unprocessable, "no_capable_worker", "No live worker serves the task or precision.")
TooManyActiveJobs = _code(RateLimited, "too_many_active_jobs", "This key has too many queued or running jobs.")
QueueFull = _code(Unavailable, "queue_full", "The service's queue is full; retry after Retry-After.")
StorageUnavailable = _code(Unavailable, "storage_unavailable", "The job store is unavailable; retry.")
TooManyStreams = _code(Unavailable, "too_many_streams", "Every event-stream slot is taken; retry or poll.")

_BY_STATUS: dict[int, type[APIError]] = {cls.status: cls for cls in (
    BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, RequestTooLarge, Unprocessable, RateLimited,
    Unavailable)}
_BY_CODE: dict[str, type[APIError]] = {cls.code: cls for cls in (
    Unauthorized, Forbidden, RequestTooLarge, RateLimited, InvalidRequest, InvalidJson, InvalidCursor, InvalidLimit,
    UnsupportedParameter, UnsupportedSize, UnsupportedDuration, UnsupportedVariant, ModelNotFound,
    WebhooksNotConfigured, JobNotFound, BatchNotFound, NotOffered, JobAlreadyTerminal, JobNotCompleted,
    BatchAlreadyFinished, BatchNotFinished, IdempotencyKeyInUse, ArtifactExpired, PreconditionFailed,
    RangeNotSatisfiable, IdempotencyKeyReused, InvalidBatch, InvalidWebhookUrl, JsonTooComplex,
    ExceedsWorkerCapacity, NoCapableWorker, TooManyActiveJobs, QueueFull, StorageUnavailable, TooManyStreams)}


def api_error(status: int, body: object, retry_after: float | None = None) -> APIError:
    """The exception for an error answer: by its code, else by its status, else `APIError`; a body that is no
    error envelope (a proxy's HTML page) becomes code `http_<status>`."""
    error = body.get("error") if isinstance(body, dict) else None
    try:
        info = ErrorInfo.model_validate(error)
    except ValueError:
        info = ErrorInfo(code=f"http_{status}", message=f"the API answered HTTP {status}",
                         retryable=status in (429, 502, 503, 504))
    cls = _BY_CODE.get(info.code) or _BY_STATUS.get(status) or APIError
    exc = cls(status, info, retry_after)
    exc.status = status
    return exc


# --- jobs that ended without a video ------------------------------------------------------------------------------

class JobFailed(H3BatchError):
    """The job finished without a video: `job` (the record), `code` and `message` from its `error`."""

    code = ""

    def __init__(self, job: Job):
        error = job.error
        self.job = job
        self.code = error.code if error else job.status.value
        self.message = error.message if error else (job.cancel_reason or job.status.value)
        self.stage = (error.stage if error else None) or job.stage
        super().__init__(f"job {job.id} {job.status.value}: {self.code}: {self.message}")


def _job_code(code: str, doc: str) -> type[JobFailed]:
    return type("Job" + "".join(part.title() for part in code.split("_")), (JobFailed,),
                {"code": code, "__doc__": doc, "__module__": __name__})


JobCancelled = _job_code("cancelled", "The job was cancelled (by its owner, a batch cancel or a delete).")
JobExpired = _job_code("expired", "The job's record or video expired before it was read.")
JobRenderError = _job_code("render_error", "The render raised; `stage` names where.")
JobOutOfMemory = _job_code("out_of_memory", "Host or GPU memory ran out; the message names the stage and size.")
JobTimeout = _job_code("timeout", "The job ran past its timeout_s (or the operator's cap).")
JobWorkerLost = _job_code("worker_lost", "Every attempt's worker died.")
JobReleaseMismatch = _job_code("release_mismatch", "The job asked for a release no worker serves.")
JobExceedsWorkerCapacity = _job_code("exceeds_worker_capacity", "No live worker serves the size any more.")

_JOB_BY_CODE: dict[str, type[JobFailed]] = {cls.code: cls for cls in (
    JobCancelled, JobExpired, JobRenderError, JobOutOfMemory, JobTimeout, JobWorkerLost, JobReleaseMismatch,
    JobExceedsWorkerCapacity)}


def job_failed(job: Job) -> JobFailed:
    """The exception for a job that finished without a video, by its error code (cancelled and expired jobs by
    their status); an unknown code is a plain `JobFailed`."""
    code = job.error.code if job.error else job.status.value
    if job.status.value in ("cancelled", "expired"):
        code = job.status.value
    return _JOB_BY_CODE.get(code, JobFailed)(job)

__all__ = sorted(name for name, value in globals().items()
                 if isinstance(value, type) and issubclass(value, H3BatchError))
