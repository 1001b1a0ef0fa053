"""The Celery app: JSON-only messages, render queues by capability for GPU workers, settings for long GPU tasks
(spec §3).

`make_celery(redis_url)` builds a configured app; the API calls it on first use to *send* (by task name, never
importing h3batch.worker.tasks, so no torch), the worker at start to consume. Nothing is built or read from the
environment at import time. `send_render` is the one way a render message is sent (API, worker re-send, reaper,
batch feeder): it names the queue of what the job needs (core/routing.py).
"""
from __future__ import annotations

import redis
from celery import Celery

from h3batch.core import defaults, keys, lanes, routing

ROUTE_FIELDS = ("width", "height", "seconds", "task", "precision")
"""The record fields `routing.queue_of` reads."""


def send_render(sender: Celery, r: redis.Redis, job_id: str) -> str | None:
    """Publish `h3batch.render(job_id)` on the job's capability queue, at the broker priority of its lane
    (core/lanes.py: ahead of the rest once the anti-starvation rule promoted it); returns the queue, None (nothing
    sent) when the record is gone (a deleted or expired job has nothing to render)."""
    values = r.hmget(keys.job(job_id), [*ROUTE_FIELDS, "promoted_at"])
    if values[0] is None:
        return None
    queue = routing.queue_of({name: value or None for name, value in zip(ROUTE_FIELDS, values)})
    sender.send_task(defaults.RENDER_TASK, args=[job_id], queue=queue,
                     priority=lanes.message_priority(bool(values[-1])))
    return queue


def make_celery(redis_url: str, *, max_run_s: int = defaults.MAX_RUN_S, include_tasks: bool = False) -> Celery:
    """A Celery app on `redis_url`; `include_tasks` registers h3batch.worker.tasks (consumers only)."""
    celery = Celery("h3batch", broker=redis_url, include=["h3batch.worker.tasks"] if include_tasks else [])
    # Redelivery of an unacked message after this long: keep it above the longest render (§3 pitfall 1), and set it
    # in all three places because apps sharing a Redis otherwise fall back to the shortest value.
    visibility = {"visibility_timeout": 2 * max_run_s}
    celery.conf.update(
        # Pickle refused: a pickled message raises ContentDisallowed and nothing runs.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # State lives in h3batch's own job records, written before enqueue; Celery results would only pile up.
        task_ignore_result=True,
        # At-least-once: ack after the task body, requeue if the worker dies; the job record caps attempts.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # One job per node at a time: never reserve the next job while rendering.
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        broker_transport_options=visibility,
        result_backend_transport_options=visibility,
        visibility_timeout=visibility["visibility_timeout"],
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # Unacked messages are restored on a warm stop instead of waiting out the visibility timeout.
        worker_soft_shutdown_timeout=60.0,
        # Our structured log handler stays in charge of the root logger.
        worker_hijack_root_logger=False,
        # Every render message names its queue (send_render); a message sent without one lands in `render`, which
        # no worker consumes, so nothing renders on a worker that was not chosen for it.
        task_default_queue=defaults.RENDER_QUEUE,
        task_create_missing_queues=True,
        # Task events (sent by the API, received/started/succeeded by the worker) feed Flower (docs/service.md
        # "Monitoring"). On Redis they are pub/sub messages: nothing is stored when no monitor listens.
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return celery

