"""Send a render message for a job id (the only thing a message carries: prompts never reach the broker).

The Celery app is built on first use per Flask app and sends by task name, so the API never imports h3batch.worker.tasks
(or torch).
"""
from __future__ import annotations

from celery import Celery
from flask import current_app

from h3batch.core import defaults
from h3batch.core.celery_app import make_celery

_EXTENSION_KEY = "h3batch.celery"


def _celery() -> Celery:
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    celery = app.extensions.get(_EXTENSION_KEY)
    if celery is None:
        celery = make_celery(app.config["REDIS_URL"], max_run_s=app.config["MAX_RUN_S"])
        app.extensions[_EXTENSION_KEY] = celery
    return celery


def enqueue_render(job_id: str) -> None:
    """Publish one `h3batch.render(job_id)` message on the render queue."""
    _celery().send_task(defaults.RENDER_TASK, args=[job_id], queue=defaults.RENDER_QUEUE)
