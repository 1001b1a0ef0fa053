"""Blocking wait for a job to finish, for `Prefer: wait=N` and `?wait=N`.

Subscribes to the job's done channel *before* reading the record, so a finish between the read and the wait is not
missed; returns the record as it is when the wait ends (finished or not), or early once `gone()` says the client hung
up (its thread and wait slot are then free within POLL_S).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from h3batch.core import keys
from h3batch.core.jobs import FINISHED, JobStatus, load_job

POLL_S = 0.5
"""Longest the wait sleeps between looks at the record and at the client's connection."""


def wait_for_finish(r: redis.Redis, job_id: str, timeout_s: float,
                    gone: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
    """The record once its status is finished, `timeout_s` passed or the client is gone; None if it disappeared."""
    deadline = time.monotonic() + timeout_s
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(keys.done_channel(job_id))
        while True:
            record = load_job(r, job_id)
            remaining = deadline - time.monotonic()
            if record is None or JobStatus(record["status"]) in FINISHED or remaining <= 0 or gone():
                return record
            pubsub.get_message(timeout=min(remaining, POLL_S))
    finally:
        pubsub.close()
