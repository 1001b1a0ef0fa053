"""The sweep Celery app: its own queue (`loadrunner`), JSON only, no torch (the service's GPU app is separate).

`celery -A h3batch.loadrunner.celery_app worker -Q loadrunner` and `h3batch sweep-worker` use `app`; the API builds a
client-only app for its own Redis URL with `make_app` to send `loadrunner.start_sweep`.
"""
from __future__ import annotations

from celery import Celery
from celery.schedules import crontab, schedule

from h3batch.loadrunner.sweep_settings import KEY_PREFIX, ScheduleEntry, SweepSettings

START_SWEEP = "loadrunner.start_sweep"
RUN_POINT = "loadrunner.run_point"
FINALIZE_SWEEP = "loadrunner.finalize_sweep"
# A point can run for minutes; the broker must not redeliver it to another worker meanwhile.
VISIBILITY_TIMEOUT_S = 6 * 3600
POINT_TIME_LIMIT_S = 2 * 3600
"""Longest a sweep task may run (Celery `task_time_limit` under a prefork pool; `run_point` also bounds its own
load run by it under the solo pool `h3batch sweep-worker` uses). Well under VISIBILITY_TIMEOUT_S, so a running point
is never handed out again."""


def beat_schedule(entries: tuple[ScheduleEntry, ...], queue: str) -> dict:
    """Celery beat entries: each fires `start_sweep(sweep, None, "schedule:<name>")` on the sweep queue."""
    out = {}
    for entry in entries:
        when = schedule(entry.every_s) if entry.every_s is not None else crontab(*entry.cron.split())
        out[entry.name] = {"task": START_SWEEP, "schedule": when, "args": (entry.sweep, None,
                                                                           f"schedule:{entry.name}"),
                           "options": {"queue": queue}}
    return out


def make_app(settings: SweepSettings) -> Celery:
    app = Celery("loadrunner", broker=settings.redis_url, include=["h3batch.loadrunner.sweep_tasks"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,  # outcomes live in the sweep records, not in a result backend
        task_default_queue=settings.queue,
        task_routes={"loadrunner.*": {"queue": settings.queue}},
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S, "global_keyprefix": KEY_PREFIX},
        task_time_limit=POINT_TIME_LIMIT_S,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Task events for Flower (`celery -A h3batch.loadrunner.celery_app flower`): with the key prefix above they
        # travel on their own pub/sub channels, so the sweep queue needs a Flower of its own (docs/service.md).
        worker_send_task_events=True,
        task_send_sent_event=True,
        beat_schedule=beat_schedule(settings.schedule, settings.queue),
        timezone="UTC",
    )
    return app


app = make_app(SweepSettings.from_env())
