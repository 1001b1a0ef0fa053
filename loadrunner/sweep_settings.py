"""Sweep configuration from `H3BATCH_*` environment variables, read once into a frozen dataclass (stdlib only).

| Variable | Default | Meaning |
| --- | --- | --- |
| H3BATCH_REDIS_URL | redis://127.0.0.1:6379/0 | Celery broker and sweep records (shared with the service) |
| H3BATCH_SWEEP_RESULTS_DIR | ./sweep-results | per-sweep directories: point reports, summary JSON/CSV, PNG plots |
| H3BATCH_SWEEP_QUEUE | loadrunner | Celery queue consumed by `h3batch sweep-worker` |
| H3BATCH_SWEEP_SCHEDULE | (empty: no scheduled sweeps) | beat schedule: JSON text, or a path to a JSON file |
| H3BATCH_BEAT_LOCK_TTL_S | 30 | expiry of the single-beat Redis lock; renewed every third of it |
| H3BATCH_BEAT_SCHEDULE_FILE | <results dir>/celerybeat-schedule | celery beat's last-run state file |
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_RESULTS_DIR = "./sweep-results"
DEFAULT_QUEUE = "loadrunner"
DEFAULT_BEAT_LOCK_TTL_S = 30


class SweepConfigError(ValueError):
    """A sweep setting or schedule that cannot be used; the message names the variable and what arrived."""


@dataclass(frozen=True)
class ScheduleEntry:
    """One scheduled sweep: fire every `every_s` seconds or on a 5-field `cron`; optionally once at beat start."""

    name: str
    sweep: dict
    every_s: float | None = None
    cron: str | None = None
    run_on_start: bool = False


@dataclass(frozen=True)
class SweepSettings:
    redis_url: str = DEFAULT_REDIS_URL
    results_dir: Path = Path(DEFAULT_RESULTS_DIR)
    queue: str = DEFAULT_QUEUE
    schedule: tuple[ScheduleEntry, ...] = ()
    beat_lock_ttl_s: int = DEFAULT_BEAT_LOCK_TTL_S
    beat_schedule_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SweepSettings:
        env = os.environ if env is None else env
        results = Path(env.get("H3BATCH_SWEEP_RESULTS_DIR") or DEFAULT_RESULTS_DIR)
        raw_ttl = env.get("H3BATCH_BEAT_LOCK_TTL_S") or str(DEFAULT_BEAT_LOCK_TTL_S)
        try:
            ttl = int(raw_ttl)
        except ValueError:
            raise SweepConfigError(f"H3BATCH_BEAT_LOCK_TTL_S: expected an integer, found {raw_ttl!r}") from None
        if ttl < 3:
            raise SweepConfigError(f"H3BATCH_BEAT_LOCK_TTL_S: expected at least 3 seconds, found {ttl}")
        return cls(redis_url=env.get("H3BATCH_REDIS_URL") or DEFAULT_REDIS_URL, results_dir=results,
                   queue=env.get("H3BATCH_SWEEP_QUEUE") or DEFAULT_QUEUE,
                   schedule=parse_schedule(env.get("H3BATCH_SWEEP_SCHEDULE") or ""), beat_lock_ttl_s=ttl,
                   beat_schedule_file=Path(env.get("H3BATCH_BEAT_SCHEDULE_FILE")
                                           or results / "celerybeat-schedule"))


def parse_schedule(raw: str) -> tuple[ScheduleEntry, ...]:
    """JSON text (starting with `[` or `{`) or a path to a JSON file: a list of entries or {"entries": [...]}."""
    raw = raw.strip()
    if not raw:
        return ()
    source = "H3BATCH_SWEEP_SCHEDULE"
    if raw[0] not in "[{":
        path = Path(raw)
        if not path.is_file():
            raise SweepConfigError(f"{source}: expected JSON text or a JSON file path, found missing file {raw!r}")
        raw, source = path.read_text(encoding="utf-8"), f"{source} file {path}"
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise SweepConfigError(f"{source}: expected JSON, found a parse error ({exc})") from None
    entries = data.get("entries") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise SweepConfigError(f"{source}: expected a list of entries or {{\"entries\": [...]}}")
    parsed = []
    for i, entry in enumerate(entries):
        where = f"{source} entry {i}"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise SweepConfigError(f"{where}: expected an object with a non-empty string `name`")
        if not isinstance(entry.get("sweep"), dict):
            raise SweepConfigError(f"{where}: expected a `sweep` object (the POST /sweeps body)")
        every, cron = entry.get("every_s"), entry.get("cron")
        if (every is None) == (cron is None):
            raise SweepConfigError(f"{where}: expected exactly one of `every_s` or `cron`")
        if every is not None and (not isinstance(every, (int, float)) or isinstance(every, bool) or every <= 0):
            raise SweepConfigError(f"{where}: `every_s` must be a positive number, found {every!r}")
        if cron is not None and (not isinstance(cron, str) or len(cron.split()) != 5):
            raise SweepConfigError(f"{where}: `cron` must have 5 fields (m h dom mon dow), found {cron!r}")
        parsed.append(ScheduleEntry(name=entry["name"], sweep=entry["sweep"],
                                    every_s=float(every) if every is not None else None, cron=cron,
                                    run_on_start=bool(entry.get("run_on_start", False))))
    return tuple(parsed)
