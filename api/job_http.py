"""The Flask side both job APIs share: the job service's `Caller` for the current request, the caller's job by id,
a JSON reply with the poll hint for unfinished jobs, and a file download with Range (RFC 9110's rules) / ETag and
the conditional requests of api/conditional.py:
from the local directory (`send_file`), streamed from the S3 store through the API (the same Range/ETag/HEAD
rules, werkzeug's `make_conditional` over a seekable reader of ranged GETs), or, with H3BATCH_ARTIFACT_REDIRECT=1,
a 307 to a presigned URL of the object (GET only; HEAD and conditional requests are still answered here)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Response, current_app, g, jsonify, request, send_file
from werkzeug.http import parse_range_header, quote_etag
from werkzeug.wsgi import wrap_file

from h3batch.api import conditional, job_service
from h3batch.api.enqueue import enqueue_render
from h3batch.api.ratelimit import rate_limits
from h3batch.api.redis_client import get_redis
from h3batch.api.webhook_check import vet_webhook_url
from h3batch.core.artifact_store import ArtifactStore, StoredObject, store_for
from h3batch.core.jobs import queue_position


def caller(job_id: str | None = None) -> job_service.Caller:
    """This request's caller (its API key's owner id) with this app's Redis, artifact root, limits and sender;
    `job_id`, when given, is named in the request's log line."""
    if job_id is not None:
        g.job_id = job_id
    return job_service.Caller(r=get_redis(), owner=g.owner, artifacts_dir=Path(current_app.config["ARTIFACTS_DIR"]),
                              max_queued=current_app.config["MAX_QUEUED"],
                              max_active_per_key=current_app.config.get("MAX_ACTIVE_PER_KEY", 0),
                              creates_per_min=rate_limits().creates_per_min,
                              result_ttl_s=current_app.config["RESULT_TTL_S"], send_render=_send_render,
                              vet_webhook_url=vet_webhook_url, request_id=g.get("request_id"),
                              store=app_store(),
                              default_precision=current_app.config.get("DEFAULT_PRECISION") or "bf16",
                              lora_policy=current_app.config.get("LORA_POLICY"),
                              max_job_timeout_s=current_app.config.get("MAX_JOB_TIMEOUT_S") or 0)


def app_store() -> ArtifactStore:
    """This app's artifact store (H3BATCH_ARTIFACT_STORE; the local artifacts dir when unset)."""
    config = current_app.config
    return store_for(config.get("ARTIFACT_STORE") or "", config.get("S3_ENDPOINT_URL"), config["ARTIFACTS_DIR"])


def _send_render(job_id: str) -> None:
    g.job_id = job_id  # the request's log line names the job even when the broker refuses its message
    enqueue_render(job_id)


def owned_job(job_id: str, words: job_service.Vocabulary) -> dict[str, Any]:
    """The caller's job (lazily expired); the request's log line names it. 404 `words.not_found`."""
    return job_service.get_owned_job(caller(job_id), job_id, words)


def job_reply(record: dict[str, Any], status: int, render: Callable[[dict[str, Any], int | None], dict[str, Any]],
              poll_after_ms: str):
    """`render(record, queue_position)` as JSON; `openai-poll-after-ms` while the job is queued or running."""
    response = jsonify(render(record, queue_position(get_redis(), record["id"])))
    response.status_code = status
    if record["status"] in job_service.ACTIVE:
        response.headers["openai-poll-after-ms"] = poll_after_ms
    return response


def _honoured_range(header: str | None, length: int) -> str | None:
    """The Range header to act on for a file of `length` bytes (RFC 9110 §14.2): None, so the whole file is sent
    with 200, when the header is absent, unparseable (`bytes=5-1`), in another unit (`items=0-1`) or asks for several
    ranges (`bytes=0-1,5-6`: no multipart/byteranges here); `bytes=0-` for a suffix longer than the file, which
    selects all of it. Any other single range is acted on as sent (206, or 416 when it starts past the end)."""
    if not header:
        return None
    parsed = parse_range_header(header)
    if parsed is None or parsed.units != "bytes" or len(parsed.ranges) != 1:
        return None
    start, end = parsed.ranges[0]
    if end is None and start < 0 and -start >= length:
        return "bytes=0-"
    return header


def _act_on_range(length: int) -> None:
    """Leave werkzeug only the Range header `_honoured_range` acts on for a file of `length` bytes."""
    honoured = _honoured_range(request.headers.get("Range"), length)
    if honoured is None:
        request.environ.pop("HTTP_RANGE", None)
    else:
        request.environ["HTTP_RANGE"] = honoured


CONTENT_CACHE = "private, max-age=3600"
"""Cache-Control of every download: per-key content, never in shared caches."""


def _with_download_headers(response):
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["Cache-Control"] = CONTENT_CACHE
    return response


def send_job_content(store: ArtifactStore, obj: StoredObject, media_type: str, etag: str | bool,
                     download_name: str):
    """A job's stored file from whichever store holds it, with Range, ETag / Last-Modified, HEAD and the
    conditional requests of RFC 9110 (api/conditional.py: 304, 412 with the error envelope, If-Range); cacheable by
    the caller only. With an object store and H3BATCH_ARTIFACT_REDIRECT a plain GET is answered 307 to a presigned
    URL instead."""
    tag = etag if isinstance(etag, str) else obj.etag
    validators = conditional.Validators(quote_etag(tag), obj.modified)
    plain = not any(name in request.headers for name in conditional.CONDITIONAL_HEADERS)
    not_modified = conditional.precondition(validators, {"Accept-Ranges": "bytes", "Cache-Control": CONTENT_CACHE})
    if not_modified is not None:
        return not_modified
    if not conditional.range_applies(request.headers, validators):
        request.environ.pop("HTTP_RANGE", None)
    conditional.strip_from_environ(request.environ)  # decided above; werkzeug below only serves the range
    path = store.local_path(obj.key)
    if path is not None:
        _act_on_range(path.stat().st_size)
        return _with_download_headers(send_file(path, mimetype=media_type, conditional=True, etag=tag,
                                                download_name=download_name, last_modified=obj.modified))
    if current_app.config.get("ARTIFACT_REDIRECT") and request.method == "GET" and plain:
        # A presigned URL is signed for GET only and answers with the store's own ETag, so HEAD and conditional
        # requests (which name the API's ETag) stay here.
        url = store.presigned_url(obj.key, filename=download_name, media_type=media_type)
        response = Response(status=307, headers={"Location": url, "Cache-Control": "no-store"})
        return response
    _act_on_range(obj.size)
    body = wrap_file(request.environ, store.reader(obj.key, obj.size), buffer_size=1 << 18)
    response = Response(body, mimetype=media_type, direct_passthrough=True)
    response.content_length = obj.size
    response.last_modified = obj.modified
    response.headers["Content-Disposition"] = f'inline; filename="{download_name}"'
    response.set_etag(tag)
    return _with_download_headers(response.make_conditional(request.environ, accept_ranges=True,
                                                            complete_length=obj.size))
