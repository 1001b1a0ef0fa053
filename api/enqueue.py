"""Send a render message for a job id (the only thing a message carries: prompts never reach the broker).

The sender is a client-only Celery app made on first use per Flask app, from that app's `REDIS_URL` and `MAX_RUN_S`;
importing this module builds nothing and reads no environment. It sends by task name, so the API never imports
h3batch.worker.tasks (or torch), and it does not use core/celery_app.py either: that module builds the worker's app
from H3BATCH_* variables as soon as it is imported.
"""
from __future__ import annotations

import threading

from celery import Celery
from flask import current_app

from h3batch.core import defaults

_EXTENSION_KEY = "h3batch.celery"
_create_lock = threading.Lock()


def make_sender(redis_url: str, max_run_s: int) -> Celery:
    """A Celery app that only publishes JSON messages on `redis_url` (no tasks registered, no results kept)."""
    sender = Celery("h3batch", broker=redis_url)
    # The worker's visibility timeout (core/celery_app.py): apps sharing one Redis fall back to the shortest value.
    visibility = {"visibility_timeout": 2 * max_run_s}
    sender.conf.update(task_serializer="json", accept_content=["json"], task_ignore_result=True,
                       broker_transport_options=visibility, visibility_timeout=visibility["visibility_timeout"])
    return sender


def _sender() -> Celery:
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    sender = app.extensions.get(_EXTENSION_KEY)
    if sender is None:
        with _create_lock:  # gunicorn threads share the app: one sender (and one connection pool) per app
            sender = app.extensions.get(_EXTENSION_KEY)
            if sender is None:
                sender = make_sender(app.config["REDIS_URL"], int(app.config["MAX_RUN_S"]))
                app.extensions[_EXTENSION_KEY] = sender
    return sender


def enqueue_render(job_id: str) -> None:
    """Publish one `h3batch.render(job_id)` message on the render queue."""
    _sender().send_task(defaults.RENDER_TASK, args=[job_id], queue=defaults.RENDER_QUEUE)
