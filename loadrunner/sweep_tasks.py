"""Sweep tasks (spec §15.1): start → one `run_point` per grid point, strictly serial → `finalize_sweep`.

Each point is one load run in its own directory, made by a single `asyncio.run(...)`; nothing async leaks into
Celery. Records go to Redis (`sweep_store`) and JSON files next to the reports.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import platform
import wave
from importlib import metadata
from pathlib import Path

import numpy as np
import redis
from celery import chain
from celery.exceptions import Ignore

from h3batch.loadrunner.celery_app import FINALIZE_SWEEP, POINT_TIME_LIMIT_S, RUN_POINT, START_SWEEP, app
from h3batch.loadrunner.config import parse_config
from h3batch.loadrunner.load import run_load
from h3batch.loadrunner.plots import render
from h3batch.loadrunner.report import RESULT_NAME
from h3batch.loadrunner.sweep_settings import SweepSettings
from h3batch.loadrunner.sweep_spec import SweepRequest, driver_argv, new_sweep_id, parse_sweep_request, points
from h3batch.loadrunner.sweep_store import (
    PointStatus,
    SweepStatus,
    create_sweep,
    get_points,
    get_record,
    put_point,
    update_record,
    utc_now,
)
from h3batch.loadrunner.sweep_summary import capacity, point_outcome, summary_row, to_csv

logger = logging.getLogger("h3batch.loadrunner.sweep_tasks")
BUILTIN_INPUT = "input.wav"
POINT_MARGIN_S = 10.0


def _settings() -> SweepSettings:
    return SweepSettings.from_env()


def _redis(settings: SweepSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)


def write_builtin_input(path: Path, seconds: float = 2.0) -> None:
    """A voiced stand-in for speech: 220 Hz at 0.3 with a 4 Hz syllable envelope, 24 kHz mono PCM16."""
    t = np.arange(int(seconds * 24_000)) / 24_000
    signal = 0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    tmp = path.with_suffix(".tmp")
    with wave.open(str(tmp), "wb") as wav:
        wav.setnchannels(1), wav.setsampwidth(2), wav.setframerate(24_000)
        wav.writeframes(np.round(signal * 32767).astype("<i2").tobytes())
    os.replace(tmp, path)


def point_time_bound(request: SweepRequest, load_frames: int) -> float:
    """Admission + stream + drain + cleanup with margin; on expiry the run is cancelled (sessions still closed)."""
    return (request.timeout_s + load_frames * 0.08 + request.drain_s + 2 * request.cleanup_timeout_s
            + POINT_MARGIN_S)


def package_versions() -> dict:
    versions = {}
    for name in ("h3batch", "websockets", "numpy", "celery"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def execute_point(settings: SweepSettings, r: redis.Redis, sweep_id: str, point_id: str) -> dict:
    """Run (or ingest) one point and store its record; never raises for a failed measurement."""
    record = get_record(r, sweep_id)
    request = parse_sweep_request(record["request"])
    point = next(p for p in points(request) if p.id == point_id)
    sweep_dir = settings.results_dir / sweep_id
    point_dir = sweep_dir / point_id
    point_dir.mkdir(parents=True, exist_ok=True)
    if request.input_wav:  # a validated name (sweep_spec.INPUT_NAME_RE), resolved inside the named input set
        input_wav = str(settings.input_set_dir / request.input_wav)
    else:
        input_wav = str(sweep_dir / BUILTIN_INPUT)
        if not Path(input_wav).exists():
            write_builtin_input(Path(input_wav))
    argv = driver_argv(request, point, input_wav, str(point_dir))
    input_sha256 = hashlib.sha256(Path(input_wav).read_bytes()).hexdigest() if Path(input_wav).is_file() else None
    if request.expected_input_sha256 is None and input_sha256 is not None:
        # Pin the input the point measured: a changed file aborts the run instead of silently mixing inputs.
        argv.append(f"--expected-input-sha256={input_sha256}")
    entry = {"id": point.id, "sessions": point.sessions, "load_frames": point.load_frames,
             "repetition": point.repetition, "parameters": argv, "server_url": request.url,
             "input_sha256": input_sha256,
             "labels": request.labels, "server_command": request.labels.get("server_command"),
             "checkpoint_revision": request.labels.get("server_revision"),
             "hardware": request.labels.get("server_hardware"), "driver_host": platform.node(),
             "package_versions": package_versions(), "started_at": utc_now(), "ingested": False}
    result_path = point_dir / RESULT_NAME
    report = None
    if result_path.exists():
        entry["ingested"] = True  # a stored measurement is never re-run
    else:
        put_point(r, sweep_id, {**entry, "status": PointStatus.RUNNING.value})
        try:
            config = parse_config(argv)
            bound = min(point_time_bound(request, point.load_frames), POINT_TIME_LIMIT_S)
            report = asyncio.run(asyncio.wait_for(run_load(config), bound))
        except TimeoutError:
            entry.update(status=PointStatus.CANCELLED.value, exit_status=None, ok=False,
                         error="point exceeded its time bound; sessions were closed and no report was written")
        except SystemExit as exc:  # argparse refused the configuration
            entry.update(status=PointStatus.ERROR.value, exit_status=2, ok=False, error="invalid driver arguments")
            logger.error("point %s/%s: driver arguments refused (exit %s)", sweep_id, point_id, exc.code)
        except Exception as exc:  # driver exception before a report: local causes only (WAV, SHA, existing file)
            entry.update(status=PointStatus.ERROR.value, exit_status=1, ok=False,
                         error=f"{type(exc).__name__}: {exc}")
            logger.error("point %s/%s failed before a report: %s", sweep_id, point_id, type(exc).__name__)
    if result_path.exists():
        text = result_path.read_bytes()
        report = report or json.loads(text)
        outcome = point_outcome(report)
        entry.update(outcome, status=(PointStatus.PASSED if outcome["ok"] else PointStatus.FAILED).value,
                     exit_status=0 if outcome["ok"] else 1, error=None,
                     report_path=str(result_path), report_sha256=hashlib.sha256(text).hexdigest())
    entry["finished_at"] = utc_now()
    put_point(r, sweep_id, entry)
    return entry


def finalize(settings: SweepSettings, r: redis.Redis, sweep_id: str) -> dict:
    """Summary JSON + CSV + PNG plots in the sweep directory; summary into the Redis record; status done."""
    record = get_record(r, sweep_id)
    stored = get_points(r, sweep_id)
    rows = [summary_row(stored[pid]) for pid in record["point_ids"] if pid in stored]
    sweep_dir = settings.results_dir / sweep_id
    sweep_dir.mkdir(parents=True, exist_ok=True)
    request = record["request"]
    labels = " ".join(f"{k}={v}" for k, v in sorted(request.get("labels", {}).items()))
    title = f"sweep {sweep_id}  {request.get('url')}\n{labels}"
    plots = render(rows, sweep_dir, title, {"max_client_rtf": request.get("max_client_rtf")})
    (sweep_dir / "summary.csv").write_text(to_csv(rows), encoding="utf-8")
    summary = {"sweep_id": sweep_id, "points": rows,
               "capacity_sessions": {str(k): v for k, v in capacity(rows).items()},
               "files": {"summary_json": "summary.json", "summary_csv": "summary.csv", "plots": plots,
                         "reports": {p: f"{p}/{RESULT_NAME}" for p in record["point_ids"]
                                     if (sweep_dir / p / RESULT_NAME).exists()}}}
    tmp = sweep_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, allow_nan=False), encoding="utf-8")
    os.replace(tmp, sweep_dir / "summary.json")
    return update_record(r, sweep_id, status=SweepStatus.DONE.value, finished_at=utc_now(), summary=summary)


@app.task(name=START_SWEEP)
def start_sweep(request: dict, sweep_id: str | None = None, origin: str = "api") -> str | None:
    """Create the record if needed (scheduled sweeps) and chain the points serially, then finalize."""
    settings = _settings()
    r = _redis(settings)
    if sweep_id is None:
        try:
            parsed = parse_sweep_request(request)
        except ValueError as exc:
            logger.error("scheduled sweep %s refused: %s", origin, exc)
            return None
        sweep_id = new_sweep_id()
        create_sweep(r, sweep_id, parsed.to_dict(), [p.id for p in points(parsed)], origin)
    record = update_record(r, sweep_id, status=SweepStatus.RUNNING.value, started_at=utc_now())
    chain(*[run_point.si(sweep_id, pid) for pid in record["point_ids"]],
          finalize_sweep.si(sweep_id)).apply_async(queue=settings.queue)
    logger.info("sweep %s started (%d points, origin %s)", sweep_id, len(record["point_ids"]), origin)
    return sweep_id


FINISHED_POINTS = frozenset({PointStatus.PASSED.value, PointStatus.FAILED.value, PointStatus.CANCELLED.value,
                             PointStatus.ERROR.value})


def claim_point(r: redis.Redis, sweep_id: str, point_id: str) -> bool:
    """Re-run guard: True for the one delivery that may run this point. A redelivered message (broker restore, a
    worker lost mid-point) finds the point finished or its run lock held and must do nothing, not measure twice."""
    stored = get_points(r, sweep_id).get(point_id, {})
    if stored.get("status") in FINISHED_POINTS:
        return False
    return bool(r.set(point_lock_key(sweep_id, point_id), "1", nx=True, ex=int(POINT_TIME_LIMIT_S)))


def point_lock_key(sweep_id: str, point_id: str) -> str:
    return f"h3batch:sweep:{sweep_id}:run:{point_id}"


@app.task(name=RUN_POINT)
def run_point(sweep_id: str, point_id: str) -> str:
    settings = _settings()
    r = _redis(settings)
    if not claim_point(r, sweep_id, point_id):
        logger.warning("point %s/%s already ran or is running: duplicate delivery ignored", sweep_id, point_id)
        raise Ignore()  # acked, and the chain's next link is not sent a second time
    try:
        return execute_point(settings, r, sweep_id, point_id)["status"]
    except Exception as exc:  # keep the chain going: the failure is recorded on the point, then finalize runs
        logger.exception("point %s/%s crashed", sweep_id, point_id)
        put_point(r, sweep_id, {"id": point_id, "status": PointStatus.ERROR.value, "ok": False,
                                "error": type(exc).__name__, "finished_at": utc_now()})
        return PointStatus.ERROR.value


@app.task(name=FINALIZE_SWEEP)
def finalize_sweep(sweep_id: str) -> str:
    settings = _settings()
    r = _redis(settings)
    try:
        return finalize(settings, r, sweep_id)["status"]
    except Exception as exc:
        logger.exception("sweep %s finalize failed", sweep_id)
        update_record(r, sweep_id, status=SweepStatus.FAILED.value, finished_at=utc_now(),
                      error=f"finalize: {type(exc).__name__}")
        return SweepStatus.FAILED.value
