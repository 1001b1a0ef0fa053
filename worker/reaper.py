"""The reaper: puts back in line every job that lost its worker or its Celery message (spec §4 "reconciler").

Failure handled: work that nobody will do, a running job whose worker is gone (lease lapsed) or a queued job whose
broker message is lost. It never looks at workers themselves (worker/heartbeat.py, worker/watchdog.py do).

Run by every worker's heartbeat thread (worker/heartbeat.py `Heartbeat.resend_lost_jobs`), one worker per interval
under the `h3b:reconcile` lock; its first pass runs one heartbeat period after the worker starts. Two cases:

1. Orphaned running job: `in_progress` in the record, no lease (its worker died, or lost Redis, longer than the
   lease TTL). The job goes back to `queued` (compare-and-set on the attempt seen, so a worker that re-claimed it
   meanwhile wins) and gets a fresh render message; `claim_job` then starts attempt + 1. A job that already used
   `max_attempts` fails with `worker_lost` instead. This bounds the delay after a kill -9 by lease TTL + reconcile
   interval (30 s + 10 s by default), instead of the broker's visibility timeout (2 x H3BATCH_MAX_RUN_S): the dead
   worker's own unacked message is redelivered only then, finds the job finished and is acked without work.
2. Queued job without a message: `queued` for longer than `grace_s` but no render message for it waits in the
   broker list, and none was taken by a worker within `grace_s` (an API that died between writing the record and
   sending, a message lost inside Redis's AOF fsync window, a worker killed between taking a message and claiming).
   It gets a new message.

3. Garbage: every pass also removes artifact directories whose record is gone (TTL ended; lost with a Redis crash,
   once older than any record lives) or finished without a servable video (failed, cancelled, expired), expires completed jobs past their
   `expires_at` (completed → expired, the MP4 goes), and drops the listing-index entries of records that are gone
   (`jobs.prune_indexes`). Before this, files went only by lazy expiry on read or DELETE, so a record's TTL dropped
   the only pointer to its MP4 and the disk filled. With an S3 store (H3BATCH_ARTIFACT_STORE=s3://...) the same
   rules run over the bucket: orphans are found by listing the store's prefix (job ids are the first path segment
   of every key) and looking each id's record up; a completed job also loses the objects of attempts its record
   does not name (uploaded, then superseded or crashed before `completed`), and multipart uploads abandoned for
   longer than `upload_age_s` (a worker killed mid-upload) are aborted. An upload's age is counted from the pass
   that first saw it unfinished (`h3b:uploads:seen`), not from the store's `Initiated` time: that is another
   machine's clock (moto's server even reports one fixed date in 2010, and aborted live uploads mid-flight), and
   the upload of an attempt that holds its job's lease is never aborted, however old.

Reading the broker's own structures (the `render` list and kombu's `unacked` hash) is what makes case 2 exact:
Celery has no API that lists waiting messages of the Redis transport, so this module decodes kombu's message
envelope (JSON; body base64 JSON `[args, kwargs, embed]`) itself, and ignores anything it cannot decode.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import redis

from h3batch.core import defaults, jobs, keys, lease, routing
from h3batch.core.artifact_store import ArtifactStore, attempt_of, is_input_key, sibling
from h3batch.core.broker import ready_lists
from h3batch.core.celery_app import ROUTE_FIELDS
from h3batch.core.jobs import JobStatus, Stage

log = logging.getLogger("h3batch.worker")

KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


@dataclass(frozen=True)
class ReapReport:
    """What one pass did (job ids)."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)


def _job_id_of(raw_message: str | bytes) -> str | None:
    """The job id a kombu-encoded render message carries, or None for anything else."""
    try:
        message = json.loads(raw_message)
        if message.get("headers", {}).get("task") != defaults.RENDER_TASK:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]) if args else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def messages_waiting(r: redis.Redis, queue: str) -> set[str]:
    """Job ids with a render message in the broker's ready lists of `queue` (all priorities)."""
    found: set[str] = set()
    for name in ready_lists(queue):
        for raw in r.lrange(name, 0, -1):
            job_id = _job_id_of(raw)
            if job_id:
                found.add(job_id)
    return found


def messages_taken_since(r: redis.Redis, since: float) -> set[str]:
    """Job ids of render messages a worker took (kombu `unacked`) at or after Unix time `since`."""
    tags = r.zrangebyscore(KOMBU_UNACKED_INDEX, since, "+inf")
    if not tags:
        return set()
    found: set[str] = set()
    for raw in r.hmget(KOMBU_UNACKED, tags):
        if raw is None:
            continue
        try:
            envelope = json.loads(raw)[0]
        except (ValueError, IndexError, TypeError):
            continue
        job_id = _job_id_of(json.dumps(envelope))
        if job_id:
            found.add(job_id)
    return found


def reap(r: redis.Redis, send: Callable[[str], None], *, grace_s: float, record_ttl_s: int,
         max_attempts: int = defaults.MAX_ATTEMPTS, queue: str | None = None,
         now: float | None = None) -> ReapReport:
    """One pass over running and queued jobs (see the module docstring); `send(job_id)` publishes a message on the
    job's capability queue (core/celery_app.send_render). A queued job's message counts as waiting only in its own
    queue (`queue` overrides: one queue for every job): a message left in a queue no worker consumes is re-sent."""
    now = time.time() if now is None else now
    report = ReapReport()
    for job_id in jobs.orphaned_running(r):
        record = jobs.load_job(r, job_id)
        if record is None or record["status"] != JobStatus.IN_PROGRESS.value:
            continue
        attempt = record.get("attempt") or 0
        extra = {"job_id": job_id, "attempt": attempt}
        if attempt >= max_attempts:
            done = jobs.transition(
                r, job_id, JobStatus.FAILED, expect={JobStatus.IN_PROGRESS}, expect_attempt=attempt,
                fields={"error": {"code": "worker_lost", "message": f"the worker died {attempt} times while "
                                  f"rendering this job", "retryable": True, "stage": record.get("stage")}},
                record_ttl_s=record_ttl_s, now=now)
            if done is not None:
                report.failed.append(job_id)
                log.warning("job failed: its worker was lost on every attempt", extra=extra)
            continue
        if not requeue(r, job_id, attempt, now=now):
            continue  # re-claimed, cancelled or deleted meanwhile
        send(job_id)
        report.requeued.append(job_id)
        log.warning("requeued job whose worker lost its lease", extra=extra)

    stale_before = now - grace_s
    candidates = [j for j, _ in r.zrange(keys.QUEUE, 0, -1, withscores=True) if j not in report.requeued]
    if candidates:
        with r.pipeline(transaction=False) as pipe:
            for job_id in candidates:
                pipe.hmget(keys.job(job_id), ["status", "created_at", "requeued_at", *ROUTE_FIELDS])
            rows = pipe.execute()
        old = {job_id: dict(zip(ROUTE_FIELDS, (v or None for v in row[3:]))) for job_id, row in zip(candidates, rows)
               if row[0] == JobStatus.QUEUED.value and max(float(row[1] or 0), float(row[2] or 0)) < stale_before}
        if old:
            own = {job_id: queue or routing.queue_of(fields) for job_id, fields in old.items()}
            waiting = {q: messages_waiting(r, q) for q in set(own.values())}
            taken = messages_taken_since(r, stale_before)
            for job_id in old:
                if job_id in taken or job_id in waiting[own[job_id]]:
                    continue
                send(job_id)
                lease.count(r, job_id, "resent")
                report.resent.append(job_id)
                log.warning("re-sent the render message of a queued job that had none", extra={"job_id": job_id})
    return report


def requeue(r: redis.Redis, job_id: str, attempt: int, *, now: float | None = None,
            reason: str = "worker_lost") -> bool:
    """Attempt `attempt` of a running job goes back to `queued` (compare-and-set on it), counted in `h3b:runs`
    (`requeues`, `requeued_at`) with `requeue_reason` on the record; False when the job moved on meanwhile. The
    caller sends the render message (after dropping any lease it holds, so the next claim is not refused)."""
    now = time.time() if now is None else now
    requeued = jobs.transition(
        r, job_id, JobStatus.QUEUED, expect={JobStatus.IN_PROGRESS}, expect_attempt=attempt,
        fields={"stage": Stage.QUEUED, "step": 0, "progress": 0.0, "requeued_at": now, "requeue_reason": reason},
        now=now)
    if requeued is None:
        return False
    lease.count(r, job_id, "requeues")
    r.hset(keys.runs(job_id), "requeued_at", repr(now))
    return True


_NOT_SERVABLE = frozenset({JobStatus.FAILED.value, JobStatus.CANCELLED.value, JobStatus.EXPIRED.value})


@dataclass(frozen=True)
class GarbageReport:
    """What one garbage pass removed (job ids)."""

    removed_dirs: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    unindexed: list[str] = field(default_factory=list)
    removed_objects: list[str] = field(default_factory=list)
    """Job ids whose objects all went from the object store."""
    pruned_objects: list[str] = field(default_factory=list)
    """Keys of superseded attempts removed while the job itself stays."""
    aborted_uploads: int = 0


def collect_garbage(r: redis.Redis, artifacts_dir: Path, *, orphan_age_s: float, now: float | None = None,
                    expired_record_ttl_s: int = defaults.RECORD_GRACE_S, store: ArtifactStore | None = None,
                    upload_age_s: float | None = None) -> GarbageReport:
    """Case 3 of the module docstring: one pass over the due entries of `h3b:expiry` and over `artifacts_dir`
    (and over the object store, when `store` is one).

    A directory whose record is gone is removed at once when `h3b:expiry` says that record expired; one with no
    record and no such trace (lost with a Redis crash) only once it is older than `orphan_age_s` (the longest a
    record lives), so a worker pointed at the wrong Redis cannot wipe live artifacts.
    """
    now = time.time() if now is None else now
    report = GarbageReport(unindexed=jobs.prune_indexes(r, now=now))
    expired_records = set(report.unindexed)
    _collect_local(r, artifacts_dir, report, expired_records, orphan_age_s=orphan_age_s, now=now,
                   expired_record_ttl_s=expired_record_ttl_s)
    if store is not None and store.kind != "local":
        _collect_store(r, store, report, expired_records, orphan_age_s=orphan_age_s, now=now,
                       expired_record_ttl_s=expired_record_ttl_s)
        aborted = _abort_abandoned_uploads(r, store, orphan_age_s if upload_age_s is None else upload_age_s,
                                           now=now)
        report = replace(report, aborted_uploads=aborted)
        if report.removed_objects or report.pruned_objects or report.aborted_uploads:
            log.info("garbage: removed the objects of %d jobs, %d superseded objects, aborted %d uploads",
                     len(report.removed_objects), len(report.pruned_objects), report.aborted_uploads)
    return report


def _abort_abandoned_uploads(r: redis.Redis, store: ArtifactStore, older_than_s: float, *, now: float) -> int:
    """Abort the store's unfinished multipart uploads that this service has seen unfinished for `older_than_s` and
    that no live attempt owns; returns how many were aborted. First sightings go to `h3b:uploads:seen` (HSETNX, so
    every worker's pass shares one clock: Redis's record of this service's own); entries of uploads that ended are
    dropped, once first seen before this pass began (a later pass may have seen an upload this listing missed)."""
    uploads = store.incomplete_uploads()
    with r.pipeline(transaction=False) as pipe:
        for _, upload_id in uploads:
            pipe.hsetnx(keys.UPLOADS_SEEN, upload_id, repr(now))
        pipe.hgetall(keys.UPLOADS_SEEN)
        seen = pipe.execute()[-1]
    listed = {upload_id for _, upload_id in uploads}
    ended = [upload_id for upload_id, first in seen.items() if upload_id not in listed and float(first) < now]
    if ended:
        r.hdel(keys.UPLOADS_SEEN, *ended)
    aborted = 0
    for key, upload_id in uploads:
        if now - float(seen.get(upload_id, now)) < older_than_s or _upload_is_live(r, key):
            continue
        if store.abort_upload(key, upload_id):
            aborted += 1
        r.hdel(keys.UPLOADS_SEEN, upload_id)
    return aborted


def _upload_is_live(r: redis.Redis, key: str) -> bool:
    """True when `key` is an attempt's upload (`<job>/attempt-<n>/...`) and that attempt holds its job: the record is
    `in_progress` at attempt n and the lease exists. A worker whose lease lapsed is fenced at `completed` anyway."""
    attempt = attempt_of(key)
    if attempt is None:
        return False
    job_id = key.split("/", 1)[0]
    with r.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.job(job_id), ["status", "attempt"])
        pipe.exists(keys.lease(job_id))
        (status, current), leased = pipe.execute()
    return status == JobStatus.IN_PROGRESS.value and current == str(attempt) and bool(leased)


def _collect_store(r: redis.Redis, store: ArtifactStore, report: GarbageReport, expired_records: set[str], *,
                   orphan_age_s: float, now: float, expired_record_ttl_s: int) -> None:
    """The object-store half of collect_garbage: the same rules per job id found under the store's prefix."""
    found = store.list_jobs()
    names = sorted(j for j in found if j.startswith("job_"))
    if not names:
        return
    with r.pipeline(transaction=False) as pipe:
        for job_id in names:
            pipe.hmget(keys.job(job_id), ["status", "expires_at", "artifact", "attempt"])
        rows = pipe.execute()
    for job_id, (status, expires_at, artifact, attempt) in zip(names, rows):
        objects = found[job_id]
        if status is None:
            if job_id not in expired_records and now - objects.newest < orphan_age_s:
                continue
        elif status == JobStatus.COMPLETED.value and expires_at and float(expires_at) < now:
            if job_id not in report.expired:
                done = jobs.transition(r, job_id, JobStatus.EXPIRED, expect={JobStatus.COMPLETED},
                                       fields={"artifact": None}, record_ttl_s=expired_record_ttl_s, now=now)
                if done is None:
                    continue
                report.expired.append(job_id)
        elif status not in _NOT_SERVABLE:
            # Live job: only objects of attempts its record does not name go (an attempt that uploaded and then
            # lost the race or crashed before `completed`).
            if status == JobStatus.COMPLETED.value:
                folder = sibling(artifact, "") if artifact else None  # `<job>/attempt-<n>/`: MP4 and variants
                stale = [k for k in objects.keys if folder is not None and not k.startswith(folder)
                         and not is_input_key(k)]  # the job's input images stay as long as its video
            else:  # queued or in progress: objects of earlier attempts than the record's
                current = int(attempt or 0)
                stale = [k for k in objects.keys if (attempt_of(k) or current) < current]
            if stale:
                store.delete_keys(stale)
                report.pruned_objects.extend(stale)
            continue
        store.delete_job(job_id)
        report.removed_objects.append(job_id)


def _collect_local(r: redis.Redis, artifacts_dir: Path, report: GarbageReport, expired_records: set[str], *,
                   orphan_age_s: float, now: float, expired_record_ttl_s: int) -> None:
    try:
        entries = {e.name: e for e in os.scandir(artifacts_dir)
                   if e.name.startswith("job_") and e.is_dir(follow_symlinks=False)}
    except FileNotFoundError:
        return
    if not entries:
        return
    names = sorted(entries)
    with r.pipeline(transaction=False) as pipe:
        for job_id in names:
            pipe.hmget(keys.job(job_id), ["status", "expires_at"])
        rows = pipe.execute()
    for job_id, (status, expires_at) in zip(names, rows):
        if status is None:
            if job_id not in expired_records and now - entries[job_id].stat().st_mtime < orphan_age_s:
                continue
        elif status == JobStatus.COMPLETED.value and expires_at and float(expires_at) < now:
            done = jobs.transition(r, job_id, JobStatus.EXPIRED, expect={JobStatus.COMPLETED},
                                   fields={"artifact": None}, record_ttl_s=expired_record_ttl_s, now=now)
            if done is None:
                continue  # changed meanwhile; the next pass looks again
            report.expired.append(job_id)
        elif status not in _NOT_SERVABLE:
            continue  # queued, in progress (a worker writes there) or completed and still downloadable
        shutil.rmtree(artifacts_dir / job_id, ignore_errors=True)
        report.removed_dirs.append(job_id)
    if report.removed_dirs:
        log.info("garbage: removed %d artifact directories (%d expired now)", len(report.removed_dirs),
                 len(report.expired))
