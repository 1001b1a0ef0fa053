"""Blocking wait for a job to finish, for `Prefer: wait=N` and `?wait=N`.

Subscribes to the job's done channel *before* reading the record, so a finish between the read and the wait is not
missed; returns the record as it is when the wait ends (finished or not).
"""
from __future__ import annotations

import time
from typing import Any

import redis

from h3batch.core import keys
from h3batch.core.jobs import FINISHED, JobStatus, load_job


def wait_for_finish(r: redis.Redis, job_id: str, timeout_s: float) -> dict[str, Any] | None:
    """The record once its status is finished or `timeout_s` passed; None if it disappeared."""
    deadline = time.monotonic() + timeout_s
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(keys.done_channel(job_id))
        while True:
            record = load_job(r, job_id)
            remaining = deadline - time.monotonic()
            if record is None or JobStatus(record["status"]) in FINISHED or remaining <= 0:
                return record
            pubsub.get_message(timeout=min(remaining, 1.0))
    finally:
        pubsub.close()
