"""Per-job logs: the worker's own structured log lines about one job, kept beside its record for
`GET /jobs/{id}/logs` (Replicate's `logs`, fal's `?logs=1`).

A logging handler on the `h3batch` logger copies every INFO-or-above record that carries `job_id` (the worker passes
it with `extra=`) into the Redis list `h3b:logs:{id}`: `{ts, level, logger, message}`, the newest `MAX_LINES` kept,
expiring with the record (core/jobs.py `transition`) and deleted with it. Only the message is kept: no traceback,
no other `extra` field, and three redactions in case a message ever quotes one: Bearer tokens, `whsec_` secrets and
URL query strings (a webhook URL may carry a token there). The lines are the job's own (keyed by its id and read
only through its owner's /jobs/{id}), so another tenant's data cannot appear. A Redis failure drops the line: the log
must never stop a render (the stderr log still has it).
"""
from __future__ import annotations

import json
import logging
import re

import redis

from h3batch.core import keys

MAX_LINES = 500
"""Lines kept per job (the oldest dropped); a render writes about ten."""
_REDACT = (
    (re.compile(r"(?i)\bbearer\s+\S+"), "Bearer [redacted]"),
    (re.compile(r"whsec_\S+"), "whsec_[redacted]"),
    (re.compile(r"(https?://[^\s?#\"']+)\?[^\s#\"']*"), r"\1?[redacted]"),
)


def redact(message: str) -> str:
    for pattern, replacement in _REDACT:
        message = pattern.sub(replacement, message)
    return message


class JobLogHandler(logging.Handler):
    """Copies job-tagged records into the job's Redis list."""

    def __init__(self, r: redis.Redis, ttl_s: int):
        super().__init__(level=logging.INFO)
        self.r, self.ttl_s = r, ttl_s

    def emit(self, record: logging.LogRecord) -> None:
        job_id = getattr(record, "job_id", None)
        if not isinstance(job_id, str) or not job_id:
            return
        line = json.dumps({"ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
                           "message": redact(record.getMessage())})
        key = keys.logs(job_id)
        try:
            with self.r.pipeline(transaction=False) as pipe:
                pipe.rpush(key, line)
                pipe.ltrim(key, -MAX_LINES, -1)
                pipe.expire(key, self.ttl_s)  # a bound even for a job that never finishes; transition shortens it
                pipe.execute()
        except redis.exceptions.RedisError:
            pass  # dropped on purpose (module docstring): the render goes on, stderr keeps the line


def install(r: redis.Redis, ttl_s: int) -> JobLogHandler:
    """Attach the handler to the `h3batch` logger (Celery replaces root's handlers, never this one's); idempotent."""
    logger = logging.getLogger("h3batch")
    for old in [h for h in logger.handlers if isinstance(h, JobLogHandler)]:
        logger.removeHandler(old)
    handler = JobLogHandler(r, ttl_s)
    logger.addHandler(handler)
    return handler


def read(r: redis.Redis, job_id: str) -> list[dict]:
    """The job's lines, oldest first."""
    return [json.loads(line) for line in r.lrange(keys.logs(job_id), 0, -1)]
