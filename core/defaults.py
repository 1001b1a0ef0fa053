"""Service tunables in one place; each constant has a doc line. Env vars (h3batch/settings.py) override some of them."""
from __future__ import annotations

REDIS_URL = "redis://127.0.0.1:6379/0"
"""Broker and job store. Give h3batch its own Redis DB: Celery's visibility timeout is per Redis, not per app."""

ARTIFACTS_DIR = "var/artifacts"
"""Where workers write MP4s and the API reads them (a shared volume in compose). Relative to the working dir."""

RELEASE_DIR = "var/tiny-release"
"""Release directory the worker serves (the tiny release by default, built by `h3batch build-tiny`)."""

RENDER_QUEUE = "render"
"""Celery queue consumed by GPU workers."""

RENDER_TASK = "h3batch.render"
"""Celery task name; the API sends by name so it never imports the worker's task module (or torch)."""

DEFAULT_SECONDS = 4.0
"""Clip length when a request leaves `seconds` out (the shortest the model supports)."""
DEFAULT_WIDTH = 256
"""Canvas width when a request leaves it out (small, so the tiny release renders fast on a CPU)."""
DEFAULT_HEIGHT = 128
"""Canvas height when a request leaves it out."""

TOTAL_STEPS = 8
"""Denoising steps of FastH3 8-Step V2; shown as `step`/`total_steps`."""

MAX_PROMPT_CHARS = 4000
"""Longest prompt accepted at the door (400 above it)."""

MAX_BODY_BYTES = 64 * 1024
"""Largest request body (413 above it), except on the routes below."""
MAX_JOB_BODY_BYTES = 48 * 1024 * 1024
"""Largest POST /jobs and POST /v1/videos body: room for fl2va's two keyframes or a few ref2va references (each image
at most 16 MiB, api/job_inputs.py), as multipart files or base64 data: URLs."""

MAX_QUEUED = 4000
"""Queued jobs (held batch items included) at which a create answers 503 queue_full (H3BATCH_MAX_QUEUED)."""
MAX_ACTIVE_PER_KEY = 1000
"""Queued + running jobs one API key may have (H3BATCH_MAX_ACTIVE_PER_KEY; 429 too_many_active_jobs): a quarter of
the queue, so one key cannot fill it for the others, and one whole batch of MAX_BATCH items fits."""

QUEUE_FULL_RETRY_AFTER_S = 30
"""Retry-After sent with 503 queue_full (the OpenAI SDK gives up above 120)."""

MAX_RUN_S = 600
"""Longest a render may run (past it the job fails `run_deadline`); the broker visibility timeout is 2x this."""

RENDER_STALL_S = 300.0
"""A render that reports no progress for this long fails `run_deadline` (H3BATCH_RENDER_STALL_S; worker/deadline.py)."""

RUN_STOP_GRACE_S = 5.0
"""After the run deadline fires, how long the render may take to reach a step boundary and stop before the worker
process exits to be replaced (a thread stuck in native code cannot be stopped from Python)."""

RESULT_TTL_S = 86_400
"""Seconds a finished job's MP4 stays downloadable (`expires_at` = finished_at + this)."""

RECORD_GRACE_S = 3_600
"""Extra seconds a finished job's record stays in Redis after its artifact expires (it then shows `expired`)."""

HEARTBEAT_INTERVAL_S = 5.0
"""How often a worker refreshes its heartbeat key (and the lease of the job it runs)."""

HEARTBEAT_TTL_S = 15
"""A worker whose heartbeat is older than this is not counted by /readyz."""

CAPACITY_MEMORY_S = 3_600
"""While no worker is live, the API refuses requests over the largest `max_rows` a worker advertised within this
many seconds (core/capacity.py); with nothing advertised that recently it accepts (the job waits in the queue)."""

LEASE_TTL_MS = 30_000
"""A running job's lease lapses this long after its worker's last heartbeat; a redelivered message may then retry."""

RECONCILE_INTERVAL_S = 10.0
"""How often a worker (one at a time, under a Redis lock) re-enqueues running jobs whose lease lapsed."""

MAX_ATTEMPTS = 3
"""Deliveries of one job after worker loss before it fails with `worker_lost`."""

LIST_DEFAULT_LIMIT = 20
"""Page size of GET /jobs when `limit` is left out."""
LIST_MAX_LIMIT = 100
"""Largest `limit` GET /jobs accepts."""

MAX_WAIT_S = 60
"""Longest blocking wait (`Prefer: wait=N` or `?wait=N`) one request may ask for."""

PROGRESS_AT_STAGE = {"queued": 0.0, "text_encode": 0.02, "denoise": 0.05, "decode": 0.88, "mux": 0.95,
                     "finalize": 0.98}
"""Progress (0..1) when a stage starts; denoise steps fill 0.05..0.85 evenly, `completed` is exactly 1.0."""
DENOISE_SPAN = 0.80
"""Share of progress the 8 denoise steps cover."""

MAX_BATCH = 1000
"""Most job requests one POST /batches may carry (H3BATCH_MAX_BATCH)."""
MAX_BATCH_BODY_BYTES = 16 * 1024 * 1024
"""Largest POST /batches body (JSON or the JSONL upload): 1000 requests of 4000-character prompts fit, with room."""
BATCH_METADATA_KEYS = 16
"""Most keys a batch's `metadata` object may carry (string values up to BATCH_METADATA_VALUE_CHARS)."""
BATCH_METADATA_VALUE_CHARS = 512

STAGE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                   3600.0)
"""Histogram bucket bounds (s) of the stage durations and the queue wait on /metrics (tiny CPU renders sit low,
H200 renders around 1-60 s, queue waits up to an hour; anything longer lands in +Inf)."""
HTTP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Histogram bucket bounds (s) of API request latency on /metrics (plain requests take milliseconds; long-poll
waits up to MAX_WAIT_S)."""
METRICS_FLUSH_S = 1.0
"""How often each API process adds its request counts to Redis (a scrape also flushes the process serving it)."""

PRESIGNED_URL_TTL_S = 300
"""Life of a presigned download URL (H3BATCH_ARTIFACT_REDIRECT=1): long enough to start a download, short enough
that a leaked link soon stops working. S3 checks it when the GET starts, so a slow download still finishes."""

STORE_PART_BYTES = 8 * 1024 * 1024
"""Part size of the multipart upload of an artifact to S3 (S3's minimum is 5 MiB for every part but the last)."""

STORE_CHUNK_BYTES = 256 * 1024
"""Chunk size when streaming an object from S3 through the API."""

USAGE_KEEP_DAYS = 400
"""Days a key's per-day usage hash (h3b:usage:{owner}:{day}) is kept after its last count: GET /usage reads back a
year and a month."""
USAGE_DEFAULT_DAYS = 30
"""GET /usage without `from`: the window starts this many days before `to`."""
USAGE_MAX_DAYS = 366
"""Widest GET /usage window, in UTC days (one HGETALL per day); a wider one is 400."""
