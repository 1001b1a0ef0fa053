"""Typed models of what the h3batch API answers: jobs, their events, batches, batch results, pages and the error
envelope. Pydantic validates each answer once at the door, so a caller reads `job.status`, not `job["status"]`.

These are the client's copies of the wire format (docs/service.md, docs/api.md), not imports of the server's
`api/schemas.py`: the client room never imports Flask or Redis. Every model allows extra fields, so a server that
adds one never breaks an older client; fields the server may leave out default to None.
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class JobStatus(str, Enum):
    """A job's status (the server's `JobStatus`)."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED})
"""Statuses after which a job never changes."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ErrorInfo(_Wire):
    """The `error` object of a refused request or a failed job: a stable `code`, a message, whether a retry may
    succeed; a refused batch lists its bad lines in `details` (`line`, `field`, `message`)."""

    code: str
    message: str = ""
    retryable: bool = False
    request_id: str | None = None
    details: list[dict[str, Any]] | None = None
    stage: str | None = None


class Job(_Wire):
    """One render job (GET /jobs/{id})."""

    id: str
    status: JobStatus
    stage: str | None = None
    progress: float = 0.0
    step: int = 0
    total_steps: int | None = None
    queue_position: int | None = None
    prompt: str = ""
    seconds: float | None = None
    width: int | None = None
    height: int | None = None
    seed: int | None = None
    task: str | None = None
    precision: str | None = None
    priority: str | None = None
    release_id: str | None = None
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    frames: int | None = None
    size_bytes: int | None = None
    attempt: int = 0
    cancel_reason: str | None = None
    timeout_s: float | None = None
    error: ErrorInfo | None = None
    metadata: dict[str, Any] | None = None
    webhook_url: str | None = None
    webhook_events: list[str] | None = None

    @property
    def finished(self) -> bool:
        """True once the job can no longer change (completed, failed, cancelled or expired)."""
        return self.status in FINISHED


class UsageJobs(_Wire):
    """Jobs counted by the status they ended in (each job once, however many attempts it took)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    total: int = 0


class UsageDay(_Wire):
    """One UTC day's usage."""

    date: str
    jobs: UsageJobs = Field(default_factory=UsageJobs)
    video_seconds: float = 0.0
    gpu_seconds: float = 0.0


class Usage(_Wire):
    """Your key's usage over the UTC days `from_`..`to` (GET /usage): jobs by final status, seconds of video of the
    completed ones, and their render time on the workers (`gpu_seconds`); `days` lists the days with any usage."""

    from_: str = Field(alias="from")
    to: str
    jobs: UsageJobs = Field(default_factory=UsageJobs)
    video_seconds: float = 0.0
    gpu_seconds: float = 0.0
    days: list[UsageDay] = Field(default_factory=list)


class JobEvent(_Wire):
    """One server-sent event of GET /jobs/{id}/events: its name (`status`, `stage`, `progress`, `completed`,
    `failed`, `cancelled`), the stream id to resume after, and the JSON data."""

    event: str
    id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class JobPage(_Wire):
    """One page of GET /jobs (newest first unless `order="asc"`); pass `last_id` as `after` for the next one."""

    data: list[Job]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchCounts(_Wire):
    """Items of a batch by status."""

    total: int = 0
    queued: int = 0
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def finished(self) -> int:
        """Items that can no longer change."""
        return self.completed + self.failed + self.cancelled + self.expired


class Batch(_Wire):
    """A batch (GET /batches/{id})."""

    id: str
    status: str
    counts: BatchCounts = Field(default_factory=BatchCounts)
    progress: float = 0.0
    eta_s: float | None = None
    created_at: float | None = None
    finished_at: float | None = None
    metadata: dict[str, Any] | None = None
    skipped: list[Any] = Field(default_factory=list)
    results_url: str | None = None
    archive_url: str | None = None

    @property
    def finished(self) -> bool:
        """True once every item is finished (the batch is completed or cancelled)."""
        return self.status in BATCH_FINISHED


BATCH_FINISHED = frozenset({"completed", "cancelled", "failed", "expired"})
"""Batch statuses after which nothing changes (the contract has completed and cancelled; the others are tolerated)."""


class BatchPage(_Wire):
    """One page of GET /batches."""

    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchResult(_Wire):
    """One line of GET /batches/{id}/results, in input order."""

    index: int
    custom_id: str | None = None
    job_id: str | None = None
    status: str
    error: ErrorInfo | None = None
    content_url: str | None = None
