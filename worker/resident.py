"""What a worker process keeps loaded between jobs: the pipeline, its Redis client and its heartbeat.

The pipeline is loaded once per worker process (by `h3batch worker` before Celery starts consuming, or lazily by the
first task under a bare `celery worker`), and each load is counted in Redis (`h3b:stats` `model_loads`), so tests can
prove a second job does not reload weights.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from h3batch.core import defaults, keys
from h3batch.core.celery_app import make_celery, send_render
from h3batch.settings import Settings
from h3batch.worker import capacity, compile_cache, webhook_delivery
from h3batch.worker.deadline import DeadlineConfig, RunDeadline
from h3batch.worker.disk import DiskHealth
from h3batch.worker.heartbeat import Heartbeat, WorkerState

log = logging.getLogger("h3batch.worker")


@dataclass
class Resident:
    """What stays loaded between jobs in one worker process."""

    settings: Settings
    r: redis.Redis
    pipeline: Any  # h3batch.worker.pipeline.Pipeline (imported lazily: torch)
    heartbeat: Heartbeat
    deadline: RunDeadline
    disk: DiskHealth  # free space of the artifacts dir; its verdict is the heartbeat's DISK_FULL (worker/disk.py)
    max_rows: int = capacity.CONTRACT_MAX_ROWS  # largest request served, advertised in the heartbeat
    capability: Any = None  # core/routing.Capability: what it advertises; its queues are what it consumes
    loaded_at: float = field(default_factory=time.time)


_resident: Resident | None = None
_resident_lock = threading.Lock()


def load_resident(settings: Settings, *, ready: bool = True) -> Resident:
    """Load the pipeline (contract check + base-VAE fetch + weights) once for this process; start the heartbeat.

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
        compile_cache.configure(settings.compile_cache)  # before the first compile (the load's warm-up)
        started = time.perf_counter()
        ranks = ranks_from_env({RANKS_ENV: settings.ranks})  # ValueError names H3BATCH_RANKS
        # ranks = 1: the plain in-process Pipeline; more: a resident rank group (spawned, one GPU each).
        pipeline = load_pipeline(settings.release_dir, ranks=ranks, device=settings.device,
                                 hf_cache=settings.hf_cache_dir, require_pinned_base=settings.require_pinned_base,
                                 text_placement=settings.text_encoder_placement, precision=settings.precision,
                                 adapter=settings.adapter, lora_cache_mb=settings.lora_cache_mb)
        load_s = time.perf_counter() - started
        loads = int(r.hincrby(keys.STATS, "model_loads", 1))
        sender = make_celery(settings.redis_url, max_run_s=settings.max_run_s)
        plan_rows = capacity.plan_max_rows_of(pipeline)
        max_rows = capacity.advertised_max_rows(settings.max_rows, plan_rows)
        try:
            capability = capacity.capability_of(pipeline, settings, max_rows)  # ValueError names the variable
        except ValueError:
            pipeline.close()
            raise

        def resend(job_id: str) -> None:  # the job's own capability queue (reaper, batch feeder, re-send)
            send_render(sender, r, job_id)

        disk = DiskHealth(settings.artifacts_dir, settings.min_free_disk_mb)
        heartbeat = Heartbeat(r, settings.worker_name, {"release_id": pipeline.release_id,
                                                        "contract_hash": pipeline.contract_hash, "ranks": ranks,
                                                        "model_loads": 1, "load_s": round(load_s, 3),
                                                        **capability.as_json()}, resend,
                              settings, state=WorkerState.READY if ready else WorkerState.STARTING, disk=disk)
        heartbeat.beat()
        heartbeat.start()
        deadline = RunDeadline(r, settings.worker_name,
                               DeadlineConfig(max_run_s=float(settings.max_run_s), stall_s=settings.render_stall_s,
                                              check_every_s=min(0.5, max(settings.render_stall_s / 5, 0.1))),
                               record_ttl_s=settings.result_ttl_s + defaults.RECORD_GRACE_S,
                               on_fire=heartbeat.set_stalled)
        deadline.start()
        webhook_delivery.start_dispatcher(r)  # signed POSTs for finished jobs with a webhook_url
        log.info("model resident release=%s load_s=%.2f total_model_loads=%d max_rows=%d (%s) precision=%s kind=%s "
                 "tasks=%s", pipeline.release_id, load_s, loads, max_rows,
                 capacity.capacity_source(settings.max_rows, plan_rows), capability.precision,
                 capability.release_kind, ",".join(capability.tasks))
        plan = getattr(pipeline, "memory_plan", None)
        if plan is not None:  # the plan's table was logged at load; one structured line to grep for
            log.info("memory plan ranks=%d text_encoder=%s max_rows=%d seconds_served=%.2f", plan.ranks,
                     plan.placement, plan.max_rows, plan.seconds_served,
                     extra={"max_rows": plan.max_rows, "text_encoder_placement": plan.placement})
        _resident = Resident(settings=settings, r=r, pipeline=pipeline, heartbeat=heartbeat,
                             deadline=deadline, disk=disk, max_rows=max_rows, capability=capability)
        return _resident


def mark_ready() -> None:
    """The consumer is taking messages: the heartbeat says READY from now on."""
    if _resident is not None:
        _resident.heartbeat.set_ready()


def shutdown_resident() -> None:
    """Stop the heartbeat (its key is deleted so /readyz stops counting this worker at once) and the rank group."""
    if _resident is not None:
        _resident.deadline.stop()
        _resident.heartbeat.stop()
        _resident.pipeline.close()  # stops rank processes; a no-op for the in-process pipeline
