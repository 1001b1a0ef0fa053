"""The /batches resource: submit many job requests at once (JSON, or a JSONL upload), follow the batch, read its
results in input order, download its archive (Range-capable), cancel or delete it. The views translate the wire
format; api/batch_service.py does the work, core/batches.py keeps the records and feeds the render queue fairly.
"""
from __future__ import annotations

import json

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from werkzeug.http import parse_range_header

from h3batch.api import batch_service, conditional, idempotency, job_http, job_service
from h3batch.api.errors import ApiError
from h3batch.api.request_guard import form_parts
from h3batch.core import defaults

bp = Blueprint("batches", __name__)


def init_batches(app: Flask) -> None:
    """POST /batches may carry up to MAX_BATCH_BODY_BYTES (every other route keeps MAX_CONTENT_LENGTH); register
    before the request guard, which reads a chunked body up to the request's limit."""
    app.before_request(_batch_body_limit)


def _batch_body_limit() -> None:
    if request.method == "POST" and request.path.rstrip("/") == "/batches":
        request.max_content_length = defaults.MAX_BATCH_BODY_BYTES
    elif request.method == "POST" and request.path.rstrip("/") in ("/jobs", "/v1/videos"):  # input images
        request.max_content_length = defaults.MAX_JOB_BODY_BYTES


def _submission() -> batch_service.Submission:
    if request.mimetype == "multipart/form-data":
        texts, files = form_parts()
        unknown = sorted({name for name, _ in texts} - {"metadata", "on_invalid", "webhook_url"}
                         | set(files) - {"file"})
        if unknown:
            raise ApiError(400, "unsupported_parameter", f"{unknown[0][:64]}: unknown form field (accepted: file, "
                                                         f"metadata, on_invalid, webhook_url)")
        upload = request.files.get("file")
        if upload is None:
            raise ApiError(400, "invalid_request", "file: expected a JSONL file part (one job request per line)")
        return batch_service.from_jsonl(upload.read(), request.form.get("metadata"), request.form.get("on_invalid"),
                                        request.form.get("webhook_url"),
                                        max_batch=int(current_app.config.get("MAX_BATCH", defaults.MAX_BATCH)))
    return batch_service.from_json(request.get_json(force=True, silent=True))


@bp.post("/batches")
def create():
    """Queue a batch → 202 with the batch object (Location: /batches/{id}). 400 bad body, 413 too large, 422
    invalid_batch (refused lines in error.details; nothing queued), 409/422 Idempotency-Key in use/reused."""
    caller = job_http.caller()
    config = current_app.config
    batch, replayed = batch_service.create(
        caller, _submission(), max_batch=int(config.get("MAX_BATCH", defaults.MAX_BATCH)),
        max_prompt_chars=config["MAX_PROMPT_CHARS"], canvas=config.get("CANVAS"),
        idempotency_key=idempotency.parse_key(request.headers.get("Idempotency-Key")))
    response = jsonify(batch_service.view(caller, batch))
    response.status_code = 202
    response.headers["Location"] = f"/batches/{batch['id']}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@bp.get("/batches")
def index():
    """The caller's batches, newest first; `after=<id>` cursor, `limit` 1..100."""
    limit = job_service.page_limit(request.args.get("limit", str(defaults.LIST_DEFAULT_LIMIT)))
    return jsonify(batch_service.list_page(job_http.caller(), limit=limit, after=request.args.get("after")))


@bp.get("/batches/<batch_id>")
def get(batch_id: str):
    """One batch: counts by status, progress, ETA, times. 404 batch_not_found."""
    caller = job_http.caller(batch_id)
    return jsonify(batch_service.view(caller, batch_service.owned(caller, batch_id)))


@bp.post("/batches/<batch_id>/cancel")
def cancel(batch_id: str):
    """Cancel every item not finished (running ones stop at their next step). 404; 409 batch_already_finished."""
    caller = job_http.caller(batch_id)
    return jsonify(batch_service.cancel(caller, batch_service.owned(caller, batch_id)))


@bp.delete("/batches/<batch_id>")
def delete(batch_id: str):
    """Remove the batch, its jobs and their files. 404 batch_not_found."""
    caller = job_http.caller(batch_id)
    batch_service.delete(caller, batch_service.owned(caller, batch_id))
    return jsonify({"id": batch_id, "object": "batch.deleted", "deleted": True})


@bp.get("/batches/<batch_id>/results")
def results(batch_id: str):
    """JSONL (application/x-ndjson): one line per item in input order. 404 batch_not_found."""
    caller = job_http.caller(batch_id)
    lines = batch_service.results(caller, batch_service.owned(caller, batch_id))
    body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
    return Response(body, mimetype="application/x-ndjson")


@bp.route("/batches/<batch_id>/archive", methods=["GET", "HEAD"])
def archive(batch_id: str):
    """The zip of the finished MP4s plus manifest.jsonl, streamed; one byte range (206) on request; conditional
    requests as on job content (api/conditional.py: If-Match, If-None-Match, If-Range). 404; 409
    batch_not_finished; 412 precondition_failed; 416 range not satisfiable."""
    caller = job_http.caller(batch_id)
    layout, etag = batch_service.archive(caller, batch_service.owned(caller, batch_id))
    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Cache-Control": job_http.CONTENT_CACHE,
               "Content-Disposition": f'attachment; filename="{batch_id}.zip"'}
    validators = conditional.Validators(etag)
    not_modified = conditional.precondition(validators, headers)
    if not_modified is not None:
        return not_modified
    start, stop, status = 0, layout.length, 200
    wanted = _single_range(layout.length) if conditional.range_applies(request.headers, validators) else None
    if wanted is not None:
        start, stop = wanted
        if start >= layout.length:
            raise ApiError(416, "range_not_satisfiable", f"Range: the archive is {layout.length} bytes", False,
                           {"Content-Range": f"bytes */{layout.length}"})
        status = 206
        headers["Content-Range"] = f"bytes {start}-{stop - 1}/{layout.length}"
    headers["Content-Length"] = str(stop - start)
    body = layout.iter_range(start, stop) if request.method != "HEAD" else iter(())
    return Response(body, status=status, mimetype="application/zip", headers=headers, direct_passthrough=True)


def _single_range(length: int) -> tuple[int, int] | None:
    """(start, stop) of the one byte range asked for, or None for the whole archive: no Range, or an unparseable or
    multi-range header."""
    parsed = parse_range_header(request.headers.get("Range"))
    if parsed is None or parsed.units != "bytes" or len(parsed.ranges) != 1:
        return None
    start, end = parsed.ranges[0]
    if start < 0:  # suffix: the last -start bytes
        return max(0, length + start), length
    return start, length if end is None else min(end, length)
