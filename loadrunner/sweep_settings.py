"""The sweep side of the configuration: `SweepSettings`, built from the one `h3batch.settings.Settings`, and
the beat schedule parser. The variables (H3BATCH_REDIS_URL, H3BATCH_SWEEP_*, H3BATCH_BEAT_*) are declared with
their defaults in h3batch/settings.py and listed in docs/service.md; stdlib and that module only.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from h3batch.settings import ConfigError, Settings

_DEFAULTS = Settings()
DEFAULT_REDIS_URL = _DEFAULTS.redis_url
DEFAULT_RESULTS_DIR = str(_DEFAULTS.sweep_results_dir)
DEFAULT_QUEUE = _DEFAULTS.sweep_queue
DEFAULT_BEAT_LOCK_TTL_S = _DEFAULTS.beat_lock_ttl_s
KEY_PREFIX = "h3batch-lr:"
"""kombu `global_keyprefix` of the sweep Celery app (loadrunner/celery_app.py): its queue lists and, above all, its
`unacked` hash are its own even on the GPU app's Redis DB. kombu restores unacked messages per hash by each
consumer's own visibility timeout, so on a shared hash a GPU worker (2 x H3BATCH_MAX_RUN_S) re-queued a 6 h sweep
point and it ran twice. Here (stdlib) so the API's metrics can find the sweep queue's list without Celery."""


class SweepConfigError(ConfigError):
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
    inputs_dir: Path | None = None  # the named input set; None: `<results dir>/inputs`

    @property
    def input_set_dir(self) -> Path:
        """Where a sweep's named `input_wav` files live."""
        return self.inputs_dir if self.inputs_dir is not None else self.results_dir / "inputs"

    @classmethod
    def from_settings(cls, settings: Settings) -> SweepSettings:
        results = settings.sweep_results_dir
        return cls(redis_url=settings.redis_url, results_dir=results, queue=settings.sweep_queue,
                   schedule=parse_schedule(settings.sweep_schedule), beat_lock_ttl_s=settings.beat_lock_ttl_s,
                   beat_schedule_file=settings.beat_schedule_file or results / "celerybeat-schedule",
                   inputs_dir=settings.sweep_inputs_dir)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SweepSettings:
        try:
            settings = Settings.from_env(env)
        except ConfigError as exc:
            raise SweepConfigError(str(exc)) from None
        return cls.from_settings(settings)


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
