"""Every `H3BATCH_*` environment variable, declared once and read once at the edge into a frozen `Settings`.

`VARS` lists each variable with its default (as docs show it) and a doc line; docs/service.md's table is checked
against it by tests/h3batch/test_settings.py, which also greps the product code for any `H3BATCH_*` name missing here.
`Settings.from_env()` parses them all (a bad value raises `ConfigError` naming the variable, which the `h3batch`
commands print as one line before exiting 2); each process calls it at start and passes the object (or the part a
room needs: `WebhookSettings`, `RateLimits`, `SweepSettings`) down.

This module is the bottom floor: stdlib only, so the API, the worker, the kernels and the load runner can all read
their configuration from it without importing each other.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """Misconfiguration found at process start; the CLI prints the message as one line and exits 2."""


@dataclass(frozen=True)
class Var:
    """One environment variable: its name, the `Settings` field it fills, its default as docs show it, its meaning."""

    name: str
    field: str
    default: str
    doc: str
    room: str  # who reads it: service, worker, api, webhooks, kernels, loadrunner, client


# --- parsers: each takes the raw text (already stripped, never empty) and the variable name for its message ---

def _int_at_least(minimum: int, expected: str) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}: expected an integer, found {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"{name}: expected {expected}, found {value}")
        return value
    return parse


def _number(*, positive: bool) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name}: expected a number, found {raw!r}") from None
        if not 0 <= value < float("inf"):  # also refuses nan
            raise ConfigError(f"{name}: expected a number >= 0, found {raw!r}")
        if positive and value == 0:
            raise ConfigError(f"{name}: expected a number > 0, found {raw!r}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "an integer >= 0")
_beat_lock_ttl = _int_at_least(3, "at least 3 seconds")
_positive_float = _number(positive=True)
_non_negative_float = _number(positive=False)


def _flag(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected 1/0, true/false, yes/no or on/off, found {raw!r}")


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw.lower() not in allowed:
            raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, found {raw!r}")
        return raw.lower()
    return parse


def _ranks(name: str, raw: str) -> str:
    # "auto" needs torch to count GPUs, so the worker resolves it when the pipeline loads.
    if raw != "auto" and not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
        raise ConfigError(f"{name}: expected a positive integer or 'auto', found {raw!r}")
    return raw


DEBUG_OOM_STAGES = ("text_encode", "denoise", "decode", "mux")
"""Stages H3BATCH_DEBUG_OOM_AT may name: worker/pipeline.py STAGES (a test checks they agree)."""


def _oom_at(name: str, raw: str) -> tuple[str, int]:
    # `stage` or `stage:min_rows`: the injected CUDA out-of-memory error of worker/oom.py.
    stage, _, rows = raw.partition(":")
    if stage not in DEBUG_OOM_STAGES:
        raise ConfigError(f"{name}: expected <stage> or <stage>:<min rows> with stage one of "
                          f"{', '.join(DEBUG_OOM_STAGES)}, found {raw!r}")
    if not rows:
        return stage, 0
    if not (rows.isascii() and rows.isdigit()):
        raise ConfigError(f"{name}: expected a non-negative integer row count after ':', found {raw!r}")
    return stage, int(rows)


def _keys(name: str, raw: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in raw.split(",") if k.strip())


def _text(name: str, raw: str) -> str:
    return raw


def _path(name: str, raw: str) -> Path:
    return Path(raw)


WEBHOOK_SECRET_BYTES = (24, 64)
"""Key length range of a `whsec_` secret, as the Standard Webhooks specification sets it."""


def _webhook_secret(name: str, raw: str) -> str:
    # Checked here, at start, so a bad secret stops the API and every worker with one line instead of failing
    # inside the signer on every delivery attempt. The value itself never appears in the message.
    # A secret without the prefix is used as its UTF-8 bytes (docs/api.md), so only the whsec_ form has a format.
    if not raw.startswith("whsec_"):
        return raw
    try:
        key = base64.b64decode(raw[len("whsec_"):], validate=True)
    except binascii.Error:
        raise ConfigError(f"{name}: expected 'whsec_' followed by base64, found text after whsec_ that is not "
                          f"valid base64") from None
    low, high = WEBHOOK_SECRET_BYTES
    if not low <= len(key) <= high:
        raise ConfigError(f"{name}: expected a key of {low} to {high} bytes after whsec_, found {len(key)} bytes")
    return raw


_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""S3 bucket names: 3..63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit."""


def _artifact_store(name: str, raw: str) -> str:
    # `s3://BUCKET` or `s3://BUCKET/PREFIX`; normalised to `s3://bucket/prefix/` (prefix empty or ending in /).
    if not raw.startswith("s3://"):
        raise ConfigError(f"{name}: expected s3://BUCKET/PREFIX (unset: the local H3BATCH_ARTIFACTS_DIR), "
                          f"found {raw[:80]!r}")
    bucket, _, prefix = raw[len("s3://"):].partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(f"{name}: expected an S3 bucket name (3..63 of a-z 0-9 . -) after s3://, found {bucket!r}")
    prefix = prefix.strip("/")
    return f"s3://{bucket}/{prefix + '/' if prefix else ''}"


def _http_url(name: str, raw: str) -> str:
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", raw):
        raise ConfigError(f"{name}: expected an http:// or https:// URL, found {raw[:80]!r}")
    return raw.rstrip("/")


def _level(name: str, raw: str) -> str:
    value = raw.upper()
    if value not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"{name}: expected DEBUG, INFO, WARNING, ERROR or CRITICAL, found {raw!r}")
    return value


HUB_RELEASE_RE = re.compile(
    r"(?P<scheme>hf://)?(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<revision>[^\s@]+))?")
"""The Hub forms of H3BATCH_RELEASE / `--release`: `org/name`, `org/name@revision`, `hf://org/name@revision`."""


def is_hub_release(text: str) -> bool:
    """True when `text` names a Hub repo: it has a Hub form and is not an existing directory (a directory wins)."""
    return HUB_RELEASE_RE.fullmatch(text) is not None and not Path(text).is_dir()


COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def unpinned_release(text: str) -> str | None:
    """Why the Hub release `text` is not pinned to a commit (a branch, a tag, or no revision moves under a fleet), or
    None when it is pinned or is a local directory."""
    if not is_hub_release(text):
        return None
    revision = HUB_RELEASE_RE.fullmatch(text)["revision"]
    if revision and COMMIT_RE.fullmatch(revision):
        return None
    found = f"revision {revision!r}" if revision else "no revision (the branch main)"
    return f"expected org/name@<40-hex Hub commit>, found {found} in {text!r}"


LORA_ALLOW_ENTRY_RE = re.compile(
    r"(?:(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})=)?"
    r"(?:(?P<path>/\S*)|(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)@(?P<revision>[0-9a-f]{40}))")
"""One H3BATCH_LORA_ALLOW entry: `name=org/repo@<commit>`, `name=/absolute/folder` or a bare `org/repo@<commit>`."""


def _lora_allow(name: str, raw: str) -> tuple[str, ...]:
    # Kept as the entries' text; h3batch.core.loras.policy_of reads them. A folder needs a name to be asked by.
    entries = tuple(e.strip() for e in raw.split(",") if e.strip())
    for entry in entries:
        match = LORA_ALLOW_ENTRY_RE.fullmatch(entry)
        if match is None or (match["path"] and not match["name"]):
            raise ConfigError(f"{name}: expected name=org/repo@<40-hex commit>, name=/absolute/folder or "
                              f"org/repo@<40-hex commit>, found {entry[:120]!r}")
    return entries


# name, Settings field, default shown in docs, parser, room, doc line. Order: the table in docs/service.md.
_TABLE: tuple[tuple[str, str, str, Callable[[str, str], Any], str, str], ...] = (
    # service (API and worker)
    ("H3BATCH_REDIS_URL", "redis_url", "redis://127.0.0.1:6379/0", _text, "service",
     "Redis URL: Celery broker and job records (give h3batch its own DB)"),
    ("H3BATCH_ARTIFACTS_DIR", "artifacts_dir", "var/artifacts", _path, "service",
     "shared directory for MP4s (worker writes, API reads and deletes); with an s3:// artifact store, the worker's "
     "scratch space for the render in progress"),
    ("H3BATCH_ARTIFACT_STORE", "artifact_store", "(unset: H3BATCH_ARTIFACTS_DIR)", _artifact_store, "service",
     "where finished MP4s live: unset keeps them in H3BATCH_ARTIFACTS_DIR; `s3://BUCKET/PREFIX` puts them in "
     "S3-compatible object storage (credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
     "AWS_DEFAULT_REGION; the artifacts dir is then the worker's scratch space)"),
    ("H3BATCH_S3_ENDPOINT_URL", "s3_endpoint_url", "(unset: AWS S3)", _http_url, "service",
     "endpoint of a non-AWS S3-compatible store (MinIO, R2, ...), addressed path-style; presigned URLs name it, so "
     "clients must reach it"),
    ("H3BATCH_ARTIFACT_REDIRECT", "artifact_redirect", "0", _flag, "api",
     "with an s3:// store: GET .../content answers 307 to a presigned URL instead of streaming through the API"),
    ("H3BATCH_RELEASE", "release_dir", "var/tiny-release", _text, "service",
     "release the worker serves: a directory, or a Hub repo `org/name`, `org/name@revision`, "
     "`hf://org/name@revision` (fetched into the Hugging Face cache; see docs/model.md)"),
    ("H3BATCH_MAX_RUN_S", "max_run_s", "600", _positive_int, "service",
     "longest render: a job claimed longer ago fails `run_deadline`; visibility timeout is twice this"),
    ("H3BATCH_MAX_JOB_TIMEOUT_S", "max_job_timeout_s", "3600", _positive_int, "service",
     "largest `timeout_s` a job may ask for (seconds from its creation to its end; a job past it fails `timeout`); "
     "a larger one is 400 `invalid_request`"),
    ("H3BATCH_RESULT_TTL_S", "result_ttl_s", "86400", _positive_int, "service",
     "seconds a finished MP4 stays downloadable"),
    ("H3BATCH_MAX_QUEUED", "max_queued", "4000", _positive_int, "service",
     "queued jobs (batch items included) at which a create answers 503 queue_full; a batch must fit whole"),
    ("H3BATCH_MAX_ACTIVE_PER_KEY", "max_active_per_key", "1000", _positive_int, "service",
     "queued + running jobs (batch items included) one API key may have; a create past it answers 429 "
     "too_many_active_jobs (no limit with no API keys)"),
    ("H3BATCH_MAX_PROMPT_CHARS", "max_prompt_chars", "4000", _positive_int, "service", "longest prompt accepted"),
    ("H3BATCH_MAX_BATCH", "max_batch", "1000", _positive_int, "service",
     "most job requests one POST /batches may carry (400 batch_too_large above it)"),
    ("H3BATCH_INTERACTIVE_STREAK", "interactive_streak", "4", _positive_int, "worker",
     "most interactive jobs that start in a row while batch-lane work waits; then one batch job goes next, ahead of "
     "the interactive queue (the priority lanes' anti-starvation rule, docs/api.md \"Priority\")"),
    ("H3BATCH_LEASE_TTL_S", "lease_ttl_s", "30", _positive_float, "service",
     "a running job's lease lapses this long after its worker's last heartbeat (heartbeat period = min(5 s, "
     "TTL/3)); the reconciler then re-enqueues the job"),
    ("H3BATCH_RECONCILE_INTERVAL_S", "reconcile_interval_s", "10", _positive_float, "service",
     "how often one worker (under a lock) re-enqueues running jobs whose lease lapsed"),
    ("H3BATCH_LOG_FORMAT", "log_format", "kv", _choice("kv", "json"), "service",
     "`kv` (key=value lines) or `json` (JSON lines)"),
    ("H3BATCH_LOG_LEVEL", "log_level", "INFO", _level, "service", "Python log level"),
    # API
    ("H3BATCH_API_KEYS", "api_keys", "(unset: open API)", _keys, "api",
     "comma-separated Bearer keys; kept only as SHA-256 digests, never logged"),
    ("H3BATCH_RATE_CREATES_PER_MIN", "rate_creates_per_min", "60", _non_negative_int, "api",
     "job creations per minute per key (0: unlimited)"),
    ("H3BATCH_RATE_READS_PER_MIN", "rate_reads_per_min", "600", _non_negative_int, "api",
     "other requests per minute per key (0: unlimited)"),
    ("H3BATCH_API_THREADS", "api_threads", "64", _positive_int, "api",
     "request threads per gunicorn worker of `h3batch api` (`--threads` overrides); wait and stream slots leave a "
     "quarter of them to plain requests"),
    ("H3BATCH_WAIT_MAX", "wait_max", "32", _non_negative_int, "api",
     "concurrent long-poll waits (`?wait=N`, `Prefer: wait=N`) per API process; past it a wait answers at once"),
    ("H3BATCH_WAIT_MAX_PER_KEY", "wait_max_per_key", "16", _non_negative_int, "api",
     "concurrent long-poll waits per API key and process"),
    ("H3BATCH_SSE_MAX_STREAMS", "sse_max_streams", "16", _positive_int, "api",
     "concurrent SSE event streams per API process (503 too_many_streams past it)"),
    ("H3BATCH_SSE_MAX_STREAMS_PER_KEY", "sse_max_streams_per_key", "8", _positive_int, "api",
     "concurrent SSE event streams per API key and process"),
    ("H3BATCH_SSE_MAX_S", "sse_max_s", "300", _positive_float, "api",
     "longest one SSE stream stays open (the client reconnects with Last-Event-ID)"),
    ("H3BATCH_SSE_KEEPALIVE_S", "sse_keepalive_s", "15", _positive_float, "api",
     "seconds between SSE keep-alive comments"),
    ("H3BATCH_CANVAS", "canvas", "tiny", _choice("tiny", "v2"), "api",
     "canvas of the release the workers serve, for requests that leave the size out or give `aspect_ratio`: "
     "`tiny` (256x128, buckets at 256x128 pixels) or `v2` (1344x768, FastH3 V2's §7 buckets)"),
    ("H3BATCH_METRICS_TOKEN", "metrics_token", "(unset: loopback only)", _text, "api",
     "Bearer token GET /metrics requires (Prometheus' `authorization` credentials); unset, only loopback clients "
     "without proxy headers may scrape"),
    ("H3BATCH_DEFAULT_PRECISION", "default_precision", "bf16", _choice("bf16", "fp8"), "api",
     "precision a job gets when it asks for none: `bf16` (the release's semantics; such a job never lands on an "
     "fp8 worker) or `fp8` (the operator accepts fp8 output for jobs that do not ask); see docs/api.md \"Routing\""),
    ("H3BATCH_LORA_ALLOW", "lora_allow", "(unset: no per-job LoRAs)", _lora_allow, "service",
     "per-job LoRA allow-list, comma-separated: `name=org/repo@<40-hex commit>` (a Hub adapter a job names by "
     "`name`), `name=/absolute/folder` (one on the workers' disk) or `org/repo@<40-hex commit>` (a job names it by "
     "that reference); anything else in a job's `loras` gets 400 (docs/adapters.md)"),
    ("H3BATCH_MAX_LORAS", "max_loras", "4", _positive_int, "api",
     "most adapters one job may name in `loras` (400 too_many_loras above it)"),
    ("H3BATCH_OPENAI_MODEL", "openai_model", "FastVideo/FastVideo-FastH3-8-Step-V2", _text, "api",
     "the `model` name /v1/videos reports and accepts"),
    # worker
    ("H3BATCH_HF_CACHE", "hf_cache", "<release>/../hf-cache", _path, "worker",
     "Hugging Face cache holding the base VAE and a Hub release (for a Hub release the default is `$HF_HUB_CACHE`; "
     "set `HF_HUB_OFFLINE=1` to forbid downloads)"),
    ("H3BATCH_REQUIRE_PINNED_RELEASE", "require_pinned_release", "0", _flag, "worker",
     "refuse a Hub H3BATCH_RELEASE (worker start, `fetch-release`) whose revision is a branch, a tag or absent "
     "instead of a 40-hex commit, so every node of a fleet serves the same weights"),
    ("H3BATCH_REQUIRE_PINNED_BASE", "require_pinned_base", "0", _flag, "worker",
     "refuse a release whose provenance names its base model by a branch or tag instead of a 40-hex commit"),
    ("H3BATCH_DEVICE", "device", "(auto: cuda if present, else cpu)", _text, "worker",
     "torch device for the pipeline"),
    ("H3BATCH_RANKS", "ranks", "1", _ranks, "worker",
     "sequence-parallel ranks per worker: N resident processes, one GPU each (`auto`: every visible GPU); see "
     "docs/parallelism.md"),
    ("H3BATCH_TEXT_ENCODER_PLACEMENT", "text_encoder_placement", "auto",
     _choice("auto", "resident", "offload", "stream"), "worker",
     "where the text encoder's weights live between prompts: `auto` (the memory plan's choice: on the GPU when the "
     "longest clip fits beside it), `resident` (GPU), `offload` (host memory, copied to the GPU to encode), "
     "`stream` (host memory, one layer at a time on the GPU); see docs/performance.md"),
    ("H3BATCH_PRECISION", "precision", "bf16", _choice("bf16", "fp8"), "worker",
     "DiT precision of this worker: `bf16` (the release's semantics) or `fp8` (opt-in: the DiT block linears in "
     "e4m3 with row-wise scales, quantized once at load; needs a GPU of compute capability >= 8.9; error figures in "
     "docs/performance.md); advertised in its heartbeat, jobs route by it (docs/service.md \"Routing\")"),
    ("H3BATCH_ADAPTER", "adapter", "(unset: none)", _text, "worker",
     "the legacy FastH3 four-step adapter fused into the native release's DiT at start: a folder or a Hub repo "
     "`org/name@revision`; its own steps, sigmas and VSA top-k replace the release's; refused on a V2 release, and "
     "a tensor that lands on no parameter stops the worker naming its key (docs/adapters.md)"),
    ("H3BATCH_LORA_CACHE_MB", "lora_cache_mb", "2048", _positive_int, "worker",
     "bytes of per-job LoRA factors a worker keeps loaded (least recently used first out); a larger adapter fails "
     "its job"),
    ("H3BATCH_COMPILE_CACHE", "compile_cache", "(unset: the libraries' own per-user temp dirs)", _path, "worker",
     "persistent directory for the TorchInductor and Triton compile caches (mount a volume there: a restarted "
     "worker then skips recompiling; docs/deploy.md)"),
    ("H3BATCH_WORKER_NAME", "worker_name", "<hostname>-<pid>", _text, "worker",
     "worker name in heartbeats and job records"),
    ("H3BATCH_STALL_S", "stall_s", "60", _non_negative_float, "worker",
     "seconds a worker may sit idle while work waits before it exits to be restarted (0: never)"),
    ("H3BATCH_RENDER_STALL_S", "render_stall_s", "300", _non_negative_float, "worker",
     "run deadline: a render that reports no progress (stage or denoise step) for this long fails `run_deadline` "
     "(0: no stall limit; H3BATCH_MAX_RUN_S still bounds the whole run)"),
    ("H3BATCH_MIN_FREE_DISK_MB", "min_free_disk_mb", "1024", _non_negative_int, "worker",
     "free space H3BATCH_ARTIFACTS_DIR (render scratch; the MP4s with a local store) must have for the worker to "
     "take a job; below it, or after a write failed with ENOSPC/EDQUOT (the job then goes back to the queue), the "
     "worker takes no jobs and its heartbeat and /readyz say DISK_FULL with the reason until space is back "
     "(worker/disk.py; 0: no floor, a failed write still stops it)"),
    ("H3BATCH_DEBUG_STEP_DELAY_S", "debug_step_delay_s", "0", _non_negative_float, "worker",
     "test knob: the worker sleeps this long at each progress report (widens cancel windows in tests)"),
    ("H3BATCH_MAX_ROWS", "max_rows", "(memory plan, else the contract's largest request)", _positive_int, "worker",
     "largest request this worker serves, in DiT sequence rows (video + audio + 1024 text rows; docs/service.md "
     "\"Capacity\"): advertised in its heartbeat, larger requests get 422 `exceeds_worker_capacity`"),
    ("H3BATCH_DEBUG_OOM_AT", "debug_oom_at", "(unset: off)", _oom_at, "worker",
     "test knob: `<stage>` or `<stage>:<min rows>`: raise torch's CUDA out-of-memory error at that stage of "
     "every job of at least that many rows (the job fails `out_of_memory`; worker/oom.py)"),
    # webhooks (API vets URLs, workers deliver)
    ("H3BATCH_WEBHOOK_SECRET", "webhook_secret", "(unset: webhooks off)", _webhook_secret, "webhooks",
     "signing secret for webhook deliveries: `whsec_` + base64 of a 24..64-byte key (checked at start), or plain "
     "text used as its bytes"),
    ("H3BATCH_WEBHOOK_ALLOW_LOOPBACK", "webhook_allow_loopback", "0", _flag, "webhooks",
     "accept webhook URLs on loopback addresses (local testing only)"),
    ("H3BATCH_WEBHOOK_ALLOW_PRIVATE", "webhook_allow_private", "0", _flag, "webhooks",
     "accept webhook URLs on private-range addresses"),
    ("H3BATCH_WEBHOOK_MAX_ATTEMPTS", "webhook_max_attempts", "9", _positive_int, "webhooks",
     "delivery attempts before a webhook is given up"),
    ("H3BATCH_WEBHOOK_RETRY_BASE_S", "webhook_retry_base_s", "5", _positive_float, "webhooks",
     "first retry delay; each later one is 4x longer (capped at 10 h)"),
    ("H3BATCH_WEBHOOK_TIMEOUT_S", "webhook_timeout_s", "10", _positive_float, "webhooks",
     "timeout of one webhook POST"),
    # kernels
    ("H3BATCH_KERNEL_BACKEND", "kernel_backend", "(auto)", _choice("triton", "torch"), "kernels",
     "fused-op backend when a call leaves it open: `triton` or `torch`"),
    ("H3BATCH_MODULATION_PRECISION", "modulation_precision", "(auto)", _choice("generic", "sm90_bf16_affine"),
     "kernels", "rounding of the fused modulation ops: `generic` or `sm90_bf16_affine` (Hopper)"),
    # sparse attention (worker/h3/vsa_tk.py)
    ("H3BATCH_VSA_KERNEL", "vsa_kernel", "auto", _choice("auto", "flex", "tk"), "worker",
     "VSA on CUDA: `auto` (fastvideo-kernel's sm_90a kernel where it loads, else FlexAttention), `flex`, or `tk` "
     "(the kernel or an error)"),
    ("H3BATCH_VSA_PRELOAD", "vsa_preload", "(unset)", _text, "worker",
     "colon-separated shared libraries loaded RTLD_GLOBAL before the VSA kernel extension (docs/benchmarks.md)"),
    # load runner
    ("H3BATCH_SWEEP_RESULTS_DIR", "sweep_results_dir", "./sweep-results", _path, "loadrunner",
     "per-sweep directories: point reports, summary JSON/CSV, PNG plots"),
    ("H3BATCH_SWEEP_QUEUE", "sweep_queue", "loadrunner", _text, "loadrunner",
     "Celery queue consumed by `h3batch sweep-worker`"),
    ("H3BATCH_SWEEP_ALLOW_LOOPBACK", "sweep_allow_loopback", "0", _flag, "loadrunner",
     "accept POST /sweeps target URLs on loopback addresses (the local demo sets 1); vetted like webhook URLs"),
    ("H3BATCH_SWEEP_ALLOW_PRIVATE", "sweep_allow_private", "0", _flag, "loadrunner",
     "accept POST /sweeps target URLs on private-range addresses (a load target inside your network)"),
    ("H3BATCH_SWEEP_INPUTS_DIR", "sweep_inputs_dir", "<results dir>/inputs", _path, "loadrunner",
     "the named input set: a sweep's `input_wav` is the name of a WAV file in this directory (never a path)"),
    ("H3BATCH_SWEEP_SCHEDULE", "sweep_schedule", "(empty: no scheduled sweeps)", _text, "loadrunner",
     "beat schedule: JSON text, or a path to a JSON file"),
    ("H3BATCH_BEAT_LOCK_TTL_S", "beat_lock_ttl_s", "30", _beat_lock_ttl, "loadrunner",
     "expiry of the single-beat Redis lock; renewed every third of it"),
    ("H3BATCH_BEAT_SCHEDULE_FILE", "beat_schedule_file", "<results dir>/celerybeat-schedule", _path, "loadrunner",
     "celery beat's last-run state file"),
    # client CLI (`h3batch submit`)
    ("H3BATCH_API_URL", "api_url", "http://127.0.0.1:8000", _text, "client", "API base URL for `h3batch submit`"),
    ("H3BATCH_API_KEY", "api_key", "(unset)", _text, "client", "Bearer key `h3batch submit` sends"),
    # benchmarks
    ("H3BATCH_GIT_REV", "git_rev", "unknown", _text, "bench", "git revision recorded in benchmark JSON"),
)

VARS: tuple[Var, ...] = tuple(Var(name, fld, default, doc, room) for name, fld, default, _, room, doc in _TABLE)
"""Every variable, in the order docs/service.md lists them."""

BY_NAME: dict[str, Var] = {var.name: var for var in VARS}
_PARSERS: dict[str, Callable[[str, str], Any]] = {name: parse for name, _, _, parse, _, _ in _TABLE}


@dataclass(frozen=True)
class Settings:
    """Everything an h3batch process reads from its environment (field defaults = unset variables)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    artifacts_dir: Path = Path("var/artifacts")
    artifact_store: str = ""  # "" (local directory) or normalised "s3://bucket/prefix/"
    s3_endpoint_url: str | None = None
    artifact_redirect: bool = False
    release_dir: str = "var/tiny-release"  # a directory or a Hub reference (HUB_RELEASE_RE)
    max_run_s: int = 600
    max_job_timeout_s: int = 3600
    result_ttl_s: int = 86_400
    max_queued: int = 4000
    max_active_per_key: int = 1000
    max_prompt_chars: int = 4000
    max_batch: int = 1000
    interactive_streak: int = 4
    lease_ttl_s: float = 30.0
    reconcile_interval_s: float = 10.0
    log_format: str = "kv"
    log_level: str = "INFO"
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # secrets: never in repr or logs
    rate_creates_per_min: int = 60
    rate_reads_per_min: int = 600
    api_threads: int = 64
    wait_max: int = 32
    wait_max_per_key: int = 16
    sse_max_streams: int = 16
    sse_max_streams_per_key: int = 8
    sse_max_s: float = 300.0
    sse_keepalive_s: float = 15.0
    canvas: str = "tiny"
    metrics_token: str | None = field(default=None, repr=False)  # secret: never in repr or logs
    default_precision: str = "bf16"
    openai_model: str = "FastVideo/FastVideo-FastH3-8-Step-V2"
    lora_allow: tuple[str, ...] = ()
    max_loras: int = 4
    hf_cache: Path | None = None
    require_pinned_base: bool = False
    require_pinned_release: bool = False
    device: str | None = None
    ranks: str = "1"
    text_encoder_placement: str = "auto"
    precision: str = "bf16"
    adapter: str | None = None
    lora_cache_mb: int = 2048
    compile_cache: Path | None = None
    worker_name: str = ""
    stall_s: float = 60.0
    render_stall_s: float = 300.0
    min_free_disk_mb: int = 1024
    debug_step_delay_s: float = 0.0
    max_rows: int | None = None
    debug_oom_at: tuple[str, int] | None = None
    webhook_secret: str | None = field(default=None, repr=False)
    webhook_allow_loopback: bool = False
    webhook_allow_private: bool = False
    webhook_max_attempts: int = 9
    webhook_retry_base_s: float = 5.0
    webhook_timeout_s: float = 10.0
    kernel_backend: str | None = None
    modulation_precision: str | None = None
    vsa_kernel: str = "auto"
    vsa_preload: str | None = None
    sweep_results_dir: Path = Path("./sweep-results")
    sweep_queue: str = "loadrunner"
    sweep_allow_loopback: bool = False
    sweep_allow_private: bool = False
    sweep_inputs_dir: Path | None = None
    sweep_schedule: str = ""
    beat_lock_ttl_s: int = 30
    beat_schedule_file: Path | None = None
    api_url: str = "http://127.0.0.1:8000"
    api_key: str | None = field(default=None, repr=False)
    git_rev: str = "unknown"

    @property
    def hf_cache_dir(self) -> Path | None:
        """The HF cache to hand Pipeline.load: H3BATCH_HF_CACHE, else `hf-cache` beside a release directory, else
        (a Hub release) None: huggingface_hub's own cache."""
        if self.hf_cache is not None:
            return self.hf_cache
        return None if is_hub_release(self.release_dir) else Path(self.release_dir).parent / "hf-cache"

    @property
    def heartbeat_interval_s(self) -> float:
        """Heartbeat (and lease renewal) period: 5 s, or a third of a shorter lease so it never lapses mid-job."""
        return min(5.0, self.lease_ttl_s / 3)

    @property
    def visibility_timeout_s(self) -> int:
        """Broker redelivery timeout: twice the longest render, so a running job is never handed out again."""
        return 2 * self.max_run_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every variable of `VARS` from `env` (default: os.environ); unset or blank keeps the default."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for var in VARS:
            raw = env.get(var.name, "").strip()
            if raw:
                values[var.field] = _PARSERS[var.name](var.name, raw)
        if values.get("require_pinned_release") and (why := unpinned_release(values.get("release_dir", ""))):
            raise ConfigError(f"H3BATCH_RELEASE: {why} (H3BATCH_REQUIRE_PINNED_RELEASE is on)")
        if not values.get("worker_name"):
            values["worker_name"] = f"{socket.gethostname()}-{os.getpid()}"
        return cls(**values)


def raw_value(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The stripped text of one declared variable, None when unset or blank. Undeclared names raise KeyError."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not declared in h3batch.settings.VARS")
    raw = (os.environ if env is None else env).get(name, "").strip()
    return raw or None


def env_value(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The parsed value of one declared variable (None when unset), for code that must read it at call time
    rather than once at start (the local stack's overrides). Undeclared names raise KeyError."""
    raw = raw_value(name, env)
    return _PARSERS[name](name, raw) if raw is not None else None


def markdown_table() -> str:
    """The configuration table of docs/service.md, generated from VARS (`python -m h3batch.settings` prints it)."""
    rows = ["| Variable | Default | Read by | Meaning |", "|---|---|---|---|"]
    for var in VARS:
        default = var.default if var.default.startswith("(") or var.default.startswith("<") else f"`{var.default}`"
        rows.append(f"| `{var.name}` | {default} | {var.room} | {var.doc} |")
    return "\n".join(rows)


def _check_table() -> None:
    # Import-time self-check: the table and the dataclass name the same fields.
    declared = {var.field for var in VARS}
    dataclass_fields = {f.name for f in fields(Settings)}
    if declared != dataclass_fields:
        raise AssertionError(f"settings table and Settings differ: {sorted(declared ^ dataclass_fields)}")


_check_table()


if __name__ == "__main__":
    print(markdown_table())
