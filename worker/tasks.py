"""The Celery render task: a job id in, one attempt at it run to one recorded outcome.

The steps live in worker/attempt.py, the state kept between jobs (pipeline, heartbeat) in worker/resident.py.
"""
from __future__ import annotations

import logging

import redis
from celery import shared_task

from h3batch.core import batches, defaults, lease
from h3batch.core.exceptions import JobError
from h3batch.settings import Settings
from h3batch.worker.attempt import Attempt
from h3batch.worker.resident import Resident, load_resident

log = logging.getLogger("h3batch.worker")


@shared_task(name=defaults.RENDER_TASK, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def render(job_id: str) -> None:
    """Render one job by id (the message carries nothing else)."""
    run_job(load_resident(Settings.from_env()), job_id)


def run_job(res: Resident, job_id: str) -> None:
    """Claim, render, publish, finish. Every outcome ends in one `transition`; a lost race leaves no files behind."""
    from h3batch.worker.pipeline import RenderCancelled  # noqa: PLC0415  (torch)
    from h3batch.worker.rank_group import RankGroupError  # noqa: PLC0415

    attempt = Attempt.claim(res, job_id)
    if attempt is None:
        return
    try:
        result = attempt.render()
        attempt.finish_completed(result, attempt.publish(result))
    except (RenderCancelled, lease.LeaseLost):
        attempt.finish_cancelled()
    except JobError as exc:
        attempt.finish_refused(exc)
    except RankGroupError as exc:
        attempt.exit_for_restart(exc)
    except redis.exceptions.ConnectionError as exc:
        attempt.leave_to_reaper(exc)
    except Exception as exc:  # unexpected: the traceback goes to the log and a private record field, never the API
        attempt.finish_crashed(exc)
    finally:
        attempt.release()
        _top_up(res, job_id)


def _top_up(res: Resident, job_id: str) -> None:
    """This worker is free again: release the next held batch item into the render queue (core/batches.py), and
    finish the job's batch if this was its last item."""
    try:
        batches.after_job(res.r, job_id, res.heartbeat.resend,
                          record_ttl_s=res.settings.result_ttl_s + defaults.RECORD_GRACE_S)
    except redis.exceptions.RedisError as exc:  # the heartbeat's next feed and the reaper pass catch up
        log.warning("batch feed after job failed error=%s", type(exc).__name__, extra={"job_id": job_id})
