"""The Flask side both job APIs share: the job service's `Caller` for the current request, the caller's job by id,
a JSON reply with the poll hint for unfinished jobs, and a file download with Range / ETag."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import current_app, g, jsonify, send_file

from h3batch.api import job_service
from h3batch.api.enqueue import enqueue_render
from h3batch.api.redis_client import get_redis
from h3batch.api.webhook_check import vet_webhook_url
from h3batch.core.jobs import queue_position


def caller(job_id: str | None = None) -> job_service.Caller:
    """This request's caller (its API key's owner id) with this app's Redis, artifact root, limits and sender;
    `job_id`, when given, is named in the request's log line."""
    if job_id is not None:
        g.job_id = job_id
    return job_service.Caller(r=get_redis(), owner=g.owner, artifacts_dir=Path(current_app.config["ARTIFACTS_DIR"]),
                              max_queued=current_app.config["MAX_QUEUED"],
                              result_ttl_s=current_app.config["RESULT_TTL_S"], send_render=_send_render,
                              vet_webhook_url=vet_webhook_url, request_id=g.get("request_id"))


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


def send_job_file(path: Path, media_type: str, etag: str | bool, download_name: str):
    """A job's file with Range, ETag / If-None-Match and HEAD; cacheable by the caller only."""
    response = send_file(path, mimetype=media_type, conditional=True, etag=etag, download_name=download_name)
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["Cache-Control"] = "private, max-age=3600"  # per-key content: never in shared caches
    return response
