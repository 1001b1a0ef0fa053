"""Send a render message for a job id (the only thing a message carries: prompts never reach the broker).

The sender is the core's Celery app (core/celery_app.make_celery, the same JSON-only, visibility-timeout settings the
worker consumes with) made on first use per Flask app, from that app's `REDIS_URL` and `MAX_RUN_S`; importing this
module builds nothing and reads no environment. It sends by task name, so the API never imports h3batch.worker.tasks
(or torch).
"""
from __future__ import annotations

import threading

from celery import Celery
from flask import current_app

from h3batch.api.redis_client import get_redis
from h3batch.core.celery_app import make_celery, send_render

_EXTENSION_KEY = "h3batch.celery"
_create_lock = threading.Lock()


def _sender() -> Celery:
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    sender = app.extensions.get(_EXTENSION_KEY)
    if sender is None:
        with _create_lock:  # gunicorn threads share the app: one sender (and one connection pool) per app
            sender = app.extensions.get(_EXTENSION_KEY)
            if sender is None:
                sender = make_celery(app.config["REDIS_URL"], max_run_s=int(app.config["MAX_RUN_S"]))
                app.extensions[_EXTENSION_KEY] = sender
    return sender


def enqueue_render(job_id: str) -> None:
    """Publish one `h3batch.render(job_id)` message on the job's capability queue (core/routing.py)."""
    send_render(_sender(), get_redis(), job_id)
