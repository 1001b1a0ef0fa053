"""Batches in Redis: one record over many job records, and the feeder that shares the GPU workers fairly.

A batch is the hash `h3b:batch:{id}` plus the list of its items (`[job id, input index, custom_id]` in input order);
each item is an ordinary job record (core/jobs.py) carrying `batch_id`, so the worker renders it like any job and
GET /jobs shows it. What differs is when an item reaches the render queue.

Fairness (issue 18 point 2; docs/service.md "Batches and fairness"). A single job goes to Celery at once; a batch
item is created `queued` but *held*: it is in its batch's `pending` zset, not in `h3b:queue`, and has no Celery
message. `feed` releases held items only into idle capacity: while

    |h3b:queue| + |h3b:running| < live workers (READY or BUSY heartbeats)

it takes one pending item from the next batch in `h3b:batches:active` (a rotating list: round-robin across batches,
so two owners' batches alternate) and puts it in `h3b:queue` and on the broker. So batch items never wait in the
broker behind which a single job could queue up: a single job submitted while a 1000-item batch waits finds in front
of it only the jobs already running (one per worker), plus at most the items handed to a worker that was idle at that
very moment. Single jobs queued ahead of capacity hold batches back (they are the interactive traffic; their own
number is bounded by H3BATCH_MAX_QUEUED and the per-key rate limit).

Why the held items are safe from the rest of the job core: the queue cap of `create_job` counts `h3b:queue`, which
holds at most one released item per worker, so a 1000-item batch neither is refused by the cap nor fills it; the
reaper's "queued without a message" case reads `h3b:queue` only, so it never re-sends a held item, and does re-send a
released one whose message was lost (the feeder may die between releasing and sending: that is the same case).

Who feeds: the API when it creates a batch, the worker after each job (worker/tasks.py) and on every heartbeat
(worker/heartbeat.py), so a lost trigger costs at most one heartbeat period. The release is one Lua script, so
concurrent feeders never over-fill. Batch completion (`check_finished`) runs after each of its jobs, after a cancel,
and in the reaper pass for all open batches; the first to see every item finished stamps `finished_at`, schedules
the `batch.completed` webhook (`<batch id>:batch.completed` in keys.WEBHOOKS_DUE) and sets the batch keys' TTL.
"""
from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

import redis

from h3batch.core import defaults, keys, metrics
from h3batch.core import jobs as store
from h3batch.core.jobs import EVENTS_KEPT, JobSpec, JobStatus, Stage

LIVE_WORKER_STATES = ("READY", "BUSY")
FINISHED_VALUES = frozenset(s.value for s in store.FINISHED)
BATCH_COMPLETED = "batch.completed"
"""Webhook event type sent when every item of a batch has finished (completed, failed or cancelled)."""
_FEED_MAX = 256
"""Most items one feed call releases (it is bounded by the idle workers anyway)."""


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Item:
    """One accepted request of a batch: what to render, its index in the submitted input and its custom_id."""

    spec: JobSpec
    index: int
    custom_id: str | None = None


# A held batch item: the job record, its indexes and first event as in jobs._CREATE, plus the batch's pending zset;
# never the render queue (the feeder puts it there). KEYS: seq, record, jobs index, owner index,
# owner-status(queued) index, events, pending. ARGV: job id, event data, events kept, pending score, field pairs.
_CREATE_HELD = """
local seq = redis.call('incr', KEYS[1])
redis.call('hset', KEYS[2], 'seq', seq, unpack(ARGV, 5))
redis.call('zadd', KEYS[3], seq, ARGV[1])
redis.call('zadd', KEYS[4], seq, ARGV[1])
redis.call('zadd', KEYS[5], seq, ARGV[1])
redis.call('zadd', KEYS[7], ARGV[4], ARGV[1])
redis.call('xadd', KEYS[6], 'MAXLEN', '~', ARGV[3], '*', 'event', 'status', 'data', ARGV[2])
return seq
"""


def create_batch(r: redis.Redis, owner: str, items: list[Item], *, metadata: dict[str, Any] | None = None,
                 skipped: list[dict[str, Any]] | None = None, webhook_url: str | None = None,
                 now: float | None = None) -> str:
    """Write the batch and all its items (held, see the module docstring) in one MULTI/EXEC; returns its id."""
    now = time.time() if now is None else now
    batch_id = new_batch_id()
    seq = int(r.incr(keys.SEQ))
    event = json.dumps({"status": JobStatus.QUEUED.value})
    with r.pipeline(transaction=True) as pipe:
        members = []
        for position, item in enumerate(items):
            job_id = store.new_job_id()
            spec = item.spec
            record: dict[str, Any] = {
                "id": job_id, "status": JobStatus.QUEUED, "stage": Stage.QUEUED, "step": 0,
                "total_steps": defaults.TOTAL_STEPS, "progress": 0.0, "prompt": spec.prompt, "seconds": spec.seconds,
                "width": spec.width, "height": spec.height, "seed": spec.seed, "release": spec.release,
                "owner": owner, "created_at": now, "attempt": 0, "batch_id": batch_id, "batch_index": item.index,
                "task": spec.task, "precision": spec.precision}
            if spec.webhook_url:
                record["webhook_url"] = spec.webhook_url
            if item.custom_id is not None:
                record["custom_id"] = item.custom_id
            pairs = [x for pair in store._encode(record).items() for x in pair]
            pipe.eval(_CREATE_HELD, 7, keys.SEQ, keys.job(job_id), keys.JOBS_INDEX, keys.owner_jobs(owner),
                      keys.owner_status(owner, JobStatus.QUEUED.value), keys.events(job_id),
                      keys.batch_pending(batch_id), job_id, event, EVENTS_KEPT, position, *pairs)
            members.append(json.dumps([job_id, item.index, item.custom_id or ""]))
        pipe.hset(keys.batch(batch_id), mapping={
            "id": batch_id, "owner": owner, "created_at": repr(now), "seq": seq, "total": len(items),
            "metadata": json.dumps(metadata or {}), "skipped": json.dumps(skipped or []),
            "webhook_url": webhook_url or ""})
        if members:
            pipe.rpush(keys.batch_items(batch_id), *members)
        pipe.zadd(keys.owner_batches(owner), {batch_id: seq})
        pipe.rpush(keys.BATCHES_ACTIVE, batch_id)
        pipe.zadd(keys.BATCHES_OPEN, {batch_id: now})
        metrics.count_batch_created(pipe, len(items))
        pipe.execute()
    return batch_id


def load_batch(r: redis.Redis, batch_id: str) -> dict[str, Any] | None:
    """The batch hash decoded (metadata, skipped, webhook_deliveries as JSON; times as floats), or None."""
    raw = r.hgetall(keys.batch(batch_id))
    if not raw:
        return None
    out: dict[str, Any] = dict(raw)
    for name in ("metadata", "skipped", "webhook_deliveries"):
        out[name] = json.loads(raw[name]) if raw.get(name) else ([] if name != "metadata" else {})
    for name in ("created_at", "finished_at"):
        out[name] = float(raw[name]) if raw.get(name) else None
    out["total"] = int(raw.get("total") or 0)
    out["webhook_url"] = raw.get("webhook_url") or None
    out["cancel_requested"] = bool(raw.get("cancel_requested"))
    return out


def items(r: redis.Redis, batch_id: str) -> list[tuple[str, int, str | None]]:
    """(job id, input index, custom_id or None) per item, in input order."""
    out = []
    for raw in r.lrange(keys.batch_items(batch_id), 0, -1):
        job_id, index, custom_id = json.loads(raw)
        out.append((job_id, int(index), custom_id or None))
    return out


def item_records(r: redis.Redis, job_ids: list[str]) -> list[dict[str, Any] | None]:
    """The job records of `job_ids` (None for a record that is gone), read in one pipeline."""
    with r.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
        raws = pipe.execute()
    return [store.decode_record(raw) if raw else None for raw in raws]


def item_statuses(r: redis.Redis, job_ids: list[str]) -> list[str]:
    """Each item's status (`deleted` when its record is gone), reading only that field: the completion checks."""
    with r.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "status")
        return [status or "deleted" for status in pipe.execute()]


def item_status(record: dict[str, Any] | None) -> str:
    """An item's status as a batch reports it: the job's, or `deleted` when its record is gone."""
    return "deleted" if record is None else record["status"]


COUNT_OF = {"queued": "queued", "in_progress": "in_progress", "completed": "completed", "expired": "completed",
            "failed": "failed", "cancelled": "cancelled", "deleted": "cancelled"}
"""Which count an item status adds to (an expired item did complete; a deleted one is reported as cancelled)."""


def summary(batch: dict[str, Any], records: list[dict[str, Any] | None], *, workers: int) -> dict[str, Any]:
    """counts, status, progress 0..1 and eta_s (from this batch's measured job times; None before any completed)."""
    counts = {"total": len(records), "queued": 0, "in_progress": 0, "completed": 0, "failed": 0, "cancelled": 0}
    done_units, durations = 0.0, []
    for record in records:
        status = item_status(record)
        counts[COUNT_OF[status]] += 1
        if status == JobStatus.IN_PROGRESS.value:
            done_units += float(record.get("progress") or 0.0)
        elif status in FINISHED_VALUES or status == "deleted":
            done_units += 1.0
        if status in ("completed", "expired") and record.get("started_at") and record.get("finished_at"):
            durations.append(float(record["finished_at"]) - float(record["started_at"]))
    total = counts["total"]
    active = counts["queued"] + counts["in_progress"]
    if total == 0 or active == 0:
        status = "cancelled" if batch.get("cancel_requested") else "completed"
    elif counts["in_progress"] or active < total:
        status = "in_progress"
    else:
        status = "queued"
    eta = None
    if active and durations:
        remaining = total - done_units
        parallel = max(1, min(workers, active))
        eta = round(sum(durations) / len(durations) * remaining / parallel, 1)
    elif not active:
        eta = 0.0
    return {"counts": counts, "status": status, "progress": round(done_units / total, 4) if total else 1.0,
            "eta_s": eta}


def ready_workers(r: redis.Redis) -> int:
    """Workers whose heartbeat is fresh and READY or BUSY: the render capacity the feeder fills."""
    count, now = 0, time.time()
    for key in r.scan_iter(match=keys.WORKER_PATTERN, count=100):
        raw = r.get(key)
        if not raw:
            continue
        try:
            beat = json.loads(raw)
        except ValueError:
            continue
        if beat.get("state") in LIVE_WORKER_STATES and now - float(beat.get("ts", 0)) < defaults.HEARTBEAT_TTL_S:
            count += 1
    return count


# Release held items into idle capacity, one per active batch in turn (see the module docstring).
# KEYS: queue, running, active batches. ARGV: capacity, most to release, key prefix.
_FEED = """
local free = tonumber(ARGV[1]) - redis.call('zcard', KEYS[1]) - redis.call('zcard', KEYS[2])
local most = tonumber(ARGV[2])
local out = {}
local looks = 0
while free > 0 and #out < most and looks < 4 * most + 64 do
  looks = looks + 1
  local b = redis.call('lmove', KEYS[3], KEYS[3], 'LEFT', 'RIGHT')
  if not b then break end
  local popped = redis.call('zpopmin', ARGV[3] .. 'batch:' .. b .. ':pending')
  if #popped == 0 then
    redis.call('lrem', KEYS[3], 0, b)
  else
    local id = popped[1]
    local job = ARGV[3] .. 'job:' .. id
    if redis.call('hget', job, 'status') == 'queued' then
      redis.call('zadd', KEYS[1], redis.call('hget', job, 'seq'), id)
      out[#out + 1] = id
      free = free - 1
    end
  end
end
return out
"""


def feed(r: redis.Redis, send: Callable[[str], None], *, capacity: int | None = None) -> list[str]:
    """Release held batch items into idle capacity and send their render messages; returns their ids.

    `capacity` defaults to the live workers. A send that fails leaves the item in `h3b:queue` without a message:
    the reaper re-sends it after its grace period.
    """
    capacity = ready_workers(r) if capacity is None else capacity
    if capacity <= 0:
        return []
    released = r.eval(_FEED, 3, keys.QUEUE, keys.RUNNING, keys.BATCHES_ACTIVE, capacity, _FEED_MAX,
                      keys.PREFIX + ":")
    for job_id in released:
        send(job_id)
    return list(released)


# Stamp finished_at once, and only on a batch that still exists (a concurrent DELETE must not leave a stub hash).
_STAMP = ("if redis.call('exists', KEYS[1]) == 1 then return redis.call('hsetnx', KEYS[1], 'finished_at', ARGV[1]) "
          "end return 0")


def check_finished(r: redis.Redis, batch_id: str, *, record_ttl_s: int, now: float | None = None) -> bool:
    """Stamp the batch finished once every item is: `finished_at`, its final status, the `batch.completed` webhook
    when it has a webhook_url, and the TTL of its keys. Returns True only for the call that stamped it."""
    batch = load_batch(r, batch_id)
    if batch is None or batch["finished_at"] is not None:
        return False
    statuses = item_statuses(r, [job_id for job_id, _, _ in items(r, batch_id)])
    if any(status in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value) for status in statuses):
        return False
    now = time.time() if now is None else now
    if not r.eval(_STAMP, 1, keys.batch(batch_id), repr(now)):
        return False  # another process stamped it first, or the batch was deleted meanwhile
    status = "cancelled" if batch["cancel_requested"] else "completed"
    with r.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch_id), "status", status)
        pipe.zrem(keys.BATCHES_OPEN, batch_id)
        pipe.lrem(keys.BATCHES_ACTIVE, 0, batch_id)
        for key in (keys.batch(batch_id), keys.batch_items(batch_id), keys.batch_pending(batch_id),
                    keys.batch_crc(batch_id)):
            pipe.expire(key, record_ttl_s)
        if batch["webhook_url"]:
            pipe.zadd(keys.WEBHOOKS_DUE, {f"{batch_id}:{BATCH_COMPLETED}": now})
        metrics.count_batch_finished(pipe, status)
        pipe.execute()
    return True


def after_job(r: redis.Redis, job_id: str, send: Callable[[str], None], *, record_ttl_s: int) -> None:
    """A worker finished (or gave up) `job_id`: top up the render queue, and finish its batch if it was the last."""
    feed(r, send)
    batch_id = r.hget(keys.job(job_id), "batch_id")
    if batch_id:
        check_finished(r, batch_id, record_ttl_s=record_ttl_s)


def check_open(r: redis.Redis, *, record_ttl_s: int) -> list[str]:
    """The reaper pass's batch step: finish every open batch whose items are all finished; returns their ids."""
    return [b for b in r.zrange(keys.BATCHES_OPEN, 0, -1) if check_finished(r, b, record_ttl_s=record_ttl_s)]


def cancel(r: redis.Redis, batch_id: str, *, record_ttl_s: int) -> None:
    """Cancel what has not finished: no more releases, held and queued items cancelled now, running ones at their
    next step boundary (core/jobs.request_cancel); the batch finishes as `cancelled` once they have stopped."""
    with r.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch(batch_id), "cancel_requested", "1")
        pipe.delete(keys.batch_pending(batch_id))
        pipe.lrem(keys.BATCHES_ACTIVE, 0, batch_id)
        pipe.execute()
    job_ids = [job_id for job_id, _, _ in items(r, batch_id)]
    for job_id, record in zip(job_ids, item_records(r, job_ids)):
        if record is not None and record["status"] in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value):
            store.request_cancel(r, job_id, reason="batch_cancelled", record_ttl_s=record_ttl_s)
    check_finished(r, batch_id, record_ttl_s=record_ttl_s)


def delete(r: redis.Redis, batch_id: str) -> list[str]:
    """Remove the batch and every item's record (running ones stop at their next step); returns the job ids, whose
    files the caller removes."""
    owner = r.hget(keys.batch(batch_id), "owner") or ""
    with r.pipeline(transaction=True) as pipe:
        pipe.delete(keys.batch_pending(batch_id))
        pipe.lrem(keys.BATCHES_ACTIVE, 0, batch_id)
        pipe.zrem(keys.BATCHES_OPEN, batch_id)
        pipe.execute()
    job_ids = [job_id for job_id, _, _ in items(r, batch_id)]
    for job_id in job_ids:
        store.delete_job(r, job_id)
    with r.pipeline(transaction=True) as pipe:
        pipe.delete(keys.batch(batch_id), keys.batch_items(batch_id), keys.batch_crc(batch_id))
        pipe.zrem(keys.owner_batches(owner), batch_id)
        pipe.execute()
    return job_ids


def list_batches(r: redis.Redis, owner: str, *, limit: int, after: str | None = None) -> tuple[list[dict], bool]:
    """One page of the owner's batches, newest first (keyset on the creation sequence); (batches, has_more).
    Index entries of batches that are gone (TTL) are dropped as met. Raises store.BadCursor for a foreign `after`."""
    index = keys.owner_batches(owner)
    if after is not None:
        score = r.zscore(index, after)
        if score is None:
            raise store.BadCursor(f"after: expected the id of one of your batches, found {after!r}")
        bound = f"({int(score)}"
    else:
        bound = "+inf"
    found: list[dict] = []
    while True:
        ids = r.zrevrangebyscore(index, bound, "-inf", start=0, num=limit + 1, withscores=True)
        if not ids:
            return found, False
        for batch_id, _ in ids:
            batch = load_batch(r, batch_id)
            if batch is None:
                r.zrem(index, batch_id)
                continue
            if len(found) == limit:
                return found, True
            found.append(batch)
        bound = f"({int(ids[-1][1])}"


def remember_crc(r: redis.Redis, batch_id: str, job_id: str, crc: int, size: int) -> None:
    """Keep the CRC-32 of an item's MP4 (with the size it was computed over) for later archive requests."""
    ttl = int(r.ttl(keys.batch(batch_id)))
    if ttl == -2:
        return  # the batch is gone (deleted while its archive was being served)
    with r.pipeline(transaction=True) as pipe:
        pipe.hset(keys.batch_crc(batch_id), job_id, f"{crc}:{size}")
        if ttl > 0:  # a finished batch's keys expire together
            pipe.expire(keys.batch_crc(batch_id), ttl)
        pipe.execute()


def known_crcs(r: redis.Redis, batch_id: str) -> dict[str, tuple[int, int]]:
    """job id → (CRC-32, size) computed so far for this batch's archive."""
    out = {}
    for job_id, text in r.hgetall(keys.batch_crc(batch_id)).items():
        crc, _, size = text.partition(":")
        out[job_id] = (int(crc), int(size or -1))
    return out


WEBHOOK_FIELDS = ("id", "object", "status", "counts", "progress", "created_at", "finished_at", "metadata",
                  "results_url", "archive_url")
"""What a `batch.completed` webhook body's `data` carries (never the owner)."""


def webhook_view(r: redis.Redis, batch_id: str) -> dict[str, Any] | None:
    """The batch as worker/webhook_delivery.py sends it, with its webhook_url and delivery log; None when gone."""
    batch = load_batch(r, batch_id)
    if batch is None:
        return None
    records = item_records(r, [job_id for job_id, _, _ in items(r, batch_id)])
    shown = summary(batch, records, workers=0)
    return {"id": batch_id, "object": "batch", "status": batch.get("status") or shown["status"],
            "counts": shown["counts"], "progress": shown["progress"], "created_at": batch["created_at"],
            "finished_at": batch["finished_at"], "metadata": batch["metadata"],
            "results_url": f"/batches/{batch_id}/results", "archive_url": f"/batches/{batch_id}/archive",
            "webhook_url": batch["webhook_url"], "webhook_deliveries": batch["webhook_deliveries"]}
