"""Every Redis key h3batch uses, templated in one place so `redis-cli --scan --pattern 'h3b:*'` shows the lifecycle.

| key | type | holds |
|---|---|---|
| `h3b:job:{id}` | hash | the job record: status, stage, progress, times, timings, error, artifact (+ private owner, |
| | | sha256, traceback that the API never shows) |
| `h3b:jobs` | zset | every job id, score = creation sequence (admin view; pruned by the reaper) |
| `h3b:owner:{owner}:jobs` | zset | one API key's job ids, score = creation sequence; GET /jobs pages over it |
| `h3b:owner:{owner}:status:{status}` | zset | one key's job ids in one status (GET /jobs?status=), same score |
| `h3b:expiry` | zset | `{id}:{owner}` of finished jobs, score = when the record's TTL ends; the reaper drops index |
| | | entries of records that are gone |
| `h3b:queue` | zset | ids of `queued` jobs released to the workers, score = creation sequence; ZRANK + 1 = queue |
| | | position (a held batch item is not in it until the feeder releases it) |
| `h3b:backlog` | zset | every `queued` job, held batch items included, score = creation sequence: the queue cap |
| | | (`H3BATCH_MAX_QUEUED`) and the `h3batch_jobs_queued` gauge count it |
| `h3b:running` | zset | ids of `in_progress` jobs, score = claim time; the reconciler checks their leases |
| `h3b:reconcile` | string | lock (SET NX PX) so one worker at a time runs the reconciler |
| `h3b:seq` | string | INCR counter giving each job its creation sequence |
| `h3b:lease:{id}` | string | `worker:attempt` of the worker rendering the job (SET NX PX, renewed by heartbeat) |
| `h3b:events:{id}` | stream | the job's events (status, stage, progress, completed/failed/cancelled), ~1024 kept |
| `h3b:done:{id}` | pub/sub channel | a message when the job reaches a terminal status (wakes blocking waits) |
| `h3b:worker:{name}` | string (JSON) | heartbeat, TTL 15 s: release, state STARTING/READY/BUSY, job, model loads |
| `h3b:capacity` | hash | worker name → `{"max_rows", "ts"}` of its last heartbeat; POST /jobs refuses requests |
| | | over the largest live one (core/capacity.py); entries older than an hour are dropped |
| `h3b:idem:{owner}:{sha}` | string (JSON) | Idempotency-Key (sha = its SHA-256) → body fingerprint + job id, 24 h |
| `h3b:stats` | hash | counters: `model_loads` (one per Pipeline.load), `lease_contention` |
| `h3b:runs:{id}` | hash | per-job execution counters (`started`, `rendered`, `requeues`, `requeued_at`, `resent`); TTL like the record |
| `h3b:rate:{owner}:{bucket}` | hash | token bucket of one API key (`tokens`, `ts_ms`) |
| `h3b:batch:{id}` | hash | a batch: owner, created/finished times, metadata, skipped lines, webhook (core/batches.py) |
| `h3b:batch:{id}:items` | list | JSON `[job id, input index, custom_id]` per item, in input order |
| `h3b:batch:{id}:pending` | zset | items not yet released to the render queue, score = item index |
| `h3b:batch:{id}:crc` | hash | job id → CRC-32 of its MP4, computed once for the archive |
| `h3b:batches:active` | list | batches with pending items (and `jobs` while batch-lane single jobs are held); the |
| | | feeder takes one item per entry in turn |
| `h3b:lanes:batch` | zset | held single jobs of the batch lane, score = creation sequence (core/lanes.py) |
| `h3b:lanes:streak` | string | interactive starts in a row while batch work is held (the anti-starvation count) |
| `h3b:batches:open` | zset | unfinished batches (score = creation time); the reaper pass checks them for completion |
| `h3b:owner:{owner}:batches` | zset | one key's batch ids, score = creation sequence; GET /batches pages over it |
| `h3b:uploads:seen` | hash | multipart upload id → Unix time the garbage pass first saw it unfinished: uploads age by |
| | | this service's clock, never the store's (worker/reaper.py) |
| `h3b:metrics:jobs` | hash | counter per status: transitions into it (`queued` counts creations and requeues) |
| `h3b:metrics:errors` | hash | counter per error code of jobs that failed |
| `h3b:metrics:hist:{name}` | hash | histogram `stage`, `queue_wait` or `http`: per label set, the count in each bucket (not |
| | | cumulative), the sum and the count (field names: core/metrics.py; api/metrics.py reads them on scrape) |
| `h3b:metrics:http` | hash | counter per method, route and status of API requests (each API process adds its own) |
| `h3b:metrics:batches` | hash | counters: `created` batches, and finished ones per final status (core/batches.py) |
| `h3b:usage:{owner}:{day}` | hash | one key's usage on one UTC day (`YYYY-MM-DD`): jobs finished per status, video |
| | | and GPU seconds (core/usage.py), counted once per job at its terminal transition; GET /usage sums days |

Celery's own keys (`render` list, `_kombu.*`, `unacked*`) live beside these in the same DB; the load runner's Celery
app prefixes all of its own with `h3batch-lr:` (loadrunner/celery_app.py), so the two apps never share `unacked`.
"""
from __future__ import annotations

PREFIX = "h3b"

JOBS_INDEX = f"{PREFIX}:jobs"
QUEUE = f"{PREFIX}:queue"
BACKLOG = f"{PREFIX}:backlog"
RUNNING = f"{PREFIX}:running"
RECONCILE_LOCK = f"{PREFIX}:reconcile"
SEQ = f"{PREFIX}:seq"
STATS = f"{PREFIX}:stats"
WORKER_PATTERN = f"{PREFIX}:worker:*"
CAPACITY = f"{PREFIX}:capacity"
"""hash: worker name → JSON {max_rows, ts} of its latest heartbeat (core/capacity.py)."""
WEBHOOKS_DUE = f"{PREFIX}:webhooks:due"
"""zset of pending webhook deliveries: member `<job id>:<event>`, score = Unix time the next attempt is due.
Written by core/jobs.py::transition in the MULTI that finishes a job; read by worker/webhook_delivery.py."""


EXPIRY = f"{PREFIX}:expiry"
UPLOADS_SEEN = f"{PREFIX}:uploads:seen"
BATCHES_ACTIVE = f"{PREFIX}:batches:active"
BATCHES_OPEN = f"{PREFIX}:batches:open"
LANE_BATCH = f"{PREFIX}:lanes:batch"
LANE_STREAK = f"{PREFIX}:lanes:streak"

METRICS_JOBS = f"{PREFIX}:metrics:jobs"
METRICS_ERRORS = f"{PREFIX}:metrics:errors"
METRICS_HTTP = f"{PREFIX}:metrics:http"
METRICS_BATCHES = f"{PREFIX}:metrics:batches"


def metrics_histogram(name: str) -> str:
    return f"{PREFIX}:metrics:hist:{name}"  # hash: one histogram's bucket counts, sums and counts per label set


def owner_jobs(owner: str) -> str:
    return f"{PREFIX}:owner:{owner or '-'}:jobs"  # zset: one owner's job ids by creation sequence (list pages)


def owner_status(owner: str, status: str) -> str:
    return f"{PREFIX}:owner:{owner or '-'}:status:{status}"  # zset: one owner's job ids in one status


def job(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"  # hash: the job record


def lease(job_id: str) -> str:
    return f"{PREFIX}:lease:{job_id}"  # string `worker:attempt`, PX = lease TTL


def events(job_id: str) -> str:
    return f"{PREFIX}:events:{job_id}"  # stream: the job's event log (SSE reads it)


def logs(job_id: str) -> str:
    return f"{PREFIX}:logs:{job_id}"  # list: the worker's log lines about the job (worker/job_logs.py)


def done_channel(job_id: str) -> str:
    return f"{PREFIX}:done:{job_id}"  # pub/sub channel: the final status, for blocking waits


def idempotency(owner: str, key_sha256: str) -> str:
    return f"{PREFIX}:idem:{owner or '-'}:{key_sha256}"  # string: the job id an Idempotency-Key created


def worker(name: str) -> str:
    return f"{PREFIX}:worker:{name}"  # string (JSON heartbeat), EX = heartbeat TTL


def runs(job_id: str) -> str:
    return f"{PREFIX}:runs:{job_id}"  # hash: per-job counters (claims, renders, completions)


def rate_bucket(owner: str, bucket: str) -> str:
    return f"{PREFIX}:rate:{owner or '-'}:{bucket}"  # hash: one key's token bucket


def batch(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}"  # hash: the batch record


def batch_items(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}:items"  # list: JSON [job id, input index, custom_id] per item


def batch_pending(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}:pending"  # zset: items not yet released to the render queue


def batch_crc(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}:crc"  # hash: job id -> CRC-32 of its MP4


def usage(owner: str, day: str) -> str:
    return f"{PREFIX}:usage:{owner or '-'}:{day}"  # hash: one key's usage on one UTC day (core/usage.py)


def owner_batches(owner: str) -> str:
    return f"{PREFIX}:owner:{owner or '-'}:batches"  # zset: one owner's batch ids by creation sequence
