"""The job service under both job APIs (/jobs and the OpenAI-compatible /v1/videos): read a caller's job (with lazy
expiry), create one (idempotent, then enqueue), page through them, cancel, delete, and find a finished job's MP4.

Flask-free (no app or request context): functions over Redis and h3batch.core, given a `Caller` (who asks, the
app's storage and limits) and the calling API's `Vocabulary`. They raise `ApiError` with the codes each API has
always answered; the vocabulary holds the codes and wording that differ (/jobs says `job_not_found`, /v1/videos
`video_not_found`). The views only translate wire formats around these calls; api/job_http.py builds the `Caller`.
"""
from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from pydantic import ValidationError

from h3batch.api import idempotency
from h3batch.api.errors import ApiError
from h3batch.api.schemas import LORA_CODES, CreateJob, first_error
from h3batch.core import batches, capacity, defaults, keys, lanes, loras, routing
from h3batch.core import jobs as store
from h3batch.core.artifact_store import ArtifactStore, LocalStore, StoredObject, StoreUnavailable
from h3batch.core.jobs import FINISHED, BadCursor, JobSpec, JobStatus

log = logging.getLogger("h3batch.api")

NO_RETRY = {"x-should-retry": "false"}
"""On final 409s: the OpenAI SDK retries every 409 unless told not to."""
ACTIVE = frozenset({JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value})
_FINISHED = frozenset(s.value for s in FINISHED)


_ERROR_CODES = {"extra_forbidden": "unsupported_parameter", "unsupported_size": "unsupported_size",
                "unsupported_duration": "unsupported_duration", "invalid_webhook_events": "invalid_webhook_events",
                **{code: code for code in LORA_CODES}}
_OWN_MESSAGES = ("unsupported_size", "unsupported_duration", "empty_prompt", "prompt_too_long", "invalid_text",
                 "bool_refused", "invalid_lora", "invalid_webhook_events", *LORA_CODES)
"""Validation errors whose message already names the field."""
_NAMED = re.compile(r"^([a-z_]+)[:\[.]")  # "prompt: ...", "loras[0].ref: ..."


class FieldError(ApiError):
    """A refused create request, with the field it names (`body` when none): POST /batches reports it per line."""

    def __init__(self, status: int, code: str, message: str, field: str):
        super().__init__(status, code, message)
        self.field = field


def validate_create(body: dict, *, max_prompt_chars: int, canvas: str | None,
                    lora_policy: loras.LoraPolicy | None = None) -> CreateJob:
    """A create body as CreateJob, by the request contract (core/geometry.py, core/request_rules.py, core/loras.py
    against `lora_policy` through api/schemas.py). FieldError 400 naming the first bad field (unsupported_parameter
    for unknown ones; the core/loras.py codes for a refused `loras`); 422 invalid_webhook_events for a
    `webhook_events` naming no event the service sends, or given without a webhook_url."""
    try:
        return CreateJob.model_validate(body, context={"max_prompt_chars": max_prompt_chars, "canvas": canvas,
                                                       "loras": lora_policy})
    except ValidationError as exc:
        kind, where, message = first_error(exc)
        if kind == "extra_forbidden":
            accepted = [*CreateJob.model_fields, "first_frame", "last_frame", "references"]  # images: api/job_inputs
            message = f"{where}: unknown field (accepted: {', '.join(accepted)})"  # never drifts from the model
        elif kind not in _OWN_MESSAGES:
            message = f"{where}: {message}"
        named = _NAMED.match(message)
        field = where if where != "body" else (named.group(1) if named else "body")
        status = 422 if kind == "invalid_webhook_events" else 400
        raise FieldError(status, _ERROR_CODES.get(kind, "invalid_request"), message, field) from None


@dataclass(frozen=True)
class Vocabulary:
    """What one API calls a job in its errors; `{id}`, `{at}` and `{status}` are filled in."""

    api: str
    """JobSpec.api of the jobs it creates: "jobs" or "openai"."""
    noun: str
    not_found: str
    not_completed: str
    not_completed_message: str
    expired_message: str
    gone_message: str
    not_completed_retryable: bool
    """Whether 409 not-completed is retryable while the job is still queued or running."""


@dataclass(frozen=True)
class Caller:
    """One request's reach into the job store: the caller's owner id, the app's Redis, artifact root and limits,
    and how to send a render message and vet a webhook URL."""

    r: redis.Redis
    owner: str
    artifacts_dir: Path
    max_queued: int
    result_ttl_s: int
    send_render: Callable[[str], None]
    vet_webhook_url: Callable[[str], object]
    request_id: str | None = None
    max_active_per_key: int = 0
    """H3BATCH_MAX_ACTIVE_PER_KEY; applies only to a keyed caller (an open API has no key to count by)."""
    creates_per_min: int = 0
    """The `creates` bucket's quota (0: off); a batch spends one token per item when it is admitted."""
    store: ArtifactStore | None = None
    """Where finished MP4s live (H3BATCH_ARTIFACT_STORE); None: the local `artifacts_dir`."""
    default_precision: str = routing.DEFAULT_PRECISION
    """The precision of a job that asks for none (H3BATCH_DEFAULT_PRECISION)."""
    lora_policy: loras.LoraPolicy | None = None
    """The per-job LoRA allow-list and limit (H3BATCH_LORA_ALLOW, H3BATCH_MAX_LORAS); None: no adapter allowed."""
    max_job_timeout_s: int = 0
    """The largest `timeout_s` a job may ask for (H3BATCH_MAX_JOB_TIMEOUT_S; 0: no cap)."""

    @property
    def artifacts(self) -> ArtifactStore:
        return self.store if self.store is not None else LocalStore(self.artifacts_dir)


def get_owned_job(caller: Caller, job_id: str, words: Vocabulary) -> dict[str, Any]:
    """The caller's job record, expired first if due. 404 `words.not_found` when absent or another key's."""
    record = store.load_job(caller.r, job_id)
    if record is None or (record.get("owner") or "") != caller.owner:
        raise ApiError(404, words.not_found, f"no {words.noun} with id {job_id!r}")
    return expire_if_due(caller, record)


def expire_if_due(caller: Caller, record: dict[str, Any]) -> dict[str, Any]:
    """A completed job past its expires_at becomes `expired` and its files go (lazily, on first read)."""
    if record["status"] == JobStatus.COMPLETED.value and (record.get("expires_at") or float("inf")) < time.time():
        expired = store.transition(caller.r, record["id"], JobStatus.EXPIRED, expect={JobStatus.COMPLETED},
                                   fields={"artifact": None}, record_ttl_s=defaults.RECORD_GRACE_S)
        _remove_artifacts(caller, record["id"])
        return expired or record
    return record


UNREAD = object()
"""`fleet` not read yet: read it from Redis (a view that checked a request early passes the fleet it read)."""


def create_job(caller: Caller, req: CreateJob, words: Vocabulary, idempotency_key: str | None,
               fingerprint: str, images: list | None = None,
               fleet: capacity.Fleet | None | object = UNREAD) -> tuple[dict[str, Any], bool]:
    """Queue a render; returns (record, replayed). With an Idempotency-Key, a retry of a create that already made
    its job replays it; one whose job is gone (deleted, expired) creates afresh (api/idempotency.py); 409/422 from
    idempotency.claim. `fleet`: what capacity.fleet gave the view's early check, so it is read once a request."""
    held = None
    while idempotency_key is not None:
        held = idempotency.claim(caller.r, caller.owner, idempotency_key, fingerprint,
                                 exists=lambda job_id: caller.r.exists(keys.job(job_id)) > 0)
        if held.job_id is None:
            break
        record = store.load_job(caller.r, held.job_id)
        if record is not None:
            return record, True
        # deleted between the claim's look and this read: claim again, which now takes the key over
    try:
        record = _create_and_enqueue(caller, req, words.api, images or [], fleet)
    except BaseException:
        if held is not None:
            idempotency.release(caller.r, held)
        raise
    if held is not None:
        idempotency.record_job(caller.r, held, record["id"])
    return record, False


def check_timeout(caller: Caller, req: CreateJob) -> None:
    """FieldError 400 invalid_request when `timeout_s` is over the operator's cap (H3BATCH_MAX_JOB_TIMEOUT_S)."""
    if req.timeout_s is not None and caller.max_job_timeout_s and req.timeout_s > caller.max_job_timeout_s:
        raise FieldError(400, "invalid_request", f"timeout_s: at most {caller.max_job_timeout_s} s "
                         f"(H3BATCH_MAX_JOB_TIMEOUT_S), found {req.timeout_s:g}", "timeout_s")


def _create_and_enqueue(caller: Caller, req: CreateJob, api: str, images: list,
                        fleet: capacity.Fleet | None | object = UNREAD) -> dict[str, Any]:
    """Write the queued record, then send its message; a refused message fails the job (never left queued).
    `images` (api/job_inputs.py, already checked) are stored under the job's id before its record exists, and
    removed again when the record is refused. 422 exceeds_worker_capacity / no_capable_worker, 400/422 webhook_url
    refused, 429 too_many_active_jobs, 503 queue_full or storage_unavailable."""
    check_timeout(caller, req)
    fleet = capacity.fleet(caller.r) if fleet is UNREAD else fleet
    need = need_of(req, caller.default_precision, fleet)
    check_capacity(fleet, need)  # before anything is written
    check_lora_base(fleet, req)
    if req.webhook_url is not None:
        caller.vet_webhook_url(req.webhook_url)  # before anything is written
    job_id, inputs = store.new_job_id(), None
    if images:
        from h3batch.api.job_inputs import store_inputs

        try:
            inputs = store_inputs(caller.artifacts, caller.artifacts_dir, job_id, images)
        except StoreUnavailable as exc:
            raise ApiError(503, "storage_unavailable", f"the artifact store is unavailable ({exc}); retry later",
                           True, {"Retry-After": "5"}) from None
    spec = JobSpec(prompt=req.prompt, seconds=need.seconds, width=req.width, height=req.height,
                   seed=store.random_seed() if req.seed is None else req.seed, release=req.release,
                   owner=caller.owner, webhook_url=req.webhook_url, webhook_events=tuple(req.webhook_events or ()),
                   api=api, task=need.task,
                   precision=need.precision, job_id=job_id, inputs=inputs, loras=tuple(req.lora_records),
                   timeout_s=req.timeout_s, priority=req.priority or lanes.Priority.INTERACTIVE.value)
    try:  # caps and write in one step
        record = store.create_job(caller.r, spec, max_queued=caller.max_queued,
                                  max_active_per_key=caller.max_active_per_key if caller.owner else 0)
    except store.QueueFull:
        _drop_inputs(caller, job_id, inputs)
        raise queue_full(caller) from None
    except store.TooManyActive:
        _drop_inputs(caller, job_id, inputs)
        raise too_many_active(caller, 1) from None
    except BaseException:
        _drop_inputs(caller, job_id, inputs)
        raise
    if spec.priority == lanes.Priority.BATCH.value:
        _feed(caller)  # held like a batch item (core/lanes.py): released into idle capacity, or when overdue
        log.info("job created seconds=%s size=%dx%d seed=%d lane=batch", spec.seconds, spec.width, spec.height,
                 spec.seed, extra={"job_id": record["id"], "request_id": caller.request_id})
        return store.load_job(caller.r, record["id"]) or record
    try:
        caller.send_render(record["id"])
    except Exception as exc:  # noqa: BLE001  # broker refused the message: the job must not sit queued forever
        store.transition(caller.r, record["id"], JobStatus.FAILED, expect={JobStatus.QUEUED},
                         fields={"error": {"code": "enqueue_failed", "message": "the job could not be queued",
                                           "retryable": True, "stage": "queued"}},
                         record_ttl_s=caller.result_ttl_s)
        log.error("enqueue failed error=%s", type(exc).__name__, extra={"job_id": record["id"]})
        raise ApiError(503, "storage_unavailable", "the job queue is unavailable; retry later", True,
                       {"Retry-After": "5"}) from None
    log.info("job created seconds=%s size=%dx%d seed=%d", spec.seconds, spec.width, spec.height, spec.seed,
             extra={"job_id": record["id"], "request_id": caller.request_id})
    return record


def _feed(caller: Caller) -> None:
    """Release held batch-lane work into idle workers now. A failure only delays it: a released job without a
    message is re-sent by the reaper, a held one waits for the workers' feed (each job's end, each heartbeat)."""
    try:
        batches.feed(caller.r, caller.send_render)
    except Exception as exc:  # noqa: BLE001  # the job is written and held: never a 5xx for what the workers redo
        log.warning("batch feed after create failed error=%s", type(exc).__name__)


def _drop_inputs(caller: Caller, job_id: str, inputs: dict | None) -> None:
    """A refused create leaves nothing stored: remove the images written under its id."""
    if inputs:
        caller.artifacts.delete_job(job_id)


def queue_full(caller: Caller, asked: int = 1) -> ApiError:
    """503 queue_full: `asked` more jobs would pass H3BATCH_MAX_QUEUED (batch items count one each)."""
    what = "this job" if asked == 1 else f"these {asked} jobs"
    return ApiError(503, "queue_full", f"the queue is full: {what} would pass the {caller.max_queued} queued jobs "
                                       f"it holds (H3BATCH_MAX_QUEUED, batch items included); retry later", True,
                    {"Retry-After": str(defaults.QUEUE_FULL_RETRY_AFTER_S)})


def too_many_active(caller: Caller, asked: int) -> ApiError:
    """429 too_many_active_jobs: `asked` more jobs would pass the key's H3BATCH_MAX_ACTIVE_PER_KEY."""
    what = "this job" if asked == 1 else f"these {asked} jobs"
    return ApiError(429, "too_many_active_jobs", f"{what} would pass the {caller.max_active_per_key} queued or "
                                                 f"running jobs one API key may have (H3BATCH_MAX_ACTIVE_PER_KEY, "
                                                 f"batch items included); retry once some have finished", True,
                    {"Retry-After": str(defaults.QUEUE_FULL_RETRY_AFTER_S)})


def need_of(req: CreateJob, default_precision: str, fleet: capacity.Fleet | None = None) -> routing.Need:
    """What a validated request needs from a worker: its task, its precision (the operator's default when it asks
    for none), its duration and its rows. A request that names no `seconds` gets the default, raised to the
    shortest clip the fleet's workers for its task render (5 s when they all run the native release): the job is
    created with `need.seconds`."""
    seconds = float(req.seconds)
    if "seconds" not in req.model_fields_set and fleet is not None:
        seconds = max(seconds, routing.shortest_served(req.task, fleet.capabilities,
                                                       req.precision or default_precision))
    return routing.Need.of(req.width, req.height, seconds, task=req.task, precision=req.precision or default_precision)


def check_capacity(fleet: capacity.Fleet | None, need: routing.Need) -> None:
    """422 when no worker serves `need` (core/capacity.py: the live workers' capabilities; with none live, the last
    ones known): exceeds_worker_capacity (too large for every worker of its task and precision) or
    no_capable_worker (task or precision not served). Nothing known: only the release's own task is accepted."""
    refused = over_capacity(fleet, need)
    if refused is not None:
        raise ApiError(422, refused.code, refused.message, False)


def lora_base_refusal(fleet: capacity.Fleet | None, req: CreateJob) -> str | None:
    """Why a job with `loras` cannot be served by `fleet` (no worker of a release kind that takes adapters; with
    nothing known, the release's own kind, V2), else None."""
    if not req.lora_records:
        return None
    # Nothing known: the release of a worker that advertises no kind, FastH3 V2.
    kinds = [cap.release_kind for cap in fleet.capabilities] if fleet is not None else ["v2"]
    return loras.base_refusal(kinds)


def check_lora_base(fleet: capacity.Fleet | None, req: CreateJob) -> None:
    """422 lora_base_mismatch when the fleet's releases take no adapters (core/loras.base_refusal)."""
    why = lora_base_refusal(fleet, req)
    if why is not None:
        raise ApiError(422, loras.BASE_MISMATCH, f"loras: {why}", False)


def over_capacity(fleet: capacity.Fleet | None, need: routing.Need) -> routing.Refusal | None:
    """Why no worker of `fleet` serves `need`, else None."""
    if fleet is None:
        if need.task != routing.DEFAULT_TASK:
            return routing.Refusal("no_capable_worker", (
                f"task {need.task!r}: no worker is known to serve it (no worker has been seen within "
                f"{defaults.CAPACITY_MEMORY_S} s; a worker of the release serves {routing.DEFAULT_TASK!r})"), "task")
        return None
    return fleet.refusal(need)


def page_limit(text: str, *, digits_only: bool = False) -> int:
    """A list's `limit`, 1..LIST_MAX_LIMIT. /v1/videos takes plain ASCII digits only; /jobs whatever int() reads."""
    try:
        limit = int(text) if (text.isascii() and text.isdigit()) or not digits_only else -1
    except ValueError:
        limit = -1
    if not 1 <= limit <= defaults.LIST_MAX_LIMIT:
        raise ApiError(400, "invalid_request", f"limit: expected an integer 1..{defaults.LIST_MAX_LIMIT}, "
                                               f"found {text[:40]!r}")
    return limit


def list_page(caller: Caller, words: Vocabulary, render: Callable[[dict[str, Any], int | None], dict[str, Any]], *,
              limit: int, after: str | None, order: str, status: str | None = None) -> dict[str, Any]:
    """One page of the caller's jobs, each shown by `render(record, queue_position)`, as
    {object: "list", data, first_id, last_id, has_more}. 400 invalid_request (order, status), invalid_cursor."""
    if order not in ("asc", "desc"):
        raise ApiError(400, "invalid_request", f"order: expected 'asc' or 'desc', found {order!r}")
    try:
        status_filter = JobStatus(status) if status is not None else None
    except ValueError:
        raise ApiError(400, "invalid_request", f"status: expected one of {[s.value for s in JobStatus]}, "
                                               f"found {status!r}") from None
    if after is not None:
        cursor = store.load_job(caller.r, after)
        if cursor is None or (cursor.get("owner") or "") != caller.owner:
            raise ApiError(400, "invalid_cursor", f"after: expected the id of one of your {words.noun}s, "
                                                  f"found {after!r}")
    try:
        records, has_more = store.list_jobs(caller.r, limit=limit, after=after, order=order, status=status_filter,
                                            owner=caller.owner)
    except BadCursor as exc:
        raise ApiError(400, "invalid_cursor", str(exc)) from None
    data = [render(record, store.queue_position(caller.r, record["id"])) for record in records]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def cancel(caller: Caller, job_id: str, words: Vocabulary) -> dict[str, Any]:
    """Queued → cancelled now; running → stops at the next step boundary. 404; 409 job_already_terminal."""
    record = get_owned_job(caller, job_id, words)
    if record["status"] in _FINISHED:
        raise ApiError(409, "job_already_terminal", f"{words.noun} {job_id} is already {record['status']}", False,
                       NO_RETRY)
    updated = store.request_cancel(caller.r, job_id, record_ttl_s=caller.result_ttl_s)
    if updated is None:
        raise ApiError(404, words.not_found, f"no {words.noun} with id {job_id!r}")
    log.info("cancel requested status=%s", updated["status"], extra={"job_id": job_id})
    return updated


def delete(caller: Caller, job_id: str, words: Vocabulary) -> None:
    """Abort if active, then remove the record and its files. 404."""
    get_owned_job(caller, job_id, words)
    store.delete_job(caller.r, job_id)  # a running worker sees the record gone at its next step and stops
    _remove_artifacts(caller, job_id)
    log.info("%s deleted", words.noun, extra={"job_id": job_id})


def _completed_record(caller: Caller, job_id: str, words: Vocabulary) -> dict[str, Any]:
    record = get_owned_job(caller, job_id, words)
    status = record["status"]
    if status == JobStatus.EXPIRED.value:
        raise ApiError(410, "artifact_expired", words.expired_message.format(id=job_id, at=record.get("expires_at")))
    if status != JobStatus.COMPLETED.value:
        raise ApiError(409, words.not_completed, words.not_completed_message.format(id=job_id, status=status),
                       words.not_completed_retryable and status in ACTIVE, NO_RETRY)
    return record


def content_object(caller: Caller, job_id: str, words: Vocabulary) -> tuple[dict[str, Any], StoredObject]:
    """(record, stored MP4) of the caller's completed job in whichever store holds it: the object's key, size and
    ETag, read through `caller.artifacts` (`local_path`, `reader`, `iter_bytes`, `presigned_url`). 404; 409
    `words.not_completed`; 410 artifact_expired (also when the object is gone); 503 when the store is down."""
    if caller.artifacts.kind == "local":
        record, path = content_path(caller, job_id, words)
        return record, LocalStore._stat(path.relative_to(caller.artifacts_dir.resolve()).as_posix(), path)
    record = _completed_record(caller, job_id, words)
    found = caller.artifacts.head(record.get("artifact") or "") if record.get("artifact") else None
    if found is None:
        raise ApiError(410, "artifact_expired", words.gone_message.format(id=job_id))
    return record, found


def content_path(caller: Caller, job_id: str, words: Vocabulary) -> tuple[dict[str, Any], Path]:
    """(record, MP4 path) of the caller's completed job in the local store. 404; 409 `words.not_completed`; 410
    artifact_expired."""
    record = _completed_record(caller, job_id, words)
    root = caller.artifacts_dir.resolve()
    path = (root / (record.get("artifact") or "")).resolve()
    if root not in path.parents or not path.is_file():
        raise ApiError(410, "artifact_expired", words.gone_message.format(id=job_id))
    return record, path


def _remove_artifacts(caller: Caller, job_id: str) -> None:
    shutil.rmtree(caller.artifacts_dir / job_id, ignore_errors=True)
    if caller.artifacts.kind != "local":
        try:
            caller.artifacts.delete_job(job_id)
        except StoreUnavailable as exc:  # the record is gone already: the reaper's garbage pass removes them later
            log.warning("could not remove the job's objects: %s", exc, extra={"job_id": job_id})
