"""Every `H3BATCH_*` environment variable, declared once as a field of the frozen `Settings` and read once at the edge.

pydantic-settings does the reading: `Settings` is a `BaseSettings` with env_prefix `H3BATCH_`, so the field
`max_run_s` is the variable H3BATCH_MAX_RUN_S (H3BATCH_RELEASE, the one name that is not its field's, is an alias),
and pydantic turns the text into the field's type and checks the constraint its annotation carries (`PositiveInt`,
`Literal[...]`, a pattern). Each field's default, description and room (who reads it) generate docs/service.md's
table (`python -m h3batch.settings` prints it; tests/h3batch/test_settings.py checks it and greps the product code for
any `H3BATCH_*` name not declared here). `VARS` lists the variables in that order for code that needs the names.

`Settings.from_env()` reads them all (a bad value raises `ConfigError` naming the variable, which the `h3batch`
commands print as one line before exiting 2); each process calls it at start and passes the object (or the part a
room builds from it: `WebhookSettings`, `SweepSettings`, the API's rate limits) down. A bare `Settings(**fields)`
reads no environment: it is the defaults plus what it is given, for tests and for code that wants the defaults.

Hand-written, and why:
- `_one_line`: pydantic's `ValidationError` is several lines, quotes the input (a secret too) and speaks of fields;
  the operator gets `H3BATCH_MAX_RUN_S: expected ..., found ...`, one line, with a secret's value never in it.
- `_EnvSource` (pydantic-settings' environment source): it also reads a given mapping (tests, `env_value`), and only
  the declared names as written (pydantic-settings would also take `h3batch_max_run_s`), stripped, blank = unset.
- The checks pydantic has no type for: a `whsec_` webhook secret (base64 and the Standard Webhooks key length,
  checked at start so a bad secret stops every process with one line, never echoing it), the `s3://` artifact store
  (bucket rules, normalised to the form the store code expects), the LoRA allow-list grammar (shared with
  core/loras.py), the debug out-of-memory switch, the Hub release forms and the pinned-release rule across two
  variables. Flags take the eight documented words only (pydantic's bool would also take t/f/y/n).
- The checks of the host (Redis reachable, directories writable, a release on disk) are not parsing: they stay in
  h3batch.core.startup_checks, which the commands run after `from_env()`.

This module is the bottom floor: the standard library and pydantic-settings only, so the API, the worker, the
kernels and the load runner can all read their configuration from it without importing each other.
"""
from __future__ import annotations

import base64
import binascii
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict


class ConfigError(ValueError):
    """Misconfiguration found at process start; the CLI prints the message as one line and exits 2."""


@dataclass(frozen=True)
class Var:
    """One environment variable: its name, the `Settings` field it fills, its default as docs show it, its meaning."""

    name: str
    field: str
    default: str
    doc: str
    room: str  # who reads it: service, worker, api, webhooks, kernels, loadrunner, client, bench


ROOMS = ("service", "api", "worker", "webhooks", "kernels", "loadrunner", "client", "bench")


# --- the kinds of value: pydantic types and constraints, with the words a ConfigError uses for them ---

@dataclass(frozen=True)
class Expect:
    """What a constrained kind of value expects, as its ConfigError says it ("expected a positive integer")."""

    text: str


PositiveInt = Annotated[int, Field(ge=1), Expect("a positive integer")]
NonNegativeInt = Annotated[int, Field(ge=0), Expect("an integer >= 0")]
BeatLockTTL = Annotated[int, Field(ge=3), Expect("at least 3 seconds")]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False), Expect("a number > 0")]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False), Expect("a number >= 0")]
Ranks = Annotated[str, Field(pattern=r"^(auto|0*[1-9][0-9]*)$"), Expect("a positive integer or 'auto'")]
"""`auto` stays text: it needs torch to count GPUs, so the worker resolves it when the pipeline loads."""

_LOWER = BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v)
"""Choices are case-insensitive: `JSON` is `json`."""

LogLevel = Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                     BeforeValidator(lambda v: v.upper() if isinstance(v, str) else v)]

_FLAG_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")


def _flag_word(value: Any) -> Any:
    # Restricts pydantic's bool, which would also take t/f/y/n, to the eight words h3batch has always taken.
    if isinstance(value, str) and value.lower() not in _FLAG_WORDS:
        raise ValueError(f"expected 1/0, true/false, yes/no or on/off, found {value[:80]!r}")
    return value


Flag = Annotated[bool, BeforeValidator(_flag_word)]


def _comma_list(value: Any) -> Any:
    # `a, b,` -> ("a", "b"); NoDecode keeps pydantic-settings from reading the text as JSON first.
    return tuple(k.strip() for k in value.split(",") if k.strip()) if isinstance(value, str) else value


CommaList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)]

_URL_RE = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"
HttpURL = Annotated[str | None, Field(pattern=_URL_RE), AfterValidator(lambda v: v.rstrip("/") if v else v),
                    Expect("an http:// or https:// URL")]


DEBUG_OOM_STAGES = ("text_encode", "denoise", "decode", "mux")
"""Stages H3BATCH_DEBUG_OOM_AT may name: worker/pipeline.py STAGES (a test checks they agree)."""


def _oom_at(value: Any) -> Any:
    # `stage` or `stage:min_rows`: the injected CUDA out-of-memory error of worker/oom.py.
    if not isinstance(value, str):
        return value
    stage, _, rows = value.partition(":")
    if stage not in DEBUG_OOM_STAGES:
        raise ValueError(f"expected <stage> or <stage>:<min rows> with stage one of {', '.join(DEBUG_OOM_STAGES)}, "
                         f"found {value[:80]!r}")
    if rows and not (rows.isascii() and rows.isdigit()):
        raise ValueError(f"expected a non-negative integer row count after ':', found {value[:80]!r}")
    return stage, int(rows or 0)


OomAt = Annotated[tuple[str, int] | None, NoDecode, BeforeValidator(_oom_at)]

WEBHOOK_SECRET_BYTES = (24, 64)
"""Key length range of a `whsec_` secret, as the Standard Webhooks specification sets it."""


def _webhook_secret(value: str | None) -> str | None:
    # Checked here, at start, so a bad secret stops the API and every worker with one line instead of failing
    # inside the signer on every delivery attempt. The value itself never appears in the message.
    # A secret without the prefix is used as its UTF-8 bytes (docs/api.md), so only the whsec_ form has a format.
    if value is None or not value.startswith("whsec_"):
        return value
    try:
        key = base64.b64decode(value[len("whsec_"):], validate=True)
    except binascii.Error:
        raise ValueError("expected 'whsec_' followed by base64, found text after whsec_ that is not valid "
                         "base64") from None
    low, high = WEBHOOK_SECRET_BYTES
    if not low <= len(key) <= high:
        raise ValueError(f"expected a key of {low} to {high} bytes after whsec_, found {len(key)} bytes")
    return value


WebhookSecret = Annotated[str | None, AfterValidator(_webhook_secret)]

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""S3 bucket names: 3..63 lower-case letters, digits, dots and hyphens, starting and ending with a letter or digit."""


def _artifact_store(value: str) -> str:
    # `s3://BUCKET` or `s3://BUCKET/PREFIX`; normalised to `s3://bucket/prefix/` (prefix empty or ending in /).
    # "" is the unset default: the local H3BATCH_ARTIFACTS_DIR.
    if not value:
        return value
    if not value.startswith("s3://"):
        raise ValueError(f"expected s3://BUCKET/PREFIX (unset: the local H3BATCH_ARTIFACTS_DIR), found {value[:80]!r}")
    bucket, _, prefix = value[len("s3://"):].partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"expected an S3 bucket name (3..63 of a-z 0-9 . -) after s3://, found {bucket!r}")
    prefix = prefix.strip("/")
    return f"s3://{bucket}/{prefix + '/' if prefix else ''}"


ArtifactStore = Annotated[str, AfterValidator(_artifact_store)]


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


def _lora_allow(entries: tuple[str, ...]) -> tuple[str, ...]:
    # Kept as the entries' text; h3batch.core.loras.policy_of reads them. A folder needs a name to be asked by.
    for entry in entries:
        match = LORA_ALLOW_ENTRY_RE.fullmatch(entry)
        if match is None or (match["path"] and not match["name"]):
            raise ValueError(f"expected name=org/repo@<40-hex commit>, name=/absolute/folder or "
                             f"org/repo@<40-hex commit>, found {entry[:120]!r}")
    return entries


LoraAllow = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list), AfterValidator(_lora_allow)]


def _var(default: Any, room: str, doc: str, *, shown: str | None = None, secret: bool = False,
         alias: str | None = None) -> Any:
    """One variable's field: its default (a function: computed per `Settings`), who reads it, its doc line; `shown`
    is the default as docs show it where the value is not literal (`(unset: ...)`, `<release>/../hf-cache`); a
    secret is left out of repr; `alias` is the variable's name where it is not H3BATCH_ + the field's."""
    where = {"default_factory": default} if callable(default) else {"default": default}
    return Field(**where, description=doc, repr=not secret, validation_alias=alias,
                 json_schema_extra={"room": room, "shown": shown})


def _host_and_pid() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Everything an h3batch process reads from its environment, in the order docs/service.md lists it (field
    defaults = unset variables)."""

    model_config = SettingsConfigDict(
        env_prefix="H3BATCH_",
        env_ignore_empty=True,
        frozen=True,
        extra="forbid",
        validate_by_name=True,  # Settings(release_dir=...) as well as the alias H3BATCH_RELEASE
        validate_default=False,  # defaults are the unset state ("" store, None secret), not values to check
    )

    # service (API and worker)
    redis_url: str = _var("redis://127.0.0.1:6379/0", "service",
        "Redis URL: Celery broker and job records (give h3batch its own DB)")
    artifacts_dir: Path = _var(Path("var/artifacts"), "service",
        "shared directory for MP4s (worker writes, API reads and deletes); with an s3:// artifact store, the "
        "worker's scratch space for the render in progress")
    artifact_store: ArtifactStore = _var("", "service",
        "where finished MP4s live: unset keeps them in H3BATCH_ARTIFACTS_DIR; `s3://BUCKET/PREFIX` puts them "
        "in S3-compatible object storage (credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
        "AWS_DEFAULT_REGION; the artifacts dir is then the worker's scratch space)",
        shown="(unset: H3BATCH_ARTIFACTS_DIR)")
    s3_endpoint_url: HttpURL = _var(None, "service",
        "endpoint of a non-AWS S3-compatible store (MinIO, R2, ...), addressed path-style; presigned URLs name "
        "it, so clients must reach it", shown="(unset: AWS S3)")
    artifact_redirect: Flag = _var(False, "api",
        "with an s3:// store: GET .../content answers 307 to a presigned URL instead of streaming through the "
        "API")
    release_dir: str = _var("var/tiny-release", "service",
        "release the worker serves: a directory, or a Hub repo `org/name`, `org/name@revision`, "
        "`hf://org/name@revision` (fetched into the Hugging Face cache; see docs/model.md)", alias="H3BATCH_RELEASE")
    max_run_s: PositiveInt = _var(600, "service",
        "longest render: a job claimed longer ago fails `run_deadline`; visibility timeout is twice this")
    max_job_timeout_s: PositiveInt = _var(3600, "service",
        "largest `timeout_s` a job may ask for (seconds from its creation to its end; a job past it fails "
        "`timeout`); a larger one is 400 `invalid_request`")
    result_ttl_s: PositiveInt = _var(86400, "service", "seconds a finished MP4 stays downloadable")
    max_queued: PositiveInt = _var(4000, "service",
        "queued jobs (batch items included) at which a create answers 503 queue_full; a batch must fit whole")
    max_active_per_key: PositiveInt = _var(1000, "service",
        "queued + running jobs (batch items included) one API key may have; a create past it answers 429 "
        "too_many_active_jobs (no limit with no API keys)")
    max_prompt_chars: PositiveInt = _var(4000, "service", "longest prompt accepted")
    max_batch: PositiveInt = _var(1000, "service",
        "most job requests one POST /batches may carry (400 batch_too_large above it)")
    interactive_streak: PositiveInt = _var(4, "worker",
        "most interactive jobs that start in a row while batch-lane work waits; then one batch job goes next, "
        'ahead of the interactive queue (the priority lanes\' anti-starvation rule, docs/api.md "Priority")')
    lease_ttl_s: PositiveFloat = _var(30.0, "service",
        "a running job's lease lapses this long after its worker's last heartbeat (heartbeat period = min(5 s, "
        "TTL/3)); the reconciler then re-enqueues the job")
    reconcile_interval_s: PositiveFloat = _var(10.0, "service",
        "how often one worker (under a lock) re-enqueues running jobs whose lease lapsed")
    log_format: Annotated[Literal["kv", "json"], _LOWER] = _var("kv", "service",
        "`kv` (key=value lines) or `json` (JSON lines)")
    log_level: LogLevel = _var("INFO", "service", "Python log level")
    # API
    api_keys: CommaList = _var((), "api",
        "comma-separated Bearer keys; kept only as SHA-256 digests, never logged",
        shown="(unset: open API)", secret=True)
    rate_creates_per_min: NonNegativeInt = _var(60, "api", "job creations per minute per key (0: unlimited)")
    rate_reads_per_min: NonNegativeInt = _var(600, "api", "other requests per minute per key (0: unlimited)")
    api_threads: PositiveInt = _var(64, "api",
        "request threads per gunicorn worker of `h3batch api` (`--threads` overrides); wait and stream slots "
        "leave a quarter of them to plain requests")
    wait_max: NonNegativeInt = _var(32, "api",
        "concurrent long-poll waits (`?wait=N`, `Prefer: wait=N`) per API process; past it a wait answers at "
        "once")
    wait_max_per_key: NonNegativeInt = _var(16, "api", "concurrent long-poll waits per API key and process")
    sse_max_streams: PositiveInt = _var(16, "api",
        "concurrent SSE event streams per API process (503 too_many_streams past it)")
    sse_max_streams_per_key: PositiveInt = _var(8, "api", "concurrent SSE event streams per API key and process")
    sse_max_s: PositiveFloat = _var(300.0, "api",
        "longest one SSE stream stays open (the client reconnects with Last-Event-ID)")
    sse_keepalive_s: PositiveFloat = _var(15.0, "api", "seconds between SSE keep-alive comments")
    canvas: Annotated[Literal["tiny", "v2"], _LOWER] = _var("tiny", "api",
        "canvas of the release the workers serve, for requests that leave the size out or give `aspect_ratio`: "
        "`tiny` (256x128, buckets at 256x128 pixels) or `v2` (1344x768, FastH3 V2's §7 buckets)")
    metrics_token: str | None = _var(None, "api",
        "Bearer token GET /metrics requires (Prometheus' `authorization` credentials); unset, only loopback "
        "clients without proxy headers may scrape", shown="(unset: loopback only)", secret=True)
    default_precision: Annotated[Literal["bf16", "fp8"], _LOWER] = _var("bf16", "api",
        "precision a job gets when it asks for none: `bf16` (the release's semantics; such a job never lands on "
        "an fp8 worker) or `fp8` (the operator accepts fp8 output for jobs that do not ask); see docs/api.md "
        '"Routing"')
    lora_allow: LoraAllow = _var((), "service",
        "per-job LoRA allow-list, comma-separated: `name=org/repo@<40-hex commit>` (a Hub adapter a job names "
        "by `name`), `name=/absolute/folder` (one on the workers' disk) or `org/repo@<40-hex commit>` (a job "
        "names it by that reference); anything else in a job's `loras` gets 400 (docs/adapters.md)",
        shown="(unset: no per-job LoRAs)")
    max_loras: PositiveInt = _var(4, "api", "most adapters one job may name in `loras` (400 too_many_loras above it)")
    openai_model: str = _var("FastVideo/FastVideo-FastH3-8-Step-V2", "api",
        "the `model` name /v1/videos reports and accepts")
    # worker
    hf_cache: Path | None = _var(None, "worker",
        "Hugging Face cache holding the base VAE and a Hub release (for a Hub release the default is "
        "`$HF_HUB_CACHE`; set `HF_HUB_OFFLINE=1` to forbid downloads)", shown="<release>/../hf-cache")
    require_pinned_release: Flag = _var(False, "worker",
        "refuse a Hub H3BATCH_RELEASE (worker start, `fetch-release`) whose revision is a branch, a tag or "
        "absent instead of a 40-hex commit, so every node of a fleet serves the same weights")
    require_pinned_base: Flag = _var(False, "worker",
        "refuse a release whose provenance names its base model by a branch or tag instead of a 40-hex commit")
    device: str | None = _var(None, "worker",
        "torch device for the pipeline", shown="(auto: cuda if present, else cpu)")
    ranks: Ranks = _var("1", "worker",
        "sequence-parallel ranks per worker: N resident processes, one GPU each (`auto`: every visible GPU); "
        "see docs/parallelism.md")
    text_encoder_placement: Annotated[Literal["auto", "resident", "offload", "stream"], _LOWER] = _var("auto", "worker",
        "where the text encoder's weights live between prompts: `auto` (the memory plan's choice: on the GPU "
        "when the longest clip fits beside it), `resident` (GPU), `offload` (host memory, copied to the GPU to "
        "encode), `stream` (host memory, one layer at a time on the GPU); see docs/performance.md")
    precision: Annotated[Literal["bf16", "fp8"], _LOWER] = _var("bf16", "worker",
        "DiT precision of this worker: `bf16` (the release's semantics) or `fp8` (opt-in: the DiT block linears "
        "in e4m3 with row-wise scales, quantized once at load; needs a GPU of compute capability >= 8.9; error "
        "figures in docs/performance.md); advertised in its heartbeat, jobs route by it (docs/service.md "
        '"Routing")')
    adapter: str | None = _var(None, "worker",
        "the legacy FastH3 four-step adapter fused into the native release's DiT at start: a folder or a Hub "
        "repo `org/name@revision`; its own steps, sigmas and VSA top-k replace the release's; refused on a V2 "
        "release, and a tensor that lands on no parameter stops the worker naming its key (docs/adapters.md)",
        shown="(unset: none)")
    lora_cache_mb: PositiveInt = _var(2048, "worker",
        "bytes of per-job LoRA factors a worker keeps loaded (least recently used first out); a larger adapter "
        "fails its job")
    compile_cache: Path | None = _var(None, "worker",
        "persistent directory for the TorchInductor and Triton compile caches (mount a volume there: a "
        "restarted worker then skips recompiling; docs/deploy.md)",
        shown="(unset: the libraries' own per-user temp dirs)")
    worker_name: str = _var(_host_and_pid, "worker", "worker name in heartbeats and job records",
                            shown="<hostname>-<pid>")
    stall_s: NonNegativeFloat = _var(60.0, "worker",
        "seconds a worker may sit idle while work waits before it exits to be restarted (0: never)")
    render_stall_s: NonNegativeFloat = _var(300.0, "worker",
        "run deadline: a render that reports no progress (stage or denoise step) for this long fails "
        "`run_deadline` (0: no stall limit; H3BATCH_MAX_RUN_S still bounds the whole run)")
    min_free_disk_mb: NonNegativeInt = _var(1024, "worker",
        "free space H3BATCH_ARTIFACTS_DIR (render scratch; the MP4s with a local store) must have for the "
        "worker to take a job; below it, or after a write failed with ENOSPC/EDQUOT (the job then goes back to "
        "the queue), the worker takes no jobs and its heartbeat and /readyz say DISK_FULL with the reason until "
        "space is back (worker/disk.py; 0: no floor, a failed write still stops it)")
    debug_step_delay_s: NonNegativeFloat = _var(0.0, "worker",
        "test knob: the worker sleeps this long at each progress report (widens cancel windows in tests)")
    max_rows: PositiveInt | None = _var(None, "worker",
        "largest request this worker serves, in DiT sequence rows (video + audio + 1024 text rows; "
        'docs/service.md "Capacity"): advertised in its heartbeat, larger requests get 422 '
        "`exceeds_worker_capacity`", shown="(memory plan, else the contract's largest request)")
    debug_oom_at: OomAt = _var(None, "worker",
        "test knob: `<stage>` or `<stage>:<min rows>`: raise torch's CUDA out-of-memory error at that stage of "
        "every job of at least that many rows (the job fails `out_of_memory`; worker/oom.py)", shown="(unset: off)")
    # webhooks (API vets URLs, workers deliver)
    webhook_secret: WebhookSecret = _var(None, "webhooks",
        "signing secret for webhook deliveries: `whsec_` + base64 of a 24..64-byte key (checked at start), or "
        "plain text used as its bytes", shown="(unset: webhooks off)", secret=True)
    webhook_allow_loopback: Flag = _var(False, "webhooks",
        "accept webhook URLs on loopback addresses (local testing only)")
    webhook_allow_private: Flag = _var(False, "webhooks", "accept webhook URLs on private-range addresses")
    webhook_max_attempts: PositiveInt = _var(9, "webhooks", "delivery attempts before a webhook is given up")
    webhook_retry_base_s: PositiveFloat = _var(5.0, "webhooks",
        "first retry delay; each later one is 4x longer (capped at 10 h)")
    webhook_timeout_s: PositiveFloat = _var(10.0, "webhooks", "timeout of one webhook POST")
    # kernels
    kernel_backend: Annotated[Literal["triton", "torch"] | None, _LOWER] = _var(None, "kernels",
        "fused-op backend when a call leaves it open: `triton` or `torch`", shown="(auto)")
    modulation_precision: Annotated[Literal["generic", "sm90_bf16_affine"] | None, _LOWER] = _var(None, "kernels",
        "rounding of the fused modulation ops: `generic` or `sm90_bf16_affine` (Hopper)", shown="(auto)")
    # sparse attention (worker/h3/vsa_tk.py)
    vsa_kernel: Annotated[Literal["auto", "flex", "tk"], _LOWER] = _var("auto", "worker",
        "VSA on CUDA: `auto` (fastvideo-kernel's sm_90a kernel where it loads, else FlexAttention), `flex`, or "
        "`tk` (the kernel or an error)")
    vsa_preload: str | None = _var(None, "worker",
        "colon-separated shared libraries loaded RTLD_GLOBAL before the VSA kernel extension "
        "(docs/benchmarks.md)", shown="(unset)")
    # load runner
    sweep_results_dir: Path = _var(Path("sweep-results"), "loadrunner",
        "per-sweep directories: point reports, summary JSON/CSV, PNG plots", shown="./sweep-results")
    sweep_queue: str = _var("loadrunner", "loadrunner", "Celery queue consumed by `h3batch sweep-worker`")
    sweep_allow_loopback: Flag = _var(False, "loadrunner",
        "accept POST /sweeps target URLs on loopback addresses (the local demo sets 1); vetted like webhook "
        "URLs")
    sweep_allow_private: Flag = _var(False, "loadrunner",
        "accept POST /sweeps target URLs on private-range addresses (a load target inside your network)")
    sweep_inputs_dir: Path | None = _var(None, "loadrunner",
        "the named input set: a sweep's `input_wav` is the name of a WAV file in this directory (never a path)",
        shown="<results dir>/inputs")
    sweep_schedule: str = _var("", "loadrunner",
        "beat schedule: JSON text, or a path to a JSON file", shown="(empty: no scheduled sweeps)")
    beat_lock_ttl_s: BeatLockTTL = _var(30, "loadrunner",
        "expiry of the single-beat Redis lock; renewed every third of it")
    beat_schedule_file: Path | None = _var(None, "loadrunner",
        "celery beat's last-run state file", shown="<results dir>/celerybeat-schedule")
    # client CLI (`h3batch submit`)
    api_url: str = _var("http://127.0.0.1:8000", "client", "API base URL for `h3batch submit`")
    api_key: str | None = _var(None, "client", "Bearer key `h3batch submit` sends", shown="(unset)", secret=True)
    # benchmarks
    git_rev: str = _var("unknown", "bench", "git revision recorded in benchmark JSON")

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

    @model_validator(mode="after")
    def _release_pinned_when_required(self) -> Settings:
        # Across two variables, and only for a release given explicitly (the default is a local directory).
        if self.require_pinned_release and "release_dir" in self.model_fields_set:
            if why := unpinned_release(self.release_dir):
                raise ValueError(f"H3BATCH_RELEASE: {why} (H3BATCH_REQUIRE_PINNED_RELEASE is on)")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   **others: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        # A bare Settings(...) reads only its arguments; from_env is the one place the environment is read.
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every variable of `VARS` from `env` (default: os.environ); unset or blank keeps the default."""
        source = _EnvSource(cls, os.environ if env is None else env)
        try:
            return cls(_build_sources=((source,), {}))
        except ValidationError as exc:  # the first error, in table order, as the old parser stopped at it
            raise ConfigError(_one_line(exc.errors()[0])) from None  # from None: the chain would quote the value


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over `env` rather than always os.environ, taking the declared names
    only, exactly as written (its own lookup is case-insensitive), each stripped, blank meaning unset."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._env = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Keys as the parent stores them (lower-case unless case-sensitive), so its prefix + field lookup finds them.
        return {(name if self.case_sensitive else name.lower()): value.strip()
                for name, value in self._env.items() if name in BY_NAME and value.strip()}


def _one_line(error: ErrorDetails) -> str:
    """pydantic's error as `<variable>: expected ..., found ...`: one line, never quoting a secret."""
    if not error["loc"]:  # a check across variables (a model validator) words its whole line
        return str(error["ctx"]["error"])
    name = _NAME_OF[error["loc"][0]]
    info = Settings.model_fields[BY_NAME[name].field]
    kind, raw = error["type"], error["input"]
    if kind == "value_error":  # a hand-written check: its message already says expected and found
        return f"{name}: {error['ctx']['error']}"
    found = "a value not shown (a secret)" if not info.repr else _found(raw)
    if kind in ("int_parsing", "int_from_float"):
        expected = "an integer"
    elif kind == "float_parsing":
        expected = "a number"
    elif kind == "literal_error":
        expected = "one of " + ", ".join(_choices(info.annotation))
    elif expect := _expectation(info):  # a constraint: ge, gt, finite, pattern
        expected = expect.text
    else:
        return f"{name}: {error['msg']}, found {found}"
    return f"{name}: expected {expected}, found {found}"


def _found(raw: Any) -> str:
    # Numbers bare (`found 0`), text quoted and cut (`found 'many'`).
    if not isinstance(raw, str):
        return repr(raw)
    try:
        float(raw)
    except ValueError:
        return repr(raw[:80])
    return raw


def _choices(annotation: Any) -> tuple[str, ...]:
    if get_origin(annotation) is Literal:
        return get_args(annotation)
    return tuple(choice for arg in get_args(annotation) for choice in _choices(arg))


def _expectation(info: Any) -> Expect | None:
    # On the field (`PositiveInt`) or inside its Optional (`PositiveInt | None`).
    inner = [m for arg in get_args(info.annotation) for m in getattr(arg, "__metadata__", ())]
    return next((m for m in [*info.metadata, *inner] if isinstance(m, Expect)), None)


def _shown_default(field: str, info: Any) -> str:
    shown = info.json_schema_extra["shown"]
    if shown is not None:
        return shown
    default = info.default
    if info.default_factory is not None or default is None or default in ("", ()):
        raise AssertionError(f"Settings.{field}: a default that is not a literal value needs shown=...")
    if isinstance(default, bool):
        return "1" if default else "0"
    return f"{default:g}" if isinstance(default, float) else str(default)


def _declare() -> tuple[Var, ...]:
    # Import-time self-check too: every field has a room and a doc line, and a default docs can show.
    out = []
    for field, info in Settings.model_fields.items():
        room = info.json_schema_extra["room"]
        if room not in ROOMS or not info.description:
            raise AssertionError(f"Settings.{field}: needs a room of {ROOMS} and a doc line")
        name = info.validation_alias or f"H3BATCH_{field.upper()}"
        out.append(Var(name, field, _shown_default(field, info), info.description, room))
    return tuple(out)


VARS: tuple[Var, ...] = _declare()
"""Every variable, in the order docs/service.md lists them."""

BY_NAME: dict[str, Var] = {var.name: var for var in VARS}
_NAME_OF: dict[str, str] = {**{var.field: var.name for var in VARS}, **{var.name: var.name for var in VARS}}
"""A pydantic error's location (a field, or the alias it was read by) -> the variable's name."""


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
    return getattr(Settings.from_env({name: raw}), BY_NAME[name].field) if raw is not None else None


def markdown_table() -> str:
    """The configuration table of docs/service.md, generated from VARS (`python -m h3batch.settings` prints it)."""
    rows = ["| Variable | Default | Read by | Meaning |", "|---|---|---|---|"]
    for var in VARS:
        default = var.default if var.default.startswith("(") or var.default.startswith("<") else f"`{var.default}`"
        rows.append(f"| `{var.name}` | {default} | {var.room} | {var.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
