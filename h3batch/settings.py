"""Process configuration from `H3BATCH_*` environment variables, read once at the edge into a frozen dataclass.

Also holds the start-up checks (Redis reachable, release present, artifacts dir writable) whose failures the
`h3batch api|worker|serve` mains print as one line before exiting 2, and the structured log format every h3batch
process uses (key=value lines by default, JSON lines with H3BATCH_LOG_FORMAT=json), since both are part of how a
process is configured. docs/service.md has the table of variables; tests/service checks the two stay in sync.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from h3batch.core import defaults
from h3batch.core.exceptions import ConfigError

# name -> (default shown in docs, meaning). docs/service.md's table must list every one of these.
ENV_VARS: dict[str, tuple[str, str]] = {
    "H3BATCH_REDIS_URL": (defaults.REDIS_URL, "Redis URL: Celery broker and job records"),
    "H3BATCH_ARTIFACTS_DIR": (defaults.ARTIFACTS_DIR, "shared directory for MP4s (worker writes, API reads)"),
    "H3BATCH_RELEASE": (defaults.RELEASE_DIR, "release directory the worker serves"),
    "H3BATCH_API_KEYS": ("(unset: open API)", "comma-separated Bearer keys accepted by the API"),
    "H3BATCH_HF_CACHE": ("<release>/../hf-cache", "Hugging Face cache holding the base VAE"),
    "H3BATCH_DEVICE": ("(auto: cuda if present, else cpu)", "torch device for the pipeline"),
    "H3BATCH_RANKS": ("1", "sequence-parallel ranks per worker: N resident processes, one GPU each (`auto`: every "
                      "visible GPU); see docs/parallelism.md"),
    "H3BATCH_WORKER_NAME": ("<hostname>-<pid>", "worker name in heartbeats and job records"),
    "H3BATCH_MAX_RUN_S": (str(defaults.MAX_RUN_S), "longest render; visibility timeout is twice this"),
    "H3BATCH_RESULT_TTL_S": (str(defaults.RESULT_TTL_S), "seconds a finished MP4 stays downloadable"),
    "H3BATCH_MAX_QUEUED": (str(defaults.MAX_QUEUED), "queued jobs at which POST /jobs answers 503 queue_full"),
    "H3BATCH_MAX_PROMPT_CHARS": (str(defaults.MAX_PROMPT_CHARS), "longest prompt accepted"),
    "H3BATCH_LEASE_TTL_S": (str(defaults.LEASE_TTL_MS // 1000), "a running job's lease lapses this long after its "
                            "worker's last heartbeat; then the reconciler re-enqueues it"),
    "H3BATCH_RECONCILE_INTERVAL_S": (str(int(defaults.RECONCILE_INTERVAL_S)), "how often one worker re-enqueues "
                                     "running jobs whose lease lapsed"),
    "H3BATCH_LOG_FORMAT": ("kv", "`kv` (key=value lines) or `json` (JSON lines)"),
    "H3BATCH_LOG_LEVEL": ("INFO", "Python log level"),
    "H3BATCH_DEBUG_STEP_DELAY_S": ("0", "test knob: extra sleep at each progress report (widens cancel windows)"),
}


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, found {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name}: expected a positive integer, found {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, found {raw!r}") from None
    if not value >= 0:
        raise ConfigError(f"{name}: expected a number >= 0, found {raw!r}")
    return value


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = _float(env, name, default)
    if value <= 0:
        raise ConfigError(f"{name}: expected a number > 0, found {env.get(name)!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything an h3batch process reads from its environment."""

    redis_url: str = defaults.REDIS_URL
    artifacts_dir: Path = Path(defaults.ARTIFACTS_DIR)
    release_dir: Path = Path(defaults.RELEASE_DIR)
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # secrets: never in repr or logs
    hf_cache: Path | None = None
    device: str | None = None
    ranks: str = "1"  # parsed by h3batch.worker.rank_group.ranks_from_env when the pipeline loads ("auto" needs torch)
    worker_name: str = ""
    max_run_s: int = defaults.MAX_RUN_S
    result_ttl_s: int = defaults.RESULT_TTL_S
    max_queued: int = defaults.MAX_QUEUED
    max_prompt_chars: int = defaults.MAX_PROMPT_CHARS
    lease_ttl_s: float = defaults.LEASE_TTL_MS / 1000
    reconcile_interval_s: float = defaults.RECONCILE_INTERVAL_S
    log_format: str = "kv"
    log_level: str = "INFO"
    debug_step_delay_s: float = 0.0

    @property
    def hf_cache_dir(self) -> Path:
        """The HF cache to hand Pipeline.load: H3BATCH_HF_CACHE, else `hf-cache` beside the release."""
        return self.hf_cache if self.hf_cache is not None else self.release_dir.parent / "hf-cache"

    @property
    def heartbeat_interval_s(self) -> float:
        """Heartbeat (and lease renewal) period: 5 s, or a third of a shorter lease so it never lapses mid-job."""
        return min(defaults.HEARTBEAT_INTERVAL_S, self.lease_ttl_s / 3)

    @property
    def visibility_timeout_s(self) -> int:
        """Broker redelivery timeout: twice the longest render, so a running job is never handed out again."""
        return 2 * self.max_run_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        log_format = env.get("H3BATCH_LOG_FORMAT", "kv").strip() or "kv"
        if log_format not in ("kv", "json"):
            raise ConfigError(f"H3BATCH_LOG_FORMAT: expected 'kv' or 'json', found {log_format!r}")
        keys = tuple(k.strip() for k in env.get("H3BATCH_API_KEYS", "").split(",") if k.strip())
        hf_cache = env.get("H3BATCH_HF_CACHE", "").strip()
        ranks = env.get("H3BATCH_RANKS", "").strip() or "1"
        if ranks != "auto" and not (ranks.isdigit() and int(ranks) >= 1):
            raise ConfigError(f"H3BATCH_RANKS: expected a positive integer or 'auto', found {ranks!r}")
        return cls(
            redis_url=env.get("H3BATCH_REDIS_URL", "").strip() or defaults.REDIS_URL,
            artifacts_dir=Path(env.get("H3BATCH_ARTIFACTS_DIR", "").strip() or defaults.ARTIFACTS_DIR),
            release_dir=Path(env.get("H3BATCH_RELEASE", "").strip() or defaults.RELEASE_DIR),
            api_keys=keys,
            hf_cache=Path(hf_cache) if hf_cache else None,
            device=env.get("H3BATCH_DEVICE", "").strip() or None,
            ranks=ranks,
            worker_name=env.get("H3BATCH_WORKER_NAME", "").strip() or f"{socket.gethostname()}-{os.getpid()}",
            max_run_s=_int(env, "H3BATCH_MAX_RUN_S", defaults.MAX_RUN_S),
            result_ttl_s=_int(env, "H3BATCH_RESULT_TTL_S", defaults.RESULT_TTL_S),
            max_queued=_int(env, "H3BATCH_MAX_QUEUED", defaults.MAX_QUEUED),
            max_prompt_chars=_int(env, "H3BATCH_MAX_PROMPT_CHARS", defaults.MAX_PROMPT_CHARS),
            lease_ttl_s=_positive_float(env, "H3BATCH_LEASE_TTL_S", defaults.LEASE_TTL_MS / 1000),
            reconcile_interval_s=_positive_float(env, "H3BATCH_RECONCILE_INTERVAL_S", defaults.RECONCILE_INTERVAL_S),
            log_format=log_format,
            log_level=(env.get("H3BATCH_LOG_LEVEL", "").strip() or "INFO").upper(),
            debug_step_delay_s=_float(env, "H3BATCH_DEBUG_STEP_DELAY_S", 0.0),
        )


# --- start-up checks: each raises ConfigError with one line naming what was expected and what was found ---

def redacted_url(url: str) -> str:
    """The Redis URL without its password, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit  # noqa: PLC0415

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_redis(url: str, timeout_s: float = 3.0) -> None:
    """Raise ConfigError unless a Redis answers PING at `url`."""
    import redis  # noqa: PLC0415

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as exc:
        raise ConfigError(f"H3BATCH_REDIS_URL: expected redis://host:port/db, found {redacted_url(url)!r} ({exc})")
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise ConfigError(f"H3BATCH_REDIS_URL: Redis at {redacted_url(url)} is not reachable "
                          f"({type(exc).__name__}: {exc})") from None
    finally:
        client.close()


def check_artifacts_dir(path: Path) -> None:
    """Create the artifacts dir if needed and prove it is writable; ConfigError otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"H3BATCH_ARTIFACTS_DIR: expected a writable directory, found {str(path)!r} "
                          f"({exc.strerror or exc})") from None


def check_release_dir(path: Path) -> None:
    """Cheap presence check before the pipeline's own contract check (which names the failing field)."""
    if not path.is_dir():
        raise ConfigError(f"H3BATCH_RELEASE: expected a release directory, found {str(path)!r} (no such directory; "
                          f"build the tiny one with `h3batch build-tiny --out {path}`)")


# --- structured logs ---

_STANDARD_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class StructuredFormatter(logging.Formatter):
    """One line per record: `ts=… level=… logger=… msg="…" job_id=…` (kv) or the same fields as JSON."""

    def __init__(self, fmt: str = "kv"):
        super().__init__()
        self.fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():  # fields passed with extra={...}, e.g. job_id
            if key not in _STANDARD_RECORD_FIELDS and not key.startswith("_"):
                fields[key] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.fmt == "json":
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_kv_value(v)}" for k, v in fields.items())


def _kv_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return json.dumps(text)


def configure_logging(settings: Settings, stream=None) -> None:
    """Route every logger through one structured handler on stderr (idempotent)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(StructuredFormatter(settings.log_format))
    handler.set_name("h3batch")
    root.handlers = [h for h in root.handlers if h.get_name() != "h3batch"] + [handler]
    root.setLevel(settings.log_level)
