"""The /jobs resource: create, read (optionally blocking), list, cancel, delete, download the MP4, and the job's
server-sent events. The views translate /jobs' wire format; the work is done by api/job_service.py."""
from __future__ import annotations

import json
import logging
import re
import time

import redis
from flask import Blueprint, Response, current_app, g, jsonify, request, stream_with_context

from h3batch.api import idempotency, job_http, job_inputs, job_service, slots
from h3batch.api.errors import ApiError
from h3batch.api.redis_client import get_redis
from h3batch.api.schemas import CreateJob, job_view
from h3batch.api.wait import POLL_S, wait_for_finish
from h3batch.core import capacity, defaults, keys
from h3batch.core.jobs import FINISHED, TERMINAL_EVENTS, JobStatus, eta_s, load_job, typical_render_s

bp = Blueprint("jobs", __name__)
log = logging.getLogger("h3batch.api")

JOBS = job_service.Vocabulary(
    api="jobs", noun="job", not_found="job_not_found", not_completed="job_not_completed",
    not_completed_message="job {id} is {status}; its video exists only once it is completed",
    expired_message="job {id}'s video expired at {at}", gone_message="job {id}'s video is no longer stored",
    not_completed_retryable=True)
POLL_AFTER_MS = "500"
"""`openai-poll-after-ms` on queued / in-progress jobs."""
_FINISHED = frozenset(s.value for s in FINISHED)
_PREFER_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+)", re.IGNORECASE)
_EVENT_ID = re.compile(r"^([0-9]{1,20})-([0-9]{1,20})$")
_STREAM_ID_MAX = 2**64 - 1
"""Each half of a Redis stream id is an unsigned 64-bit integer; a larger one makes XREAD fail mid-stream."""
"""An SSE comment line at least this often keeps proxies from closing an idle event stream."""
_EVENT_BLOCK_MS = int(POLL_S * 1000)  # one XREAD BLOCK; between two looks at the client's connection
def _view(record: dict, position: int | None) -> dict:
    """`job_view` with the job's ETA (core/jobs.eta_s) while it is queued or running."""
    if record["status"] in _FINISHED:
        return job_view(record, position)
    if "eta_inputs" not in g:  # read once per request, however many jobs a list page shows
        r = get_redis()
        fleet = capacity.fleet(r)
        g.eta_inputs = {"typical_s": typical_render_s(r), "workers": len(fleet.capabilities) if fleet and fleet.live
                        else 0}
    return job_view(record, position, eta_s(record, position, now=time.time(), **g.eta_inputs))


def _validated(body: dict) -> CreateJob:
    """The create body as CreateJob. 400 naming the first bad field (unsupported_parameter for unknown ones)."""
    return job_service.validate_create(body, max_prompt_chars=current_app.config["MAX_PROMPT_CHARS"],
                                       canvas=current_app.config.get("CANVAS"),
                                       lora_policy=current_app.config.get("LORA_POLICY"))


def _requested_wait() -> float:
    """Seconds of blocking wait asked for with `?wait=N` (0..MAX_WAIT_S, else 400) or `Prefer: wait=N` (clamped to
    MAX_WAIT_S: RFC 7240 makes a preference a hint the server may honour in part); 0 when none."""
    raw = request.args.get("wait")
    if raw is None:
        match = _PREFER_WAIT.search(request.headers.get("Prefer", ""))
        return min(float(match.group(1)), float(defaults.MAX_WAIT_S)) if match else 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= defaults.MAX_WAIT_S:
        raise ApiError(400, "invalid_request", f"wait: expected seconds 0..{defaults.MAX_WAIT_S}, found {raw[:40]!r}")
    return seconds


def _reply(record: dict, status: int):
    response = job_http.job_reply(record, status, _view, POLL_AFTER_MS)
    if g.get("wait_skipped"):
        response.headers["h3batch-wait"] = "skipped: wait slots full; the job as it is now"
    return response


def _wait(job_id: str, wait_s: float) -> dict | None:
    """wait_for_finish in one of this process's wait slots (per key and per process, api/slots.py); with none free,
    the record as it is now, at once (the reply says so in `h3batch-wait`)."""
    pool: slots.SlotPool = current_app.extensions[slots.WAITS_KEY]
    owner = g.get("owner") or ""
    environ = request.environ
    if not pool.try_take(owner):
        g.wait_skipped = True
        return load_job(get_redis(), job_id)
    try:
        return wait_for_finish(get_redis(), job_id, wait_s, gone=lambda: slots.client_gone(environ))
    finally:
        pool.release(owner)


@bp.post("/jobs")
def create():
    """Queue a render (JSON, or multipart with image files; api/job_inputs.py). 400 invalid body or image, 413 over
    48 MiB or an image too large, 409/422 Idempotency-Key in use/reused, 422
    exceeds_worker_capacity, 503 queue_full or storage_unavailable."""
    if request.mimetype == "multipart/form-data":
        body, raw = job_inputs.split_form(list(request.form.items(multi=True)),
                                          [(n or "(empty name)", f) for n, f in request.files.items(multi=True)])
    else:
        body = request.get_json(force=True, silent=True)
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_json", "expected a JSON object body, e.g. {\"prompt\": \"rain on a tin "
                                                "roof\"}, or multipart/form-data with image files")
        body, raw = job_inputs.split_json(body)
    req = _validated(body)
    caller = job_http.caller()
    fleet = job_service.UNREAD
    if raw or req.task != "t2va":  # a task no worker serves is 422 before its images are looked at
        fleet = capacity.fleet(caller.r)
        job_service.check_capacity(fleet, job_service.need_of(req, caller.default_precision, fleet))
    images = job_inputs.check_images(req.task, raw, req.width, req.height)  # nothing is stored on a refusal
    wait_s = _requested_wait()
    record, replayed = job_service.create_job(
        caller, req, JOBS, idempotency.parse_key(request.headers.get("Idempotency-Key")),
        idempotency.fingerprint({**req.model_dump(mode="json"), **job_inputs.fingerprint(images)}), images, fleet)
    if not replayed and wait_s > 0:
        record = _wait(record["id"], wait_s) or record
    response = _reply(record, 200 if not replayed and record["status"] in _FINISHED else 202)
    response.headers["Location"] = f"/jobs/{record['id']}"
    if replayed:  # a retry of a create that already made its job
        response.headers["Idempotent-Replayed"] = "true"
    return response


@bp.get("/jobs/<job_id>")
def get(job_id: str):
    """One job; `?wait=N` / `Prefer: wait=N` blocks up to N s for it to finish. 404 job_not_found."""
    record = job_http.owned_job(job_id, JOBS)
    wait_s = _requested_wait()
    if wait_s > 0 and record["status"] not in _FINISHED:
        record = _wait(job_id, wait_s)
        if record is None:
            raise ApiError(404, "job_not_found", f"no job with id {job_id!r}")
        record = job_service.expire_if_due(job_http.caller(), record)
    return _reply(record, 200)


@bp.get("/jobs")
def index():
    """Jobs newest first (`order=asc` for oldest), cursor `after=<id>`, `limit` 1..100, `status` filter."""
    limit = job_service.page_limit(request.args.get("limit", str(defaults.LIST_DEFAULT_LIMIT)))
    return jsonify(job_service.list_page(job_http.caller(), JOBS, _view, limit=limit,
                                         after=request.args.get("after"), order=request.args.get("order", "desc"),
                                         status=request.args.get("status")))


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str):
    """Cancel: queued → cancelled now; running → stops at the next step boundary. 404; 409 job_already_terminal."""
    return _reply(job_service.cancel(job_http.caller(job_id), job_id, JOBS), 202)


@bp.delete("/jobs/<job_id>")
def delete(job_id: str):
    """Abort if active, then remove the job and its files → 204. 404 job_not_found."""
    job_service.delete(job_http.caller(job_id), job_id, JOBS)
    return "", 204


@bp.get("/jobs/<job_id>/logs")
def logs(job_id: str):
    """The worker's log lines about this job, oldest first (worker/job_logs.py: messages only, redacted, the newest
    500). 404 job_not_found (also for another key's job)."""
    job_http.owned_job(job_id, JOBS)
    lines = [json.loads(line) for line in get_redis().lrange(keys.logs(job_id), 0, -1)]
    return jsonify({"object": "list", "job_id": job_id, "data": lines})


@bp.route("/jobs/<job_id>/content", methods=["GET", "HEAD"])
def content(job_id: str):
    """The MP4 (Range, ETag, If-None-Match, HEAD). 404; 409 job_not_completed; 410 artifact_expired."""
    caller = job_http.caller(job_id)
    record, stored = job_service.content_object(caller, job_id, JOBS)
    return job_http.send_job_content(caller.artifacts, stored, "video/mp4", record.get("sha256") or True,
                                     f"{job_id}.mp4")


@bp.get("/jobs/<job_id>/events")
def events(job_id: str):
    """Server-sent events: status, stage, progress, then completed/failed/cancelled, after which the stream ends.

    `Last-Event-ID: <id>` replays everything after that event (ids are the Redis stream's). 400 invalid_request
    for a malformed id; 404 job_not_found.
    """
    job_http.owned_job(job_id, JOBS)
    last_id = request.headers.get("Last-Event-ID", "").strip() or "0-0"
    parts = _EVENT_ID.match(last_id)
    if parts is None or max(int(parts.group(1)), int(parts.group(2))) > _STREAM_ID_MAX:
        raise ApiError(400, "invalid_request", f"Last-Event-ID: expected an event id like 1700000000000-0, "
                                               f"found {last_id[:40]!r}")
    r = get_redis()
    stream_key = keys.events(job_id)
    keepalive_s = float(current_app.config["SSE_KEEPALIVE_S"])
    request_id = g.get("request_id")
    environ = request.environ

    def generate():
        cursor, last_write = last_id, time.monotonic()
        try:
            while not slots.client_gone(environ):
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
                    if status in _FINISHED and not r.xread({stream_key: cursor}, count=1):
                        return  # finished and the client already has the terminal event
                    if time.monotonic() - last_write >= keepalive_s:
                        yield ": keep-alive\n\n"
                        last_write = time.monotonic()
        except redis.exceptions.RedisError as exc:
            # Redis went away mid-stream: end with a structured event the client can act on (reconnect with
            # Last-Event-ID once Redis is back), not a traceback in the log and a cut connection.
            log.warning("event stream ended: redis unavailable error=%s", type(exc).__name__,
                        extra={"job_id": job_id, "request_id": request_id})
            error = {"code": "storage_unavailable", "message": "the job store (Redis) is unavailable; reconnect "
                                                               "with Last-Event-ID to resume", "retryable": True,
                     "request_id": request_id}
            yield f"retry: 5000\nevent: error\ndata: {json.dumps({'error': error})}\n\n"

    return Response(stream_with_context(generate()), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
