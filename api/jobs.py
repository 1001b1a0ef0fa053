"""The /jobs resource: create, read (optionally blocking), list, cancel, delete, and download the MP4."""
from __future__ import annotations

import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request, send_file, stream_with_context
from pydantic import ValidationError

from h3batch.api import idempotency
from h3batch.api.enqueue import enqueue_render
from h3batch.api.errors import ApiError
from h3batch.api.redis_client import get_redis
from h3batch.api.schemas import CreateJob, job_view
from h3batch.api.wait import wait_for_finish
from h3batch.api.webhook_check import vet_webhook_url
from h3batch.core import defaults, keys
from h3batch.core.jobs import (
    FINISHED,
    TERMINAL_EVENTS,
    BadCursor,
    JobSpec,
    JobStatus,
    create_job,
    delete_job,
    list_jobs,
    load_job,
    queue_position,
    queued_count,
    random_seed,
    request_cancel,
    transition,
)

log = logging.getLogger("h3batch.api")
bp = Blueprint("jobs", __name__)

# Final 409s must not be retried by the OpenAI SDK (it retries every 409 unless told otherwise).
_NO_RETRY = {"x-should-retry": "false"}
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+)", re.IGNORECASE)
_EVENT_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
KEEPALIVE_S = float(os.environ.get("H3BATCH_SSE_KEEPALIVE_S", "") or 15.0)
"""An SSE comment line at least this often keeps proxies from closing an idle event stream."""
_EVENT_BLOCK_MS = 2000  # one XREAD BLOCK; below the Redis client's 5 s socket timeout


def _error_code(exc: ValidationError) -> tuple[str, str]:
    """(code, message) of the first validation error, naming the field."""
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    kind = first["type"]
    code = {"extra_forbidden": "unsupported_parameter", "unsupported_size": "unsupported_size",
            "unsupported_duration": "unsupported_duration"}.get(kind, "invalid_request")
    message = first["msg"] if kind in ("unsupported_size", "unsupported_duration", "empty_prompt",
                                       "prompt_too_long", "invalid_text") else f"{where}: {first['msg']}"
    if kind == "extra_forbidden":
        message = f"{where}: unknown field (accepted: prompt, seconds, width, height, seed, release, webhook_url)"
    return code, message


def _requested_wait() -> float:
    """Seconds of blocking wait asked for with `?wait=N` or `Prefer: wait=N` (0 when none), capped."""
    raw = request.args.get("wait")
    if raw is None:
        match = _PREFER_WAIT.search(request.headers.get("Prefer", ""))
        raw = match.group(1) if match else "0"
    try:
        seconds = float(raw)
    except ValueError:
        raise ApiError(400, "invalid_request", f"wait: expected seconds 0..{defaults.MAX_WAIT_S}, found {raw!r}")
    if not 0 <= seconds <= defaults.MAX_WAIT_S:
        raise ApiError(400, "invalid_request", f"wait: expected seconds 0..{defaults.MAX_WAIT_S}, found {raw!r}")
    return seconds


def _get_owned(job_id: str) -> dict[str, Any]:
    """The caller's job record. Raises 404 job_not_found when absent or owned by another key."""
    g.job_id = job_id
    record = load_job(get_redis(), job_id)
    if record is None or (record.get("owner") or "") != g.owner:
        raise ApiError(404, "job_not_found", f"no job with id {job_id!r}")
    return _expire_if_due(record)


def _expire_if_due(record: dict[str, Any]) -> dict[str, Any]:
    """A completed job past its expires_at becomes `expired` and its files go (lazily, on first read)."""
    if record["status"] == JobStatus.COMPLETED.value and (record.get("expires_at") or float("inf")) < time.time():
        expired = transition(get_redis(), record["id"], JobStatus.EXPIRED, expect={JobStatus.COMPLETED},
                             fields={"artifact": None}, record_ttl_s=defaults.RECORD_GRACE_S)
        _remove_artifacts(record["id"])
        return expired or record
    return record


def _job_dir(job_id: str) -> Path:
    return Path(current_app.config["ARTIFACTS_DIR"]) / job_id


def _remove_artifacts(job_id: str) -> None:
    shutil.rmtree(_job_dir(job_id), ignore_errors=True)


def _respond(record: dict[str, Any], status: int):
    response = jsonify(job_view(record, queue_position(get_redis(), record["id"])))
    response.status_code = status
    if record["status"] in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value):
        response.headers["openai-poll-after-ms"] = "500"
    return response


@bp.post("/jobs")
def create():
    """Queue a render. 400 invalid body, 413 over 64 KiB, 409/422 Idempotency-Key in use/reused, 503 queue_full or
    storage_unavailable."""
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "expected a JSON object body, e.g. {\"prompt\": \"rain on a tin roof\"}")
    try:
        req = CreateJob.model_validate(body, context={"max_prompt_chars": current_app.config["MAX_PROMPT_CHARS"]})
    except ValidationError as exc:
        code, message = _error_code(exc)
        raise ApiError(400, code, message) from None
    wait_s = _requested_wait()
    r = get_redis()
    idem_key = idempotency.parse_key(request.headers.get("Idempotency-Key"))
    held = None
    if idem_key is not None:
        held = idempotency.claim(r, g.owner, idem_key, idempotency.fingerprint(req.model_dump(mode="json")))
        if held.job_id is not None:  # a retry of a create that already made its job
            record = load_job(r, held.job_id)
            if record is None:
                raise ApiError(404, "job_not_found", f"the job {held.job_id} this Idempotency-Key created is gone")
            response = _respond(record, 202)
            response.headers["Location"] = f"/jobs/{record['id']}"
            response.headers["Idempotent-Replayed"] = "true"
            return response
    try:
        record = _create_and_enqueue(r, req)
    except BaseException:
        if held is not None:
            idempotency.release(r, held)
        raise
    if held is not None:
        idempotency.record_job(r, held, record["id"])
    if wait_s > 0:
        record = wait_for_finish(r, record["id"], wait_s) or record
    response = _respond(record, 200 if record["status"] in {s.value for s in FINISHED} else 202)
    response.headers["Location"] = f"/jobs/{record['id']}"
    return response


def _create_and_enqueue(r, req: CreateJob, api: str = "jobs") -> dict[str, Any]:
    """Write the queued record, then send its message; a refused message fails the job (never left queued).
    `api` names the view creating it ("openai" for /v1/videos)."""
    if req.webhook_url is not None:
        vet_webhook_url(req.webhook_url)  # 400/422 before anything is written
    if queued_count(r) >= current_app.config["MAX_QUEUED"]:
        raise ApiError(503, "queue_full", f"{current_app.config['MAX_QUEUED']} jobs are queued; retry later", True,
                       {"Retry-After": str(defaults.QUEUE_FULL_RETRY_AFTER_S)})
    spec = JobSpec(prompt=req.prompt, seconds=float(req.seconds), width=req.width, height=req.height,
                   seed=random_seed() if req.seed is None else req.seed, release=req.release, owner=g.owner,
                   webhook_url=req.webhook_url, api=api)
    record = create_job(r, spec)
    g.job_id = record["id"]
    try:
        enqueue_render(record["id"])
    except Exception as exc:  # broker refused the message: the job must not sit queued forever
        transition(r, record["id"], JobStatus.FAILED, expect={JobStatus.QUEUED},
                   fields={"error": {"code": "enqueue_failed", "message": "the job could not be queued",
                                     "retryable": True, "stage": "queued"}},
                   record_ttl_s=current_app.config["RESULT_TTL_S"])
        log.error("enqueue failed error=%s", type(exc).__name__, extra={"job_id": record["id"]})
        raise ApiError(503, "storage_unavailable", "the job queue is unavailable; retry later", True,
                       {"Retry-After": "5"}) from None
    log.info("job created seconds=%s size=%dx%d seed=%d", spec.seconds, spec.width, spec.height, spec.seed,
             extra={"job_id": record["id"], "request_id": g.get("request_id")})
    return record


@bp.get("/jobs/<job_id>")
def get(job_id: str):
    """One job; `?wait=N` / `Prefer: wait=N` blocks up to N s for it to finish. 404 job_not_found."""
    record = _get_owned(job_id)
    wait_s = _requested_wait()
    if wait_s > 0 and record["status"] not in {s.value for s in FINISHED}:
        record = wait_for_finish(get_redis(), job_id, wait_s)
        if record is None:
            raise ApiError(404, "job_not_found", f"no job with id {job_id!r}")
        record = _expire_if_due(record)
    return _respond(record, 200)


@bp.get("/jobs")
def index():
    """Jobs newest first (`order=asc` for oldest), cursor `after=<id>`, `limit` 1..100, `status` filter."""
    try:
        limit = int(request.args.get("limit", defaults.LIST_DEFAULT_LIMIT))
    except ValueError:
        limit = -1
    if not 1 <= limit <= defaults.LIST_MAX_LIMIT:
        raise ApiError(400, "invalid_request",
                       f"limit: expected an integer 1..{defaults.LIST_MAX_LIMIT}, found {request.args.get('limit')!r}")
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "invalid_request", f"order: expected 'asc' or 'desc', found {order!r}")
    status = request.args.get("status")
    try:
        status_filter = JobStatus(status) if status is not None else None
    except ValueError:
        raise ApiError(400, "invalid_request", f"status: expected one of {[s.value for s in JobStatus]}, "
                                               f"found {status!r}") from None
    r = get_redis()
    after = request.args.get("after")
    if after is not None:
        cursor = load_job(r, after)
        if cursor is None or (cursor.get("owner") or "") != g.owner:
            raise ApiError(400, "invalid_cursor", f"after: expected the id of one of your jobs, found {after!r}")
    try:
        records, has_more = list_jobs(r, limit=limit, after=after, order=order, status=status_filter, owner=g.owner)
    except BadCursor as exc:
        raise ApiError(400, "invalid_cursor", str(exc)) from None
    data = [job_view(rec, queue_position(r, rec["id"])) for rec in records]
    return jsonify({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None, "has_more": has_more})


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str):
    """Cancel: queued → cancelled now; running → stops at the next step boundary. 404; 409 job_already_terminal."""
    record = _get_owned(job_id)
    if record["status"] in {s.value for s in FINISHED}:
        raise ApiError(409, "job_already_terminal", f"job {job_id} is already {record['status']}", False, _NO_RETRY)
    updated = request_cancel(get_redis(), job_id, record_ttl_s=current_app.config["RESULT_TTL_S"])
    if updated is None:
        raise ApiError(404, "job_not_found", f"no job with id {job_id!r}")
    log.info("cancel requested status=%s", updated["status"], extra={"job_id": job_id})
    return _respond(updated, 202)


@bp.delete("/jobs/<job_id>")
def delete(job_id: str):
    """Abort if active, then remove the job and its files → 204. 404 job_not_found."""
    _get_owned(job_id)
    delete_job(get_redis(), job_id)  # a running worker sees the record gone at its next step and stops
    _remove_artifacts(job_id)
    log.info("job deleted", extra={"job_id": job_id})
    return "", 204


@bp.route("/jobs/<job_id>/content", methods=["GET", "HEAD"])
def content(job_id: str):
    """The MP4 (Range, ETag, If-None-Match, HEAD). 404; 409 job_not_completed; 410 artifact_expired."""
    record = _get_owned(job_id)
    if record["status"] == JobStatus.EXPIRED.value:
        raise ApiError(410, "artifact_expired", f"job {job_id}'s video expired at {record.get('expires_at')}")
    if record["status"] != JobStatus.COMPLETED.value:
        raise ApiError(409, "job_not_completed", f"job {job_id} is {record['status']}; its video exists only once "
                                                 f"it is completed", record["status"] in ("queued", "in_progress"),
                       _NO_RETRY)
    root = Path(current_app.config["ARTIFACTS_DIR"]).resolve()
    path = (root / (record.get("artifact") or "")).resolve()
    if root not in path.parents or not path.is_file():
        raise ApiError(410, "artifact_expired", f"job {job_id}'s video is no longer stored")
    response = send_file(path, mimetype="video/mp4", conditional=True, etag=record.get("sha256") or True,
                         download_name=f"{job_id}.mp4")
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["Cache-Control"] = "private, max-age=3600"  # per-key content: never in shared caches
    return response


@bp.get("/jobs/<job_id>/events")
def events(job_id: str):
    """Server-sent events: status, stage, progress, then completed/failed/cancelled, after which the stream ends.

    `Last-Event-ID: <id>` replays everything after that event (ids are the Redis stream's). 400 invalid_request
    for a malformed id; 404 job_not_found.
    """
    _get_owned(job_id)
    last_id = request.headers.get("Last-Event-ID", "").strip() or "0-0"
    if not _EVENT_ID.match(last_id):
        raise ApiError(400, "invalid_request", f"Last-Event-ID: expected an event id like 1700000000000-0, "
                                               f"found {last_id[:40]!r}")
    r = get_redis()
    stream_key = keys.events(job_id)

    def generate():
        cursor, last_write = last_id, time.monotonic()
        while True:
            batch = r.xread({stream_key: cursor}, count=100, block=_EVENT_BLOCK_MS)
            for entry_id, fields in (batch[0][1] if batch else []):
                cursor = entry_id
                yield f"id: {entry_id}\nevent: {fields['event']}\ndata: {fields['data']}\n\n"
                last_write = time.monotonic()
                if fields["event"] in TERMINAL_EVENTS:
                    return
            if not batch:
                status = r.hget(keys.job(job_id), "status")
                if status is None or status == JobStatus.EXPIRED.value:
                    return  # deleted or expired: nothing more will come
                if status in {s.value for s in FINISHED} and not r.xread({stream_key: cursor}, count=1):
                    return  # finished and the client already has the terminal event
                if time.monotonic() - last_write >= KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    last_write = time.monotonic()

    return Response(stream_with_context(generate()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
