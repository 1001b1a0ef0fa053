"""What a render may do while it holds its job's lease, and the per-job execution counters that prove it.

core/jobs.py takes and renews the lease (`h3b:lease:{id}` = `worker:attempt`); this module answers the questions
run_job asks around the render itself (spec §4):

- Does this attempt still own the job? (`still_owner`: the lease value and the record's attempt both match.) A
  worker cut off from Redis for longer than the lease TTL may be requeued and re-claimed elsewhere while it keeps
  rendering; it must then stop at its next step boundary and leave the other attempt's files alone.
- Where does an attempt write? (`attempt_path`: `.attempt-<n>.mp4` beside the final name, so two attempts never
  write the same file) and how does it become the job's MP4? (`publish`: only while the lease is still this
  attempt's, the artifact store (core/artifact_store.py) takes it: `os.replace` onto `video.mp4` in the local
  directory, or a confirmed multipart upload to the attempt's own key `<id>/attempt-<n>/video.mp4` in S3; the
  `completed` compare-and-set on (in_progress, attempt) follows and names that key.)
- What does a failed, cancelled or superseded attempt clean up? (`clean_up`: only its own file and uploaded object,
  unless the job is gone or finished without a video, when everything of the job goes.)
- How many times did a job start, and finish a render? (`count`: `h3b:runs:{id}`; tests count executions there.)
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import redis

from h3batch.core import keys
from h3batch.core.artifact_store import ArtifactStore, LocalStore, StoredObject

log = logging.getLogger("h3batch.worker")

RUNS_TTL_S = 7 * 86_400
"""Execution counters outlive any job record (result TTL + grace is about a day) and then expire by themselves."""

_OWNER_CHECK = """
local lease = redis.call('get', KEYS[1])
local attempt = redis.call('hget', KEYS[2], 'attempt')
local status = redis.call('hget', KEYS[2], 'status')
if lease == ARGV[1] and attempt == ARGV[2] and status == 'in_progress' then return 1 end
return 0
"""


class LeaseLost(RuntimeError):
    """This attempt no longer owns its job (lease lapsed and the job was requeued, re-claimed, or finished)."""


def still_owner(r: redis.Redis, job_id: str, holder: str, attempt: int) -> bool:
    """True while `holder` holds the lease and the record is in_progress with this attempt (one atomic read)."""
    return bool(r.eval(_OWNER_CHECK, 2, keys.lease(job_id), keys.job(job_id), holder, str(attempt)))


def attempt_path(job_dir: Path, attempt: int) -> Path:
    """Where attempt `attempt` writes its MP4 (hidden, per attempt, same directory as the final name)."""
    return job_dir / f".attempt-{attempt}.mp4"


def publish(r: redis.Redis, job_id: str, holder: str, attempt: int, rendered: Path, final: Path | None = None,
            store: ArtifactStore | None = None, sha256: str | None = None) -> StoredObject:
    """Hand this attempt's finished MP4 to the artifact store, only while it still owns the job; returns what the
    store now holds (its key goes into the `completed` record). Without `store`: the local directory above
    `final`'s job folder.

    Raises LeaseLost (leaving `rendered` for clean_up) when another attempt took over meanwhile, and the store's
    StoreUnavailable when the upload failed or was not confirmed (nothing is then referenced).
    """
    if store is None:
        store = LocalStore((final or rendered).parent.parent)
    if not still_owner(r, job_id, holder, attempt):
        raise LeaseLost(f"job {job_id}: attempt {attempt} lost its lease before publishing its video")
    return store.publish(job_id, attempt, rendered, sha256)


def clean_up(r: redis.Redis, job_id: str, attempt: int, job_dir: Path, store: ArtifactStore | None = None) -> None:
    """After an attempt that did not complete the job: remove its own file (and uploaded object); remove everything
    of the job only when it is gone or ended without a video (never while another attempt renders or after one
    completed)."""
    attempt_path(job_dir, attempt).unlink(missing_ok=True)
    status = r.hget(keys.job(job_id), "status")
    gone = status is None or status in ("failed", "cancelled")
    if gone:
        shutil.rmtree(job_dir, ignore_errors=True)
    if store is not None and store.kind != "local":
        if gone:
            store.delete_job(job_id)
        else:
            store.delete_attempt(job_id, attempt)


def remove_stale_attempts(job_dir: Path, attempt: int) -> list[str]:
    """Delete files earlier attempts of this job left behind (a worker killed mid-mux); returns their names."""
    if not job_dir.is_dir():
        return []
    mine = attempt_path(job_dir, attempt)
    stale = [p for p in job_dir.iterdir() if p != mine and (p.name.startswith(".attempt-")
                                                            or p.name.endswith(".partial"))]
    for path in stale:
        path.unlink(missing_ok=True)
    return [p.name for p in stale]


def count(r: redis.Redis, job_id: str, field: str, amount: int = 1) -> int:
    """Add to one execution counter of a job (`started`, `rendered`, `requeues`, `resent`); returns the new value."""
    key = keys.runs(job_id)
    with r.pipeline(transaction=True) as pipe:
        pipe.hincrby(key, field, amount)
        pipe.expire(key, RUNS_TTL_S)
        value, _ = pipe.execute()
    return int(value)


def runs(r: redis.Redis, job_id: str) -> dict[str, float]:
    """All execution counters of a job (missing counters are absent)."""
    return {k: float(v) for k, v in r.hgetall(keys.runs(job_id)).items()}

