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
number is bounded by H3BATCH_MAX_QUEUED and the per-key rate limit). This is the `batch` lane of core/lanes.py: a
single job that asks for `priority: batch` is held the same way (its rotation entry is `jobs`), and the lanes'
anti-starvation rule releases one held job ahead of the interactive messages after H3BATCH_INTERACTIVE_STREAK
interactive starts in a row.

Limits (issue 26 item 1): every item counts as one job. A batch is admitted in the script that writes it, all or
none: its items must fit under the queue cap (H3BATCH_MAX_QUEUED, counted over `h3b:backlog`, every queued job held
or released), the owner's active-job cap (H3BATCH_MAX_ACTIVE_PER_KEY, queued + running) and the owner's `creates`
token bucket (one token per item). Held items therefore fill the queue cap like single jobs do; the render queue
`h3b:queue` still holds at most one released item per worker, which is what keeps single jobs from queueing behind a
batch. The reaper's "queued without a message" case reads `h3b:queue` only, so it never re-sends a held item, and
does re-send a released one whose message was lost (the feeder may die between releasing and sending: that case).

State changes of a batch (admit, cancel, finish, delete, an item's CRC) are each one script that first checks the
batch exists (a hash with its `id`), so a cancel or a finish check racing a DELETE writes nothing (issue 26 item 4);
its items change through jobs.transition, each atomically.

Who feeds: the API when it creates a batch, the worker after each job (worker/tasks.py) and on every heartbeat
(worker/heartbeat.py), so a lost trigger costs at most one heartbeat period. The release is one Lua script, so
concurrent feeders never over-fill. Batch completion (`check_finished`) runs after each of its jobs, after a cancel,
and in the reaper pass for all open batches; the first to see every item finished stamps `finished_at`, schedules
the `batch.completed` webhook (`<batch id>:batch.completed` in keys.WEBHOOKS_DUE) and sets the batch keys' TTL.
"""
from __future__ import annotations

import enum
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

import redis

from h3batch.core import defaults, keys, lanes, rate_bucket
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
    images: tuple = ()  # the line's checked input images (api/job_inputs.JobImage), stored before the batch is written


@dataclass(frozen=True)
class Admission:
    """The limits a batch is admitted under, all checked in the step that writes it (0: no such limit). Every item
    counts as one job: against the queue cap, the owner's active-job cap and the owner's `creates` bucket."""

    max_queued: int = 0
    """H3BATCH_MAX_QUEUED: jobs queued (h3b:backlog, held items included) after this batch may not pass it."""
    max_active_per_key: int = 0
    """H3BATCH_MAX_ACTIVE_PER_KEY: the owner's queued + running jobs after this batch may not pass it."""
    creates_per_min: int = 0
    """The owner's `creates` bucket (H3BATCH_RATE_CREATES_PER_MIN): one token per item; 0 when rate limits are off
    (or there are no API keys)."""


class Refused(Exception):
    """A batch not admitted (nothing written): `limit` names which (`queue_full`, `too_many_active_jobs`,
    `rate_limited`), `count` is what was found (queued jobs, active jobs, tokens left), `retry_after_s` when known."""

    def __init__(self, limit: str, count: float, retry_after_s: int | None = None):
        super().__init__(limit)
        self.limit, self.count, self.retry_after_s = limit, count, retry_after_s


# Admit and write a batch in one step (issue 26 item 1): refuse when its items would pass the queue cap (h3b:backlog
# counts held items too), the owner's active-job cap, or the owner's create budget (the bucket function of
# core/rate_bucket.py; checked last, so a refusal by a cap spends nothing); else the batch record, and per item a
# held job record (as jobs._CREATE writes one, but in the batch's pending zset instead of the render queue), its
# indexes and first event, then the metrics counts. KEYS: backlog, seq, jobs index, owner index, owner queued,
# owner in_progress, batch, items, pending, owner batches, active, open, metrics jobs, metrics batches, bucket.
# ARGV: cap, per-key cap, bucket cap, bucket refill per ms, tokens to spend, tokens needed, job key prefix, events
# key prefix, event data, events kept, batch id, item count, batch field entries (n, then n values), then per item:
# job id, items-list entry, field entries (n, then n values).
# Returns {0, batch seq} | {-1, queued} | {-2, active} | {-3, ms until enough tokens, tokens left (string)}.
_ADMIT = rate_bucket.TAKE_FUNCTION + """
local n = tonumber(ARGV[12])
local cap = tonumber(ARGV[1])
local queued = redis.call('zcard', KEYS[1])
if cap > 0 and queued + n > cap then return {-1, queued} end
local per_key = tonumber(ARGV[2])
local active = redis.call('zcard', KEYS[5]) + redis.call('zcard', KEYS[6])
if per_key > 0 and active + n > per_key then return {-2, active} end
local bucket = tonumber(ARGV[3])
if bucket > 0 and tonumber(ARGV[6]) > 0 then
  local allowed, tokens, wait_ms = bucket_take(KEYS[15], bucket, tonumber(ARGV[4]), tonumber(ARGV[5]),
                                               tonumber(ARGV[6]))
  if allowed == 0 then return {-3, wait_ms, tostring(tokens)} end
end
local at = 13
local count = tonumber(ARGV[at])
local batch_seq = redis.call('incr', KEYS[2])
redis.call('hset', KEYS[7], 'seq', batch_seq, unpack(ARGV, at + 1, at + count))
at = at + count + 1
for position = 0, n - 1 do
  local id = ARGV[at]
  local entry = ARGV[at + 1]
  count = tonumber(ARGV[at + 2])
  local seq = redis.call('incr', KEYS[2])
  redis.call('hset', ARGV[7] .. id, 'seq', seq, unpack(ARGV, at + 3, at + 2 + count))
  redis.call('zadd', KEYS[3], seq, id)
  redis.call('zadd', KEYS[4], seq, id)
  redis.call('zadd', KEYS[5], seq, id)
  redis.call('zadd', KEYS[1], seq, id)
  redis.call('zadd', KEYS[9], position, id)
  redis.call('rpush', KEYS[8], entry)
  redis.call('xadd', ARGV[8] .. id, 'MAXLEN', '~', ARGV[10], '*', 'event', 'status', 'data', ARGV[9])
  at = at + count + 3
end
redis.call('zadd', KEYS[10], batch_seq, ARGV[11])
redis.call('rpush', KEYS[11], ARGV[11])
redis.call('zadd', KEYS[12], redis.call('hget', KEYS[7], 'created_at'), ARGV[11])
redis.call('hincrby', KEYS[14], 'created', 1)
if n > 0 then redis.call('hincrby', KEYS[13], 'queued', n) end
return {0, batch_seq}
"""


def create_batch(r: redis.Redis, owner: str, items: list[Item], *, metadata: dict[str, Any] | None = None,
                 skipped: list[dict[str, Any]] | None = None, webhook_url: str | None = None,
                 now: float | None = None, limits: Admission = Admission()) -> str:
    """Admit the batch under `limits` and write it with all its items (held, see the module docstring) in one
    script; returns its id. Raises Refused (nothing written) when a limit would be passed."""
    now = time.time() if now is None else now
    batch_id = new_batch_id()
    event = json.dumps({"status": JobStatus.QUEUED.value})
    batch_fields = {"id": batch_id, "owner": owner, "created_at": repr(now), "total": str(len(items)),
                    "metadata": json.dumps(metadata or {}), "skipped": json.dumps(skipped or []),
                    "webhook_url": webhook_url or ""}
    argv: list[Any] = [len(batch_fields) * 2, *[x for pair in batch_fields.items() for x in pair]]
    for item in items:
        spec = item.spec
        job_id = spec.job_id or store.new_job_id()
        record: dict[str, Any] = {
            "id": job_id, "status": JobStatus.QUEUED, "stage": Stage.QUEUED, "step": 0,
            "total_steps": defaults.TOTAL_STEPS, "progress": 0.0, "prompt": spec.prompt, "seconds": spec.seconds,
            "width": spec.width, "height": spec.height, "seed": spec.seed, "release": spec.release,
            "owner": owner, "created_at": now, "attempt": 0, "batch_id": batch_id, "batch_index": item.index,
            "task": spec.task, "precision": spec.precision, "priority": lanes.Priority.BATCH}
        record.update(store.optional_fields(spec))
        if item.custom_id is not None:
            record["custom_id"] = item.custom_id
        pairs = [x for pair in store._encode(record).items() for x in pair]
        argv += [job_id, json.dumps([job_id, item.index, item.custom_id or ""]), len(pairs), *pairs]
    cost, need = len(items), min(len(items), limits.creates_per_min)
    found = r.eval(_ADMIT, 15, keys.BACKLOG, keys.SEQ, keys.JOBS_INDEX, keys.owner_jobs(owner),
                   keys.owner_status(owner, JobStatus.QUEUED.value),
                   keys.owner_status(owner, JobStatus.IN_PROGRESS.value), keys.batch(batch_id),
                   keys.batch_items(batch_id), keys.batch_pending(batch_id), keys.owner_batches(owner),
                   keys.BATCHES_ACTIVE, keys.BATCHES_OPEN, keys.METRICS_JOBS, keys.METRICS_BATCHES,
                   keys.rate_bucket(owner, "creates"), limits.max_queued, limits.max_active_per_key,
                   limits.creates_per_min, limits.creates_per_min / 60_000, cost, need, keys.job(""),
                   keys.events(""), event, EVENTS_KEPT, batch_id, len(items), *argv)
    code = int(found[0])
    if code == -1:
        raise Refused("queue_full", int(found[1]))
    if code == -2:
        raise Refused("too_many_active_jobs", int(found[1]))
    if code == -3:
        raise Refused("rate_limited", float(found[2]), max(1, -(-int(found[1]) // 1000)))
    return batch_id


def load_batch(r: redis.Redis, batch_id: str) -> dict[str, Any] | None:
    """The batch hash decoded (metadata, skipped, webhook_deliveries as JSON; times as floats), or None."""
    raw = r.hgetall(keys.batch(batch_id))
    if not raw.get("id"):
        return None  # none, or a stub an older cancel left behind a DELETE (issue 26 item 4): no batch
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


# Release held items into idle capacity, one per entry of the rotation in turn (see the module docstring); first,
# when the interactive streak has reached `every`, one held item whatever the capacity, stamped `promoted_at`
# (core/lanes.py: the anti-starvation rule), and the streak starts again.
# KEYS: queue, running, active batches, held lane set, streak. ARGV: capacity, most to release, key prefix, the lane
# set's rotation member, every (0: no promotion), now. Returns the released ids, a promoted one first.
_FEED = """
local function pending_of(b)
  if b == ARGV[4] then return KEYS[4] end
  return ARGV[3] .. 'batch:' .. b .. ':pending'
end
-- one held item from the next entry of the rotation: its id; false when this look found none (an item cancelled
-- while held, or an entry with nothing left, which leaves the rotation); nil when the rotation is empty
local function take()
  local b = redis.call('lmove', KEYS[3], KEYS[3], 'LEFT', 'RIGHT')
  if not b then return nil end
  local popped = redis.call('zpopmin', pending_of(b))
  if #popped == 0 then
    redis.call('lrem', KEYS[3], 0, b)
    return false
  end
  local job = ARGV[3] .. 'job:' .. popped[1]
  if redis.call('hget', job, 'status') ~= 'queued' then return false end
  redis.call('zadd', KEYS[1], redis.call('hget', job, 'seq'), popped[1])
  return popped[1]
end
local most = tonumber(ARGV[2])
local out = {}
local looks = 0
local every = tonumber(ARGV[5])
if every > 0 and tonumber(redis.call('get', KEYS[5]) or '0') >= every then
  redis.call('set', KEYS[5], 0)
  while looks < 4 * most + 64 do
    looks = looks + 1
    local id = take()
    if id == nil then break end
    if id then
      redis.call('hset', ARGV[3] .. 'job:' .. id, 'promoted_at', ARGV[6])
      out[1] = id
      break
    end
  end
end
local free = tonumber(ARGV[1]) - redis.call('zcard', KEYS[1]) - redis.call('zcard', KEYS[2])
while free > 0 and #out < most and looks < 4 * most + 64 do
  looks = looks + 1
  local id = take()
  if id == nil then break end
  if id then
    out[#out + 1] = id
    free = free - 1
  end
end
return out
"""


def feed(r: redis.Redis, send: Callable[[str], None], *, capacity: int | None = None,
         interactive_streak: int = 0) -> list[str]:
    """Release held batch-lane jobs (batch items, held single jobs) into idle capacity and send their render
    messages; returns their ids.

    `capacity` defaults to the live workers. `interactive_streak` (H3BATCH_INTERACTIVE_STREAK; the worker's feeds
    pass it, 0 turns the rule off) is the anti-starvation rule of core/lanes.py: once that many interactive jobs
    started in a row while batch work was held, one held job is released whatever the capacity, and sent ahead of
    the interactive messages waiting. A send that fails leaves the item in `h3b:queue` without a message: the reaper
    re-sends it after its grace period.
    """
    capacity = ready_workers(r) if capacity is None else capacity
    if capacity <= 0:
        return []
    released = r.eval(_FEED, 5, keys.QUEUE, keys.RUNNING, keys.BATCHES_ACTIVE, keys.LANE_BATCH, keys.LANE_STREAK,
                      capacity, _FEED_MAX, keys.PREFIX + ":", lanes.LANE_MEMBER, interactive_streak,
                      repr(time.time()))
    for job_id in released:
        send(job_id)
    return list(released)


# Stamp a batch finished, in one step with the check that every item has finished: the batch must exist (a record
# with its `id`: never a stub) and be unstamped; then finished_at, its final status, out of the open and active sets,
# the TTL of its keys, the batch.completed due-entry and the metrics count. A concurrent DELETE either ran before
# (nothing found: nothing written) or runs after (it removes what this wrote).
# KEYS: batch, items, pending, crc, open, active, webhooks due, metrics batches. ARGV: batch id, now, TTL, job key
# prefix, webhook member.
_FINISH = """
if redis.call('hexists', KEYS[1], 'id') == 0 or redis.call('hexists', KEYS[1], 'finished_at') == 1 then
  return 0
end
for _, raw in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do
  local status = redis.call('hget', ARGV[4] .. cjson.decode(raw)[1], 'status')
  if status == 'queued' or status == 'in_progress' then return 0 end
end
local status = 'completed'
if redis.call('hget', KEYS[1], 'cancel_requested') == '1' then status = 'cancelled' end
redis.call('hset', KEYS[1], 'finished_at', ARGV[2], 'status', status)
redis.call('zrem', KEYS[5], ARGV[1])
redis.call('lrem', KEYS[6], 0, ARGV[1])
for i = 1, 4 do redis.call('expire', KEYS[i], ARGV[3]) end
if (redis.call('hget', KEYS[1], 'webhook_url') or '') ~= '' then redis.call('zadd', KEYS[7], ARGV[2], ARGV[5]) end
redis.call('hincrby', KEYS[8], status, 1)
return 1
"""


def check_finished(r: redis.Redis, batch_id: str, *, record_ttl_s: int, now: float | None = None) -> bool:
    """Stamp the batch finished once every item is: `finished_at`, its final status, the `batch.completed` webhook
    when it has a webhook_url, the TTL of its keys and the finished count (core/metrics.py's `h3b:metrics:batches`),
    all in one script with the check. Returns True only for the call that stamped it; a deleted batch is left alone."""
    now = time.time() if now is None else now
    return bool(r.eval(_FINISH, 8, keys.batch(batch_id), keys.batch_items(batch_id), keys.batch_pending(batch_id),
                       keys.batch_crc(batch_id), keys.BATCHES_OPEN, keys.BATCHES_ACTIVE, keys.WEBHOOKS_DUE,
                       keys.METRICS_BATCHES, batch_id, repr(now), record_ttl_s, keys.job(""),
                       f"{batch_id}:{BATCH_COMPLETED}"))


def after_job(r: redis.Redis, job_id: str, send: Callable[[str], None], *, record_ttl_s: int,
              interactive_streak: int = 0) -> None:
    """A worker finished (or gave up) `job_id`: top up the render queue, and finish its batch if it was the last."""
    feed(r, send, interactive_streak=interactive_streak)
    batch_id = r.hget(keys.job(job_id), "batch_id")
    if batch_id:
        check_finished(r, batch_id, record_ttl_s=record_ttl_s)


def check_open(r: redis.Redis, *, record_ttl_s: int) -> list[str]:
    """The reaper pass's batch step: finish every open batch whose items are all finished; returns their ids."""
    return [b for b in r.zrange(keys.BATCHES_OPEN, 0, -1) if check_finished(r, b, record_ttl_s=record_ttl_s)]


class CancelOutcome(str, enum.Enum):
    GONE = "gone"  # no such batch (deleted, expired)
    FINISHED = "finished"  # already stamped finished: nothing to cancel
    REQUESTED = "requested"  # marked cancelled; its unfinished items were cancelled or asked to stop


# Mark a batch cancelled, only if it exists and has not finished: no more releases (pending dropped, out of the
# active rotation). Returns 0 gone, -1 finished, 1 marked. KEYS: batch, pending, active. ARGV: batch id.
_CANCEL = """
if redis.call('hexists', KEYS[1], 'id') == 0 then return 0 end
if redis.call('hexists', KEYS[1], 'finished_at') == 1 then return -1 end
redis.call('hset', KEYS[1], 'cancel_requested', '1')
redis.call('del', KEYS[2])
redis.call('lrem', KEYS[3], 0, ARGV[1])
return 1
"""


def cancel(r: redis.Redis, batch_id: str, *, record_ttl_s: int) -> CancelOutcome:
    """Cancel what has not finished: no more releases, held and queued items cancelled now, running ones at their
    next step boundary (core/jobs.request_cancel); the batch finishes as `cancelled` once they have.

    The batch-level change is one script that writes nothing when the batch is gone or finished (a cancel racing a
    DELETE once left a stub hash that check_finished then stamped, with a 24 h TTL and a metrics count). The items
    change through jobs.transition, each atomically; one deleted meanwhile is skipped (its record is gone)."""
    marked = int(r.eval(_CANCEL, 3, keys.batch(batch_id), keys.batch_pending(batch_id), keys.BATCHES_ACTIVE,
                        batch_id))
    if marked <= 0:
        return CancelOutcome.GONE if marked == 0 else CancelOutcome.FINISHED
    job_ids = [job_id for job_id, _, _ in items(r, batch_id)]
    for job_id, record in zip(job_ids, item_records(r, job_ids)):
        if record is not None and record["status"] in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value):
            store.request_cancel(r, job_id, reason="batch_cancelled", record_ttl_s=record_ttl_s)
    check_finished(r, batch_id, record_ttl_s=record_ttl_s)
    return CancelOutcome.REQUESTED


# Remove a batch's own keys and index entries in one step, only if it exists and belongs to `owner`; returns its
# items (JSON entries) or nil. KEYS: batch, items, pending, crc, active, open, owner's batches. ARGV: id, owner.
_DELETE = """
if redis.call('hexists', KEYS[1], 'id') == 0 or (redis.call('hget', KEYS[1], 'owner') or '') ~= ARGV[2] then
  return false
end
local entries = redis.call('lrange', KEYS[2], 0, -1)
redis.call('del', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.call('lrem', KEYS[5], 0, ARGV[1])
redis.call('zrem', KEYS[6], ARGV[1])
redis.call('zrem', KEYS[7], ARGV[1])
return entries
"""


def delete(r: redis.Redis, batch_id: str, owner: str) -> list[str] | None:
    """Remove the batch (one script: record, items list, pending set, CRCs, every index) and then every item's
    record (running ones stop at their next step); returns the job ids, whose files the caller removes, or None when
    there was no such batch of `owner` (gone already: a concurrent DELETE, expired)."""
    entries = r.eval(_DELETE, 7, keys.batch(batch_id), keys.batch_items(batch_id), keys.batch_pending(batch_id),
                     keys.batch_crc(batch_id), keys.BATCHES_ACTIVE, keys.BATCHES_OPEN, keys.owner_batches(owner),
                     batch_id, owner)
    if entries is None:
        return None
    job_ids = [json.loads(raw)[0] for raw in entries]
    for job_id in job_ids:  # the batch is gone already: a cancel or finish check finds nothing to write
        store.delete_job(r, job_id)
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


# Write an item's CRC only while its batch exists, with the batch's TTL (a finished batch's keys expire together).
# KEYS: batch, crc. ARGV: job id, "crc:size".
_REMEMBER_CRC = """
if redis.call('hexists', KEYS[1], 'id') == 0 then return 0 end
redis.call('hset', KEYS[2], ARGV[1], ARGV[2])
local ttl = redis.call('ttl', KEYS[1])
if ttl > 0 then redis.call('expire', KEYS[2], ttl) end
return 1
"""


def remember_crc(r: redis.Redis, batch_id: str, job_id: str, crc: int, size: int) -> None:
    """Keep the CRC-32 of an item's MP4 (with the size it was computed over) for later archive requests; nothing
    when the batch is gone (deleted while its archive was being served)."""
    r.eval(_REMEMBER_CRC, 2, keys.batch(batch_id), keys.batch_crc(batch_id), job_id, f"{crc}:{size}")


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
