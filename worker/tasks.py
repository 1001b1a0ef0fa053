"""The Celery render task: a job id in, one attempt at it run to one recorded outcome.

The steps live in worker/attempt.py, the state kept between jobs (pipeline, heartbeat) in worker/resident.py.
"""
from __future__ import annotations

import logging

import redis
from celery import shared_task

from h3batch.core import batches, defaults, keys, lease
from h3batch.core.artifact_store import StoreUnavailable
from h3batch.core.exceptions import JobError
from h3batch.core.jobs import JobStatus
from h3batch.settings import Settings
from h3batch.worker import disk
from h3batch.worker.attempt import Attempt
from h3batch.worker.resident import Resident, load_resident

log = logging.getLogger("h3batch.worker")


@shared_task(name=defaults.RENDER_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def render(job_id: str) -> None:
    """Render one job by id (the message carries nothing else)."""
    run_job(load_resident(Settings.from_env()), job_id)


def run_job(res: Resident, job_id: str) -> None:
    """Claim, render, publish, finish. Every outcome ends in one `transition`; a lost race leaves no files behind."""
    from h3batch.worker.memory_errors import memory_kind  # noqa: PLC0415  (torch)
    from h3batch.worker.pipeline import RenderCancelled  # noqa: PLC0415  (torch)
    from h3batch.worker.rank_group import RankGroupError  # noqa: PLC0415

    if not _disk_ready(res, job_id):
        return
    attempt = Attempt.claim(res, job_id)
    if attempt is None:
        return
    out_of_disk = False
    try:
        result = attempt.render()
        attempt.finish_completed(result, attempt.publish(result))
    except (RenderCancelled, lease.LeaseLost):
        attempt.finish_cancelled()
    except JobError as exc:
        attempt.finish_refused(exc)
    except RankGroupError as exc:
        attempt.exit_for_restart(exc)
    except (redis.exceptions.ConnectionError, StoreUnavailable) as exc:
        attempt.leave_to_reaper(exc)
    except Exception as exc:  # unexpected: the traceback goes to the log and a private record field, never the API
        fault = disk.disk_fault(exc)
        kind = memory_kind(exc)
        if kind is not None:  # host or GPU memory ran out: the job fails out_of_memory, the worker goes on
            attempt.finish_out_of_memory(exc, kind)
        elif fault is not None:  # ENOSPC/EDQUOT: the job goes back to the queue, the worker stops taking jobs
            attempt.requeue_for_disk(fault)
            out_of_disk = True
        else:
            attempt.finish_crashed(exc)
    finally:
        attempt.release()
        _top_up(res, job_id)
    if out_of_disk:
        _wait_for_disk(res)


def _disk_ready(res: Resident, job_id: str) -> bool:
    """The floor check before a claim (worker/disk.py): False when the disk says no, after handing the job back (a
    fresh render message, so another worker, or this one once space is back, takes it) and waiting for space."""
    reason = res.disk.check()
    res.heartbeat.set_disk(reason)
    if reason is None:
        return True
    if res.r.hget(keys.job(job_id), "status") == JobStatus.QUEUED.value:
        res.heartbeat.resend(job_id)
        log.warning("job handed back unclaimed: %s", reason, extra={"job_id": job_id})
    _wait_for_disk(res)
    return False


def _wait_for_disk(res: Resident) -> None:
    """Hold this (solo-pool) consumer, so it takes no message, until the disk says yes or a shutdown begins."""
    from celery.worker import state as worker_state  # noqa: PLC0415

    def stopping() -> bool:
        return worker_state.should_stop not in (None, False) or worker_state.should_terminate not in (None, False)

    if disk.wait_until_ok(res.disk, res.heartbeat.set_disk, res.settings.heartbeat_interval_s, stopping):
        res.heartbeat.set_ready()


def _top_up(res: Resident, job_id: str) -> None:
    """This worker is free again: release the next held batch item into the render queue (core/batches.py; or the
    overdue one, core/lanes.py), and finish the job's batch if this was its last item."""
    try:
        batches.after_job(res.r, job_id, res.heartbeat.resend,
                          record_ttl_s=res.settings.result_ttl_s + defaults.RECORD_GRACE_S,
                          interactive_streak=res.settings.interactive_streak)
    except redis.exceptions.RedisError as exc:  # the heartbeat's next feed and the reaper pass catch up
        log.warning("batch feed after job failed error=%s", type(exc).__name__, extra={"job_id": job_id})
