"""The render task and the worker process's resident state (pipeline loaded once, heartbeat thread).

The task body only claims the job, renders it with the resident pipeline and records the outcome; everything about
statuses goes through core/jobs.py. The pipeline is loaded once per worker process (by `h3batch worker` before
Celery starts consuming, or lazily by the first task under a bare `celery worker`), and each load is counted in
Redis (`h3b:stats` `model_loads`), so tests can prove a second job does not reload weights.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import redis
from celery import shared_task

from h3batch.core import defaults, jobs, keys, lease
from h3batch.core.celery_app import make_celery
from h3batch.core.exceptions import InvalidRequest, JobError, ReleaseMismatch
from h3batch.core.jobs import JobStatus, Stage
from h3batch.settings import Settings
from h3batch.worker import job_metadata, reaper, webhook_delivery

log = logging.getLogger("h3batch.worker")

VIDEO_NAME = "video.mp4"
"""File name of a job's MP4 inside `<artifacts>/<job id>/`."""


class Heartbeat(threading.Thread):
    """Refreshes `h3b:worker:{name}` (TTL 15 s) every 5 s, renews the lease of the job being rendered, and every
    10 s (one worker at a time, under a Redis lock) re-sends render messages for running jobs whose lease lapsed."""

    def __init__(self, r: redis.Redis, name: str, info: dict[str, Any], resend: Callable[[str], None],
                 settings: Settings):
        super().__init__(name="h3batch-heartbeat", daemon=True)
        self.r = r
        self.settings = settings
        self.worker_name = name
        self.info = dict(info)
        self.resend = resend
        self.state = "READY"
        self.job_id: str | None = None
        self.lease_holder: str | None = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def set_busy(self, job_id: str, holder: str) -> None:
        with self._lock:
            self.state, self.job_id, self.lease_holder = "BUSY", job_id, holder
        self.beat()

    def set_ready(self) -> None:
        with self._lock:
            self.state, self.job_id, self.lease_holder = "READY", None, None
        self.beat()

    def beat(self) -> None:
        with self._lock:
            payload = {**self.info, "name": self.worker_name, "state": self.state, "job_id": self.job_id,
                       "ts": time.time(), "pid": os.getpid()}
            job_id, holder = self.job_id, self.lease_holder
        try:
            self.r.set(keys.worker(self.worker_name), json.dumps(payload), ex=defaults.HEARTBEAT_TTL_S)
            if job_id and holder:
                jobs.renew_lease(self.r, job_id, holder, int(self.settings.lease_ttl_s * 1000))
        except redis.exceptions.RedisError as exc:  # Redis blip: the next beat retries; the key's TTL tells readers
            log.warning("heartbeat failed error=%s", type(exc).__name__)

    def reconcile(self) -> list[str]:
        """Re-enqueue orphaned running jobs (claim_job then re-claims them with attempt + 1); returns their ids."""
        lock_ms = int(self.settings.reconcile_interval_s * 1000)
        if not self.r.set(keys.RECONCILE_LOCK, self.worker_name, nx=True, px=lock_ms):
            return []  # another worker reconciled within the interval
        report = reaper.reap(self.r, self.resend, grace_s=max(self.settings.lease_ttl_s, 1.0),
                             record_ttl_s=self.settings.result_ttl_s + defaults.RECORD_GRACE_S)
        if report.requeued:
            log.warning("re-enqueuing job whose worker lost its lease", extra={"job_id": ",".join(report.requeued)})
        return report.requeued + report.resent

    def run(self) -> None:
        last_reconcile = 0.0
        while not self._stop_event.wait(self.settings.heartbeat_interval_s):
            self.beat()
            if time.monotonic() - last_reconcile >= self.settings.reconcile_interval_s:
                last_reconcile = time.monotonic()
                try:
                    self.reconcile()
                except Exception:  # never let a reconcile error stop the heartbeat; it is retried next interval
                    log.exception("reconcile failed")

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)  # a beat in flight must not re-create the key after we delete it
        try:
            self.r.delete(keys.worker(self.worker_name))
        except redis.exceptions.RedisError:
            pass  # the key expires by itself within HEARTBEAT_TTL_S


@dataclass
class Resident:
    """What stays loaded between jobs in one worker process."""

    settings: Settings
    r: redis.Redis
    pipeline: Any  # h3batch.worker.pipeline.Pipeline (imported lazily: torch)
    heartbeat: Heartbeat
    loaded_at: float = field(default_factory=time.time)


_resident: Resident | None = None
_resident_lock = threading.Lock()


def load_resident(settings: Settings, *, ready: bool = True) -> Resident:
    """Load the pipeline (contract check + provenance fetch + weights) once for this process; start the heartbeat.

    `ready=False` keeps the heartbeat in STARTING (not counted by /readyz) until `mark_ready()`, for callers that
    start consuming only afterwards. Raises ValueError (the pipeline's ContractError) with a one-line message naming
    the field.
    """
    global _resident
    with _resident_lock:
        if _resident is not None:
            return _resident
        from h3batch.worker.rank_group import RANKS_ENV, load_pipeline, ranks_from_env  # noqa: PLC0415  (torch)

        r = redis.Redis.from_url(settings.redis_url, decode_responses=True, health_check_interval=30)
        started = time.perf_counter()
        ranks = ranks_from_env({RANKS_ENV: settings.ranks})  # ValueError names H3BATCH_RANKS
        # ranks = 1: the plain in-process Pipeline; more: a resident rank group (spawned, one GPU each).
        pipeline = load_pipeline(settings.release_dir, ranks=ranks, device=settings.device,
                                 hf_cache=settings.hf_cache_dir, require_pinned_base=settings.require_pinned_base)
        load_s = time.perf_counter() - started
        loads = int(r.hincrby(keys.STATS, "model_loads", 1))
        sender = make_celery(settings.redis_url, max_run_s=settings.max_run_s)

        def resend(job_id: str) -> None:
            sender.send_task(defaults.RENDER_TASK, args=[job_id], queue=defaults.RENDER_QUEUE)

        heartbeat = Heartbeat(r, settings.worker_name, {"release_id": pipeline.release_id,
                                                        "contract_hash": pipeline.contract_hash, "ranks": ranks,
                                                        "model_loads": 1, "load_s": round(load_s, 3)}, resend,
                              settings)
        heartbeat.state = "READY" if ready else "STARTING"
        heartbeat.beat()
        heartbeat.start()
        webhook_delivery.start_dispatcher(r)  # signed POSTs for finished jobs with a webhook_url
        log.info("model resident release=%s load_s=%.2f total_model_loads=%d", pipeline.release_id, load_s, loads)
        _resident = Resident(settings=settings, r=r, pipeline=pipeline, heartbeat=heartbeat)
        return _resident


def mark_ready() -> None:
    """The consumer is taking messages: the heartbeat says READY from now on."""
    if _resident is not None:
        _resident.heartbeat.set_ready()


def shutdown_resident() -> None:
    """Stop the heartbeat (its key is deleted so /readyz stops counting this worker at once) and the rank group."""
    if _resident is not None:
        _resident.heartbeat.stop()
        _resident.pipeline.close()  # stops rank processes; a no-op for the in-process pipeline


@shared_task(name=defaults.RENDER_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def render(job_id: str) -> None:
    """Render one job by id (the message carries nothing else)."""
    run_job(load_resident(Settings.from_env()), job_id)


def _progress_at(stage: str, step: int, total: int) -> float:
    if stage == Stage.DENOISE.value and total > 0:
        return defaults.PROGRESS_AT_STAGE["denoise"] + defaults.DENOISE_SPAN * step / total
    return defaults.PROGRESS_AT_STAGE[stage]


def _free_accelerator_memory() -> None:
    """Give cached GPU blocks back after a cancelled or failed render (no-op on CPU)."""
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run_job(res: Resident, job_id: str) -> None:
    """Claim, render, record. Every outcome ends in one `transition`; a lost race leaves no files behind."""
    from h3batch.worker.pipeline import RenderCancelled, RenderRequest  # noqa: PLC0415
    from h3batch.worker.rank_group import RankGroupError  # noqa: PLC0415

    settings, r, pipeline = res.settings, res.r, res.pipeline
    extra = {"job_id": job_id}
    claimed = jobs.claim_job(r, job_id, settings.worker_name, release_id=pipeline.release_id,
                             record_ttl_s=settings.result_ttl_s + defaults.RECORD_GRACE_S,
                             lease_ttl_ms=int(settings.lease_ttl_s * 1000))
    if claimed is None:
        log.info("skipped: job is gone, finished or held by another worker", extra=extra)
        return
    record, holder = claimed
    attempt = record["attempt"]
    lease.count(r, job_id, "started")
    res.heartbeat.set_busy(job_id, holder)
    job_dir = settings.artifacts_dir / job_id
    if lease.remove_stale_attempts(job_dir, attempt):
        log.info("removed partial files of an earlier attempt", extra=extra)
    state = {"stage": Stage.TEXT_ENCODE.value, "progress": 0.0}
    record_ttl = settings.result_ttl_s + defaults.RECORD_GRACE_S

    def on_progress(stage: str, step: int, total: int) -> None:
        progress = max(state["progress"], _progress_at(stage, step, total))  # never goes backwards
        state.update(stage=stage, progress=progress)
        fields: dict[str, Any] = {"stage": stage, "progress": round(progress, 4)}
        if stage == Stage.DENOISE.value:
            fields["step"] = step
        elif stage in (Stage.DECODE.value, Stage.MUX.value):
            fields["step"] = record["total_steps"]
        jobs.update_progress(r, job_id, attempt, fields)
        if settings.debug_step_delay_s:
            time.sleep(settings.debug_step_delay_s)

    def should_cancel() -> bool:  # also stops an attempt that lost its lease (requeued and re-claimed elsewhere)
        return jobs.cancel_requested(r, job_id) or not lease.still_owner(r, job_id, holder, attempt)

    def finish(to: JobStatus, fields: dict[str, Any]) -> dict[str, Any] | None:
        done = jobs.transition(r, job_id, to, expect={JobStatus.IN_PROGRESS}, expect_attempt=attempt,
                               fields=fields, record_ttl_s=record_ttl)
        if done is None or to is not JobStatus.COMPLETED:  # deleted, cancelled, failed or superseded
            lease.clean_up(r, job_id, attempt, job_dir)
        return done

    log.info("render started attempt=%d", attempt, extra=extra)
    try:
        wanted = record.get("release")
        if wanted and wanted != pipeline.release_id:
            raise ReleaseMismatch(f"release: this worker serves {pipeline.release_id!r}, the job asks for "
                                  f"{wanted!r}")
        meta = job_metadata.for_job(record, release_id=pipeline.release_id,
                                    contract_hash=getattr(pipeline, "contract_hash", ""),
                                    device=str(getattr(pipeline, "device", "") or settings.device or "") or None,
                                    ranks=int(getattr(pipeline, "ranks", 1)),
                                    provenance=getattr(pipeline, "provenance", None))
        request = RenderRequest(prompt=record["prompt"], seconds=record["seconds"], width=record["width"],
                                height=record["height"], seed=record["seed"],
                                metadata=job_metadata.mp4_tags(meta))
        try:
            pipeline.validate(request)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        job_dir.mkdir(parents=True, exist_ok=True)
        result = pipeline.render(request, lease.attempt_path(job_dir, attempt), on_progress=on_progress,
                                 should_cancel=should_cancel)
        lease.count(r, job_id, "rendered")
        jobs.update_progress(r, job_id, attempt, {"stage": Stage.FINALIZE, "progress": 0.98})
        t0 = time.perf_counter()
        sha256, size = _sha256(result.path), result.path.stat().st_size
        lease.publish(r, job_id, holder, attempt, result.path, job_dir / VIDEO_NAME)
        timings = {**{k: round(float(v), 6) for k, v in result.timings.items()},
                   "finalize": round(time.perf_counter() - t0, 6)}
        now = time.time()
        done = finish(JobStatus.COMPLETED, {
            "stage": Stage.FINALIZE, "progress": 1.0, "step": record["total_steps"],
            "artifact": f"{job_id}/{VIDEO_NAME}", "sha256": sha256, "size_bytes": size, "timings": timings,
            "tokens": dict(result.tokens), "frames": result.frames, "finished_at": now, "metadata": meta,
            "expires_at": now + settings.result_ttl_s})
        if done is None:  # finish() already removed the files
            log.info("render finished but the job was deleted or cancelled meanwhile", extra=extra)
        else:
            log.info("render completed frames=%d bytes=%d seconds=%.3f", result.frames, size,
                     sum(timings.values()), extra=extra)
    except (RenderCancelled, lease.LeaseLost):
        done = finish(JobStatus.CANCELLED, {"cancelled_at_stage": state["stage"]})
        log.info("render cancelled stage=%s", state["stage"], extra=extra)
        _free_accelerator_memory()
    except JobError as exc:
        finish(JobStatus.FAILED, {"error": {"code": exc.code, "message": exc.message, "retryable": exc.retryable,
                                            "stage": state["stage"]}})
        log.info("render refused code=%s message=%s", exc.code, exc.message, extra=extra)
    except RankGroupError as exc:
        # A rank died or failed: the group refuses further work, so this worker must go. Leave the job in_progress;
        # its lease lapses and a healthy worker re-runs it (attempt + 1). The supervisor restarts this worker.
        log.error("rank group failed error=%s; exiting so the supervisor restarts the worker", exc, extra=extra)
        lease.attempt_path(job_dir, attempt).unlink(missing_ok=True)
        res.heartbeat.stop()
        os._exit(3)
    except redis.exceptions.ConnectionError as exc:
        # Redis went away mid-render (restart, failover): an infrastructure fault, not the job's. Leave the record
        # in_progress; once the lease lapses the reaper requeues it (attempt + 1).
        log.warning("lost Redis mid-render error=%s; the job is requeued when its lease lapses",
                    type(exc).__name__, extra=extra)
        lease.attempt_path(job_dir, attempt).unlink(missing_ok=True)
    except Exception as exc:  # unexpected: the traceback goes to the log and a private record field, never the API
        log.exception("render failed", extra=extra)
        finish(JobStatus.FAILED, {"error": {"code": "render_error", "retryable": False, "stage": state["stage"],
                                            "message": f"the render failed at stage {state['stage']} "
                                                       f"({type(exc).__name__})"},
                                  "traceback": traceback.format_exc()[-8000:]})
        _free_accelerator_memory()
    finally:
        try:
            jobs.drop_lease(r, job_id, holder)
        except redis.exceptions.RedisError:
            pass  # Redis still away: the lease lapses by its TTL
        res.heartbeat.set_ready()
