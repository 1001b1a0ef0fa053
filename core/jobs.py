"""Job records in Redis: create, read, list, progress, cancel, delete, and `transition`, the one function that changes
a job's status.

A record is the hash `h3b:job:{id}` (core/keys.py); the API and the worker both go through this module, so the
lifecycle below is enforced in one place:

    queued ──► in_progress ──► completed ──► expired
      │            │  ▲ (re-claim after worker loss, attempt+1)
      │            ├──┘
      │            ├──► failed
      ▼            ▼
    cancelled ◄────┘            (queued may also go straight to failed, e.g. enqueue_failed)

Multi-key updates (record + queue zset + index + done notification + TTL) run in one MULTI/EXEC under WATCH of the
record, so a concurrent cancel and claim cannot both win.
"""
from __future__ import annotations

import enum
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import redis

from h3batch.core import defaults, keys, lanes, metrics, usage


class JobStatus(str, enum.Enum):
    QUEUED = "queued"  # recorded and sent; waiting for a worker
    IN_PROGRESS = "in_progress"  # claimed by a worker holding its lease
    COMPLETED = "completed"  # MP4 published and downloadable until expires_at
    FAILED = "failed"  # error code and message on the record
    CANCELLED = "cancelled"  # by the client, at the next step boundary
    EXPIRED = "expired"  # completed, then its MP4 removed after the result TTL


class Stage(str, enum.Enum):
    QUEUED = "queued"
    TEXT_ENCODE = "text_encode"  # Qwen3-VL features of the prompt
    DENOISE = "denoise"  # 8 DiT forwards; step k/8 on the record
    DECODE = "decode"  # video and audio VAEs
    MUX = "mux"  # H.264 + AAC into the MP4
    FINALIZE = "finalize"  # publish the file, then complete


TERMINAL = frozenset({JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED})
"""Statuses after which nothing more happens (completed still may expire)."""
FINISHED = TERMINAL | {JobStatus.COMPLETED}
"""Statuses a blocking wait returns on, and for which cancel answers 409."""

ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.IN_PROGRESS, JobStatus.CANCELLED, JobStatus.FAILED}),
    # in_progress -> in_progress is a re-claim after worker loss (attempt + 1); in_progress -> queued is the
    # reaper (worker/reaper.py) handing a job whose lease lapsed back to the queue.
    JobStatus.IN_PROGRESS: frozenset({JobStatus.IN_PROGRESS, JobStatus.COMPLETED, JobStatus.FAILED,
                                      JobStatus.CANCELLED, JobStatus.QUEUED}),
    JobStatus.COMPLETED: frozenset({JobStatus.EXPIRED}),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
    JobStatus.EXPIRED: frozenset(),
}

# Field -> decoder for the hash's string values; fields not listed stay str.
_INT_FIELDS = {"step", "total_steps", "width", "height", "seed", "seq", "attempt", "frames", "size_bytes"}
_FLOAT_FIELDS = {"progress", "seconds", "created_at", "started_at", "finished_at", "expires_at", "timeout_s"}
_JSON_FIELDS = {"timings", "tokens", "error", "metadata", "webhook_deliveries", "inputs", "loras", "webhook_events"}
_EVENT_FIELDS = ("attempt", "stage", "progress", "error", "cancel_reason", "cancelled_at_stage")
"""Fields of a transition's update copied into its event."""


@dataclass(frozen=True)
class JobSpec:
    """What a client asked for, already validated at the door."""

    prompt: str
    seconds: float
    width: int
    height: int
    seed: int
    release: str | None = None
    owner: str = ""
    webhook_url: str | None = None  # vetted by h3batch.core.webhook_urls.check_url at the door
    webhook_events: tuple[str, ...] = ()  # which of WEBHOOK_EVENTS webhook_url gets; () = all of them
    api: str = "jobs"  # which view created it: "jobs" or "openai" (/v1/videos); picks webhook event names
    task: str = "t2va"  # core/routing.TASKS; with precision and the rows, names the job's render queue
    precision: str = "bf16"  # core/routing.PRECISIONS
    job_id: str | None = None  # chosen before the record when input images were stored under it (api/job_inputs.py)
    inputs: dict[str, Any] | None = None  # input image keys in the artifact store: first_frame, last_frame, references
    loras: tuple[dict[str, Any], ...] = ()  # core/loras.check_loras' records: ref, scale, repo+revision or path
    timeout_s: float | None = None  # finish within this many seconds of creation, else fail `timeout`
    priority: str = "interactive"  # core/lanes.Priority: `batch` holds the job for the feeder (core/lanes.py)



def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def random_seed() -> int:
    """A 63-bit seed (fits a signed int64 everywhere it travels)."""
    return secrets.randbits(63)


def _encode(fields: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, value in fields.items():
        if isinstance(value, enum.Enum):
            value = value.value
        if name in _JSON_FIELDS:
            out[name] = json.dumps(value)
        elif value is None:
            out[name] = ""
        elif isinstance(value, bool):
            out[name] = "1" if value else ""
        else:
            out[name] = str(value)
    return out


def decode_record(raw: dict[str, str]) -> dict[str, Any]:
    """A record from the hash's raw strings (for callers that read many records in one pipeline)."""
    return _decode(raw)


def _decode(raw: dict[str, str]) -> dict[str, Any]:
    job: dict[str, Any] = {}
    for name, text in raw.items():
        if text == "" and name not in ("prompt",):
            job[name] = None
        elif name in _INT_FIELDS:
            job[name] = int(text)
        elif name in _FLOAT_FIELDS:
            job[name] = float(text)
        elif name in _JSON_FIELDS:
            job[name] = json.loads(text)
        else:
            job[name] = text
    return job


EVENTS_KEPT = 1024
"""Events kept per job (approximate XADD MAXLEN): a reconnecting client replays from its Last-Event-ID."""
TERMINAL_EVENTS = frozenset({"completed", "failed", "cancelled"})
"""Event names after which a job's event stream ends."""
WEBHOOK_EVENTS = ("completed", "failed", "cancelled")
"""The events a job's webhook_url is sent (TERMINAL_EVENTS, in a fixed order); a job's `webhook_events` picks some."""


def _emit(pipe: redis.client.Pipeline, job_id: str, event: str, data: dict[str, Any]) -> None:
    """Queue an XADD of one job event on `pipe` (inside the caller's MULTI, so events and state never diverge)."""
    pipe.xadd(keys.events(job_id), {"event": event, "data": json.dumps(data, default=str)},
              maxlen=EVENTS_KEPT, approximate=True)


class QueueFull(Exception):
    """A create refused: the jobs queued (held batch items included) would pass `max_queued`; nothing was written."""


class TooManyActive(Exception):
    """A create refused: the owner's queued and running jobs would pass `max_active_per_key`; nothing was written."""


# One atomic step: refuse when the jobs queued (h3b:backlog: released and held batch items alike) number `cap`, or
# the owner's queued + running jobs number `per_key`; else number the job and write record, indexes, queue entries
# and first event; a job of the batch lane goes to the held lane set (and its member into the feeder's rotation)
# instead of the render queue (core/lanes.py). A check in Python before a MULTI lets concurrent creates all pass the
# check (issue 17 #9).
# KEYS: queue, seq, record, jobs index, owner index, owner-status(queued) index, events, status counters, backlog,
# owner-status(in_progress) index, held lane set, active batches. ARGV: cap (0: none), per-key cap (0: none), job id,
# event data, events kept, the lane's rotation member ('' for a job sent at once), then the record's field/value
# pairs. Returns the sequence, or -1 (cap) / -2 (per key).
_CREATE = """
local cap = tonumber(ARGV[1])
if cap > 0 and redis.call('zcard', KEYS[9]) >= cap then return -1 end
local per_key = tonumber(ARGV[2])
if per_key > 0 and redis.call('zcard', KEYS[6]) + redis.call('zcard', KEYS[10]) >= per_key then return -2 end
local seq = redis.call('incr', KEYS[2])
redis.call('hset', KEYS[3], 'seq', seq, unpack(ARGV, 7))
redis.call('zadd', KEYS[4], seq, ARGV[3])
redis.call('zadd', KEYS[5], seq, ARGV[3])
redis.call('zadd', KEYS[6], seq, ARGV[3])
if ARGV[6] ~= '' then
  redis.call('zadd', KEYS[11], seq, ARGV[3])
  if not redis.call('lpos', KEYS[12], ARGV[6]) then redis.call('rpush', KEYS[12], ARGV[6]) end
else
  redis.call('zadd', KEYS[1], seq, ARGV[3])
end
redis.call('zadd', KEYS[9], seq, ARGV[3])
redis.call('xadd', KEYS[7], 'MAXLEN', '~', ARGV[5], '*', 'event', 'status', 'data', ARGV[4])
redis.call('hincrby', KEYS[8], 'queued', 1)
return seq
"""


def optional_fields(spec: JobSpec) -> dict[str, Any]:
    """The record fields a spec carries only when set (a single job's and a batch item's record alike)."""
    fields: dict[str, Any] = {}
    if spec.webhook_url:
        fields["webhook_url"] = spec.webhook_url
    if spec.webhook_events:
        fields["webhook_events"] = list(spec.webhook_events)
    if spec.loras:
        fields["loras"] = list(spec.loras)
    if spec.inputs:
        fields["inputs"] = spec.inputs
    if spec.timeout_s:
        fields["timeout_s"] = spec.timeout_s
    return fields


def create_job(r: redis.Redis, spec: JobSpec, *, now: float | None = None, max_queued: int | None = None,
               max_active_per_key: int = 0) -> dict[str, Any]:
    """Write a queued record, index it and put it in the queue zsets (one Lua script); returns the record. A job of
    the batch lane is held instead (core/lanes.py): the caller then runs the feeder, not a send.

    With `max_queued`, raises QueueFull instead when that many jobs are queued (h3b:backlog, held batch items
    included); with `max_active_per_key`, TooManyActive when the owner has that many queued or running. Both are
    checked in the step that writes, so concurrent creates can never overshoot. The record exists before any Celery
    message does, so an immediate GET never 404s.
    """
    now = time.time() if now is None else now
    job_id = spec.job_id or new_job_id()
    record = {
        "id": job_id, "status": JobStatus.QUEUED, "stage": Stage.QUEUED, "step": 0,
        "total_steps": defaults.TOTAL_STEPS, "progress": 0.0, "prompt": spec.prompt, "seconds": spec.seconds,
        "width": spec.width, "height": spec.height, "seed": spec.seed, "release": spec.release,
        "owner": spec.owner, "created_at": now, "attempt": 0, "task": spec.task, "precision": spec.precision,
        "priority": spec.priority,
    }
    record.update(optional_fields(spec))
    if spec.api != "jobs":
        record["api"] = spec.api
    pairs = [item for field_value in _encode(record).items() for item in field_value]
    held = lanes.LANE_MEMBER if lanes.Priority(spec.priority) is lanes.Priority.BATCH else ""
    seq = r.eval(_CREATE, 12, keys.QUEUE, keys.SEQ, keys.job(job_id), keys.JOBS_INDEX, keys.owner_jobs(spec.owner),
                 keys.owner_status(spec.owner, JobStatus.QUEUED.value), keys.events(job_id), keys.METRICS_JOBS,
                 keys.BACKLOG, keys.owner_status(spec.owner, JobStatus.IN_PROGRESS.value), keys.LANE_BATCH,
                 keys.BATCHES_ACTIVE, max_queued or 0, max_active_per_key or 0, job_id,
                 json.dumps({"status": JobStatus.QUEUED.value}), EVENTS_KEPT, held, *pairs)
    if int(seq) == -1:
        raise QueueFull(f"{max_queued} jobs are queued")
    if int(seq) == -2:
        raise TooManyActive(f"{max_active_per_key} jobs of this key are queued or running")
    return load_job(r, job_id)  # type: ignore[return-value]


def load_job(r: redis.Redis, job_id: str) -> dict[str, Any] | None:
    """The decoded record, or None when there is none."""
    raw = r.hgetall(keys.job(job_id))
    return _decode(raw) if raw else None


def queue_position(r: redis.Redis, job_id: str) -> int | None:
    """1 = next to start; None when the job is not queued."""
    rank = r.zrank(keys.QUEUE, job_id)
    return None if rank is None else int(rank) + 1


def typical_render_s(r: redis.Redis) -> float | None:
    """Seconds a completed job took, on average over this service's life: the stage histogram's sums (one
    observation per stage per completed job, core/metrics.py) over the denoise count. None before any job completed."""
    stage_key = keys.metrics_histogram(metrics.STAGE_HISTOGRAM)
    fields = [f"{stage}{metrics.SEP}sum" for stage in metrics.STAGES] + [f"denoise{metrics.SEP}count"]
    *sums, count = r.hmget(stage_key, fields)
    if not count or int(count) < 1:
        return None
    return sum(float(v) for v in sums if v is not None) / int(count)


def eta_s(record: dict[str, Any], position: int | None, *, typical_s: float | None, workers: int,
          now: float) -> float | None:
    """Seconds until the job is likely finished, an estimate for a person watching; None when there is nothing to
    go on. Running: the time since it started, scaled by what is left of its progress (None before its first
    progress). Queued: the jobs ahead of it and itself, in rounds of `workers` at `typical_s` each (None before a
    job has completed or with no live worker). A finished job: None."""
    status = record.get("status")
    if status == JobStatus.IN_PROGRESS.value:
        progress, started = record.get("progress") or 0.0, record.get("started_at")
        if started is None or not 0.0 < progress < 1.0:
            return None
        return round(max(0.0, now - float(started)) * (1.0 - progress) / progress, 1)
    if status == JobStatus.QUEUED.value and position is not None and typical_s is not None and workers > 0:
        return round(-(-position // workers) * typical_s, 1)
    return None


def queued_count(r: redis.Redis) -> int:
    """Jobs queued now, held batch items included (what the queue cap counts)."""
    return int(r.zcard(keys.BACKLOG))


def transition(r: redis.Redis, job_id: str, to: JobStatus, *, expect: set[JobStatus] | frozenset | None = None,
               expect_attempt: int | None = None, fields: dict[str, Any] | None = None,
               record_ttl_s: int | None = None, now: float | None = None) -> dict[str, Any] | None:
    """Move a job to status `to`; the only writer of `status`. Returns the new record, or None if refused.

    Refused (None, nothing written) when: the record is gone; its status is not in `expect` (when given);
    `expect_attempt` differs from its attempt (a stale worker); or ALLOWED forbids the move.
    Steps, in one MULTI/EXEC under WATCH of the record:
      1. HSET status plus `fields` (and `finished_at` on a finished status);
      2. ZREM from the queue zsets (h3b:queue, h3b:backlog) when leaving `queued` (ZADD when requeued); ZADD to /
         ZREM from the running zset around `in_progress`;
      3. XADD a `status` event (`completed`, `failed` or `cancelled` for those) to the job's event stream;
      4. move the id from the owner's index of the old status to the new one's;
      5. on a finished status, EXPIRE record and stream after `record_ttl_s` (noting when in `h3b:expiry`, so the
         reaper can drop the index entries once the record is gone) and PUBLISH on its done channel;
      6. add to the metrics hashes (core/metrics.py: status and error counters, queue wait, stage durations);
      7. on a terminal status, count the job's usage once (core/usage.py), marking the record `usage_day`; and
         schedule its webhook when it has a `webhook_url` and its `webhook_events` (all when unset) include it.
    """
    key = keys.job(job_id)
    now = time.time() if now is None else now
    with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                current = pipe.hmget(key, ["status", "attempt", "seq", "owner", "created_at", "webhook_url",
                                           "webhook_events", "seconds", usage.MARKER])
                if current[0] is None:
                    pipe.unwatch()
                    return None
                status = JobStatus(current[0])
                attempt = int(current[1] or 0)
                if (expect is not None and status not in expect) or to not in ALLOWED[status] or (
                        expect_attempt is not None and attempt != expect_attempt):
                    pipe.unwatch()
                    return None
                update = dict(fields or {})
                update["status"] = to
                if to in FINISHED and to is not JobStatus.EXPIRED:
                    update.setdefault("finished_at", now)
                counted = to.value in usage.COUNTED and not current[8]  # the marker, read under this WATCH
                if counted:
                    update[usage.MARKER] = usage.day_of(now)
                # A job with a webhook_url gets its delivery queued in this same transaction: the key
                # keys.WEBHOOKS_DUE is all the two sides share (worker/webhook_delivery.py sends it).
                chosen = json.loads(current[6]) if current[6] else WEBHOOK_EVENTS
                hook = bool(current[5]) and to.value in TERMINAL_EVENTS and to.value in chosen
                pipe.multi()
                pipe.hset(key, mapping=_encode(update))
                if status is JobStatus.QUEUED:
                    pipe.zrem(keys.QUEUE, job_id)
                    pipe.zrem(keys.BACKLOG, job_id)
                elif to is JobStatus.QUEUED:  # requeued after worker loss: back in line at its creation sequence
                    pipe.zadd(keys.QUEUE, {job_id: int(current[2] or 0)})
                    pipe.zadd(keys.BACKLOG, {job_id: int(current[2] or 0)})
                if to is JobStatus.IN_PROGRESS:
                    pipe.zadd(keys.RUNNING, {job_id: now})
                elif status is JobStatus.IN_PROGRESS:
                    pipe.zrem(keys.RUNNING, job_id)
                owner = current[3] or ""
                if to is not status:
                    pipe.zrem(keys.owner_status(owner, status.value), job_id)
                    pipe.zadd(keys.owner_status(owner, to.value), {job_id: int(current[2] or 0)})
                event = to.value if to.value in TERMINAL_EVENTS else "status"
                payload = {"status": to.value, **{k: update[k] for k in _EVENT_FIELDS if k in update}}
                _emit(pipe, job_id, event, {k: (v.value if isinstance(v, enum.Enum) else v)
                                            for k, v in payload.items()})
                if to in FINISHED:
                    if record_ttl_s is not None:
                        pipe.expire(key, record_ttl_s)
                        pipe.expire(keys.events(job_id), record_ttl_s)
                        pipe.expire(keys.logs(job_id), record_ttl_s)
                        pipe.zadd(keys.EXPIRY, {f"{job_id}:{owner}": now + record_ttl_s})
                    pipe.publish(keys.done_channel(job_id), to.value)
                if hook:
                    pipe.zadd(keys.WEBHOOKS_DUE, {f"{job_id}:{to.value}": now})
                metrics.count_transition(pipe, status.value, to.value, update, attempt=attempt,
                                         created_at=float(current[4]) if current[4] else None, now=now)
                if counted:
                    usage.count(pipe, owner, to.value, seconds=float(current[7] or 0), timings=update.get("timings"),
                                now=now)
                pipe.execute()
                break
            except redis.WatchError:
                continue  # the record changed under us: re-read and decide again
    return load_job(r, job_id)


def update_progress(r: redis.Redis, job_id: str, attempt: int, fields: dict[str, Any]) -> bool:
    """Write stage/step/progress of a running job, with a `stage` event when the stage changes and a `progress`
    event; False (nothing written) when it is no longer this attempt's in_progress job."""
    key = keys.job(job_id)
    with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                status, current_attempt, stage = pipe.hmget(key, ["status", "attempt", "stage"])
                if status != JobStatus.IN_PROGRESS.value or int(current_attempt or 0) != attempt:
                    pipe.unwatch()
                    return False
                encoded = _encode(fields)
                pipe.multi()
                pipe.hset(key, mapping=encoded)
                if "stage" in encoded and encoded["stage"] != stage:
                    _emit(pipe, job_id, "stage", {"stage": encoded["stage"]})
                if "progress" in fields:
                    event = {"stage": encoded.get("stage", stage), "step": fields.get("step"),
                             "progress": fields["progress"]}
                    if "total_steps" in fields:  # once, when the worker learns the release's step count
                        event["total_steps"] = fields["total_steps"]
                    _emit(pipe, job_id, "progress", event)
                pipe.execute()
                return True
            except redis.WatchError:
                continue


def request_cancel(r: redis.Redis, job_id: str, *, reason: str = "user",
                   record_ttl_s: int | None = None) -> dict[str, Any] | None:
    """Cancel: a queued job becomes `cancelled` now; a running one gets `cancel_requested` for its worker to see.

    Returns the record after the change, or None when the job is gone. A finished job is returned unchanged
    (callers answer 409).
    """
    cancelled = transition(r, job_id, JobStatus.CANCELLED, expect={JobStatus.QUEUED},
                           fields={"cancel_reason": reason, "cancelled_at_stage": Stage.QUEUED},
                           record_ttl_s=record_ttl_s)
    if cancelled is not None:
        return cancelled
    key = keys.job(job_id)
    with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                status = pipe.hget(key, "status")
                if status is None:
                    pipe.unwatch()
                    return None
                if status == JobStatus.IN_PROGRESS.value:
                    pipe.multi()
                    pipe.hset(key, mapping={"cancel_requested": "1", "cancel_reason": reason})
                    pipe.execute()
                else:
                    pipe.unwatch()
                break
            except redis.WatchError:
                continue
    if status == JobStatus.QUEUED.value:  # raced with a claim between the two steps: try again
        return request_cancel(r, job_id, reason=reason, record_ttl_s=record_ttl_s)
    return load_job(r, job_id)


def cancel_requested(r: redis.Redis, job_id: str) -> bool:
    """Worker's step-boundary check: True once cancel was asked for, or when the record was deleted."""
    flag, status = r.hmget(keys.job(job_id), ["cancel_requested", "status"])
    return status is None or bool(flag) or status != JobStatus.IN_PROGRESS.value


def delete_job(r: redis.Redis, job_id: str) -> bool:
    """Remove the record and its index entries; a running job's worker sees the record gone and stops."""
    owner = r.hget(keys.job(job_id), "owner") or ""
    with r.pipeline(transaction=True) as pipe:
        pipe.delete(keys.job(job_id))
        _unindex(pipe, job_id, owner)
        pipe.zrem(keys.QUEUE, job_id)
        pipe.zrem(keys.BACKLOG, job_id)
        pipe.zrem(keys.RUNNING, job_id)
        pipe.delete(keys.events(job_id))
        pipe.delete(keys.logs(job_id))
        pipe.publish(keys.done_channel(job_id), "deleted")
        removed = pipe.execute()[0]
    return bool(removed)


def _unindex(pipe: redis.client.Pipeline, job_id: str, owner: str) -> None:
    """Queue the removal of a job id from every listing index (global, the owner's, each owner-status one)."""
    pipe.zrem(keys.JOBS_INDEX, job_id)
    pipe.zrem(keys.owner_jobs(owner), job_id)
    for status in JobStatus:
        pipe.zrem(keys.owner_status(owner, status.value), job_id)
    pipe.zrem(keys.EXPIRY, f"{job_id}:{owner}")


def prune_indexes(r: redis.Redis, *, now: float | None = None, batch: int = 500) -> list[str]:
    """Drop the index entries of finished jobs whose record has expired (the reaper's index pass); returns their
    ids. Looks only at `h3b:expiry` entries that are due, so a pass costs O(expired), not O(jobs)."""
    now = time.time() if now is None else now
    members = r.zrangebyscore(keys.EXPIRY, "-inf", now, start=0, num=batch)
    if not members:
        return []
    pairs = [tuple(member.split(":", 1)) if ":" in member else (member, "") for member in members]
    with r.pipeline(transaction=False) as pipe:
        for job_id, _ in pairs:
            pipe.exists(keys.job(job_id))
        alive = pipe.execute()
    gone = [(job_id, owner) for (job_id, owner), exists in zip(pairs, alive) if not exists]
    with r.pipeline(transaction=False) as pipe:
        for job_id, owner in gone:
            _unindex(pipe, job_id, owner)
        for (job_id, owner), exists in zip(pairs, alive):
            if exists:  # still there (its TTL ends a moment after the score, or a later transition renewed it): look again soon
                pipe.zadd(keys.EXPIRY, {f"{job_id}:{owner}": now + 2}, xx=True, gt=True)
        pipe.execute()
    return [job_id for job_id, _ in gone]


class BadCursor(ValueError):
    """`after` names no listed job."""


def list_jobs(r: redis.Redis, *, limit: int, after: str | None = None, order: str = "desc",
              status: JobStatus | None = None, owner: str | None = None) -> tuple[list[dict[str, Any]], bool]:
    """One page of jobs in creation order (keyset on the creation sequence); returns (jobs, has_more).

    With `owner` the page reads that owner's index (`h3b:owner:{owner}:jobs`, or its per-status index when `status`
    is given), so a page costs O(page) Redis work however many jobs other keys have. `after` is the last id of the
    previous page. Index entries whose record has expired are dropped as met.
    """
    if after is not None:
        score = r.zscore(keys.JOBS_INDEX, after)
        if score is None:
            raise BadCursor(f"after: expected the id of a listed job, found {after!r}")
        bound = f"({int(score)}"
    else:
        bound = "+inf" if order == "desc" else "-inf"
    if owner is None:
        index = keys.JOBS_INDEX
    else:
        index = keys.owner_status(owner, status.value) if status is not None else keys.owner_jobs(owner)
    found: list[dict[str, Any]] = []
    batch = limit + 1
    while True:
        if order == "desc":
            ids = r.zrevrangebyscore(index, bound, "-inf", start=0, num=batch, withscores=True)
        else:
            ids = r.zrangebyscore(index, bound, "+inf", start=0, num=batch, withscores=True)
        if not ids:
            return found, False
        with r.pipeline(transaction=False) as pipe:
            for job_id, _ in ids:
                pipe.hgetall(keys.job(job_id))
            raws = pipe.execute()
        for (job_id, _), raw in zip(ids, raws):
            if not raw:
                with r.pipeline(transaction=False) as pipe:
                    _unindex(pipe, job_id, owner or "")
                    pipe.execute()
                continue
            job = _decode(raw)
            if owner is not None and (job.get("owner") or "") != owner:
                continue
            if status is not None and job["status"] != status.value:
                continue
            if len(found) == limit:
                return found, True
            found.append(job)
        bound = f"({int(ids[-1][1])}"


# --- leases: which worker (and attempt) may render a job right now (spec §4) ---

# Compare-and-act on the lease value, so a worker never renews or drops a lease another worker now holds.
_RENEW_IF_OWNER = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) " \
                  "else return 0 end"
_DROP_IF_OWNER = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


def renew_lease(r: redis.Redis, job_id: str, holder: str, ttl_ms: int = defaults.LEASE_TTL_MS) -> bool:
    return bool(r.eval(_RENEW_IF_OWNER, 1, keys.lease(job_id), holder, ttl_ms))


def drop_lease(r: redis.Redis, job_id: str, holder: str) -> bool:
    return bool(r.eval(_DROP_IF_OWNER, 1, keys.lease(job_id), holder))


def claim_job(r: redis.Redis, job_id: str, worker: str, *, release_id: str, record_ttl_s: int,
              max_attempts: int = defaults.MAX_ATTEMPTS,
              lease_ttl_ms: int = defaults.LEASE_TTL_MS) -> tuple[dict[str, Any], str] | None:
    """Take a job for rendering: returns (record, lease holder) or None when this delivery must do nothing.

    1. Nothing to do if the record is gone or finished (cancelled while queued, deleted, a stale redelivery).
    2. An `in_progress` job whose lease is alive belongs to another worker: count the contention and skip.
       One whose lease lapsed lost its worker: re-claim with attempt + 1, or fail `worker_lost` past max_attempts.
    3. SET the lease NX, then `transition` to in_progress guarded by the attempt read in 1; drop the lease if
       that transition is refused.
    4. Count the start in its lane (core/lanes.count_start: the anti-starvation streak).
    """
    record = load_job(r, job_id)
    if record is None or record["status"] not in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value):
        return None
    previous = record.get("attempt") or 0
    if record["status"] == JobStatus.IN_PROGRESS.value:
        if r.exists(keys.lease(job_id)):
            r.hincrby(keys.STATS, "lease_contention", 1)
            return None
        if previous >= max_attempts:
            transition(r, job_id, JobStatus.FAILED, expect={JobStatus.IN_PROGRESS}, expect_attempt=previous,
                       fields={"error": {"code": "worker_lost", "message": f"the worker died {previous} times "
                                         f"while rendering this job", "retryable": True, "stage": record["stage"]}},
                       record_ttl_s=record_ttl_s)
            return None
    attempt = previous + 1
    holder = f"{worker}:{attempt}"
    if not r.set(keys.lease(job_id), holder, nx=True, px=lease_ttl_ms):
        r.hincrby(keys.STATS, "lease_contention", 1)
        return None
    fields: dict[str, Any] = {"attempt": attempt, "worker": worker, "release_id": release_id,
                              "stage": Stage.TEXT_ENCODE, "step": 0, "progress": 0.0}
    if record.get("started_at") is None:
        fields["started_at"] = time.time()
    claimed = transition(r, job_id, JobStatus.IN_PROGRESS, expect={JobStatus(record["status"])},
                         expect_attempt=previous, fields=fields)
    if claimed is None:
        drop_lease(r, job_id, holder)
        return None
    lanes.count_start(r, lanes.lane_of(claimed))
    return claimed, holder


def orphaned_running(r: redis.Redis) -> list[str]:
    """`in_progress` jobs whose lease lapsed: their worker died (or lost Redis) for longer than the lease TTL.

    Sending them a fresh render message lets `claim_job` re-claim with attempt + 1 (or fail `worker_lost`) long
    before the broker would redeliver the dead worker's unacked message (visibility timeout, 2 x max run).
    """
    ids = r.zrange(keys.RUNNING, 0, -1)
    if not ids:
        return []
    with r.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.exists(keys.lease(job_id))
        alive = pipe.execute()
    return [job_id for job_id, has_lease in zip(ids, alive) if not has_lease]
