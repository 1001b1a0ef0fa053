"""One attempt at a render job, as the steps `worker/tasks.py` `run_job` calls: claim, render, publish, finish.

Everything about statuses goes through core/jobs.py: every outcome ends in one `transition`, compare-and-set on this
attempt's number, and any outcome but `completed` removes the attempt's files (`lease.clean_up`), so a lost race
leaves nothing behind. The step that fails decides nothing; `run_job` maps the exception to one `finish_*` step.
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from h3batch.core import defaults, jobs, keys, lease
from h3batch.core.artifact_store import ArtifactStore, StoreUnavailable, open_store, sha256_file
from h3batch.core.exceptions import (
    ExceedsWorkerCapacity,
    InvalidRequest,
    JobTimeout,
    JobError,
    LoraBaseMismatch,
    LoraUnavailable,
    NoCapableWorker,
    ReleaseMismatch,
)
from h3batch.core.geometry import RequestGeometry
from h3batch.core.jobs import JobStatus, Stage
from h3batch.worker import job_metadata, reaper
from h3batch.worker.resident import Resident

log = logging.getLogger("h3batch.worker")

VIDEO_NAME = "video.mp4"
"""File name of a job's MP4 inside `<artifacts>/<job id>/`."""


def _progress_at(stage: str, step: int, total: int) -> float:
    if stage == Stage.DENOISE.value and total > 0:
        return defaults.PROGRESS_AT_STAGE["denoise"] + defaults.DENOISE_SPAN * step / total
    return defaults.PROGRESS_AT_STAGE[stage]


def _free_accelerator_memory() -> None:
    """Give cached GPU blocks back after a cancelled or failed render (no-op on CPU)."""
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Attempt:
    """A job this worker holds the lease of: its record as claimed, where its files go, how far it got."""

    res: Resident
    job_id: str
    record: dict[str, Any]  # the job record as `claim_job` returned it
    holder: str  # lease holder `worker:attempt`
    job_dir: Path
    stage: str = Stage.TEXT_ENCODE.value
    progress: float = 0.0
    meta: dict[str, Any] | None = None  # job metadata (set by `render`, stored on completion)
    rows: int = 0  # the request's capacity rows (RequestGeometry.capacity_rows), set by `render`

    @property
    def number(self) -> int:
        return self.record["attempt"]

    @property
    def timeout_at(self) -> float | None:
        """Wall-clock time by which the job must be finished (created_at + its timeout_s), None without one."""
        timeout_s = self.record.get("timeout_s")
        return self.record["created_at"] + timeout_s if timeout_s else None

    @property
    def log_extra(self) -> dict[str, str]:
        return {"job_id": self.job_id}

    @property
    def store(self) -> ArtifactStore:
        """Where the finished MP4 goes (H3BATCH_ARTIFACT_STORE); `job_dir` is where it is rendered."""
        return open_store(self.res.settings)

    # 1. Claim ---------------------------------------------------------------------------------------------------

    @classmethod
    def claim(cls, res: Resident, job_id: str) -> Attempt | None:
        """Take the job (`queued` → `in_progress`, attempt + 1, lease); None when it is gone, finished or held."""
        settings, r = res.settings, res.r
        claimed = jobs.claim_job(r, job_id, settings.worker_name, release_id=res.pipeline.release_id,
                                 record_ttl_s=settings.result_ttl_s + defaults.RECORD_GRACE_S,
                                 lease_ttl_ms=int(settings.lease_ttl_s * 1000))
        if claimed is None:
            log.info("skipped: job is gone, finished or held by another worker", extra={"job_id": job_id})
            return None
        record, holder = claimed
        att = cls(res=res, job_id=job_id, record=record, holder=holder, job_dir=settings.artifacts_dir / job_id)
        lease.count(r, job_id, "started")
        res.heartbeat.set_busy(job_id, holder)
        res.deadline.begin(job_id, holder, att.number, timeout_at=att.timeout_at)
        if lease.remove_stale_attempts(att.job_dir, att.number):
            log.info("removed partial files of an earlier attempt", extra=att.log_extra)
        if att.store.kind != "local":
            try:
                if att.store.remove_stale_attempts(job_id, att.number):
                    log.info("removed objects an earlier attempt uploaded", extra=att.log_extra)
            except StoreUnavailable as exc:  # the garbage pass removes them later
                log.warning("could not remove an earlier attempt's objects: %s", exc, extra=att.log_extra)
        log.info("render started attempt=%d", att.number, extra=att.log_extra)
        return att

    # 2. Render, with progress and cancel checks -------------------------------------------------------------------

    def input_images(self) -> dict[str, Any]:
        """The job's input images (record `inputs`, api/job_inputs.py) as local paths: the local store's own files,
        or S3 objects downloaded into `<job dir>/inputs/`."""
        inputs = self.record.get("inputs") or {}
        folder = self.job_dir / "inputs"

        def local(key: str) -> Path:
            path = self.store.local_path(key)
            if path is not None and path.is_file():
                return path
            folder.mkdir(parents=True, exist_ok=True)
            return self.store.download(key, folder / Path(key).name)

        out: dict[str, Any] = {}
        for name in ("first_frame", "last_frame"):
            if inputs.get(name):
                out[name] = local(inputs[name])
        if inputs.get("references"):
            out["references"] = tuple(local(key) for key in inputs["references"])
        return out

    def render(self) -> Any:
        """Check the job against this worker, render it into the attempt's file; returns the `RenderResult`.

        Raises JobTimeout / ReleaseMismatch / NoCapableWorker / InvalidRequest / ExceedsWorkerCapacity (refusals),
        RenderCancelled
        or LeaseLost
        (stopped), or what the pipeline raised (torch.OutOfMemoryError among it).
        """
        from h3batch.worker.pipeline import RenderRequest  # noqa: PLC0415  (torch)

        record, pipeline, settings = self.record, self.res.pipeline, self.res.settings
        if self.timeout_at is not None and time.time() >= self.timeout_at:  # waited in the queue past its timeout
            raise JobTimeout(f"the job was not finished within its timeout_s ({record['timeout_s']:g} s from "
                             f"creation): it waited {time.time() - record['created_at']:.1f} s before a worker took it")
        wanted = record.get("release")
        if wanted and wanted != pipeline.release_id:
            raise ReleaseMismatch(f"release: this worker serves {pipeline.release_id!r}, the job asks for "
                                  f"{wanted!r}")
        serves = self.res.capability  # None: a Resident built without one (tests)
        task, precision = record.get("task") or "t2va", record.get("precision") or "bf16"
        if serves is not None and (task not in serves.tasks or precision != serves.precision):
            raise NoCapableWorker(f"this worker serves {'/'.join(serves.tasks)} in {serves.precision}; the job needs "
                                  f"{task} in {precision}")
        if record.get("loras") and not getattr(pipeline, "takes_loras", False):
            raise LoraBaseMismatch(f"loras: this worker serves {pipeline.release_id!r}, a release that takes no "
                                   "adapters (FastH3 V2 is a full checkpoint); per-job LoRAs need the native "
                                   "MiniMax-H3 release")
        self._use_loras(record.get("loras") or [], task)
        self.meta = job_metadata.for_job(record, release_id=pipeline.release_id,
                                         contract_hash=getattr(pipeline, "contract_hash", ""),
                                         device=str(getattr(pipeline, "device", "") or settings.device or "") or None,
                                         ranks=int(getattr(pipeline, "ranks", 1)),
                                         provenance=getattr(pipeline, "provenance", None))
        request = RenderRequest(prompt=record["prompt"], seconds=record["seconds"], width=record["width"],
                                height=record["height"], seed=record["seed"],
                                metadata=job_metadata.mp4_tags(self.meta), task=task, **self.input_images())
        try:
            pipeline.validate(request)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        self.rows = RequestGeometry(request.width, request.height, request.seconds).capacity_rows
        if self.rows > self.res.max_rows:  # the API refuses these up front; the fleet may have shrunk since
            raise ExceedsWorkerCapacity(f"this request needs {self.rows} rows ({request.width}x{request.height}, "
                                        f"{request.seconds:g} s); this worker serves at most {self.res.max_rows}")
        self.job_dir.mkdir(parents=True, exist_ok=True)
        return pipeline.render(request, lease.attempt_path(self.job_dir, self.number),
                               on_progress=self.on_progress, should_cancel=self.should_cancel)

    def _use_loras(self, items: list, task: str) -> None:
        """The job's per-job LoRAs on the resident DiT (none: every hook off); an adapter set already applied (the
        previous job's) is kept, and each set applied is counted in h3b:stats `lora_applies`."""
        pipeline = self.res.pipeline
        if not getattr(pipeline, "takes_loras", False):
            return
        if items and task == "ref2va":
            raise LoraBaseMismatch("loras: per-job LoRAs apply to the t2va/fl2va partition (transformer/), not "
                                   "ref2va's transformer_ref/")
        from h3batch.worker.h3.adapters import AdapterError  # noqa: PLC0415  (torch)

        try:
            applied = pipeline.use_loras(items)
        except AdapterError as exc:
            raise LoraBaseMismatch(f"loras: {exc}") from None
        except (OSError, ValueError) as exc:  # a folder gone, the Hub unreachable or offline without it cached
            raise LoraUnavailable(f"loras: could not load an adapter: {type(exc).__name__}: {exc}") from None
        if applied:
            self.res.r.hincrby(keys.STATS, "lora_applies", applied)

    def on_progress(self, stage: str, step: int, total: int) -> None:
        """Pipeline callback at every stage and denoise step: record stage, step and progress (never backwards)."""
        self.res.deadline.progressed()
        self.progress = max(self.progress, _progress_at(stage, step, total))
        self.stage = stage
        fields: dict[str, Any] = {"stage": stage, "progress": round(self.progress, 4)}
        if stage == Stage.DENOISE.value:
            fields["step"] = step
            if total != self.record.get("total_steps"):  # the release's grid: 8 on V2, 49 on the native release
                fields["total_steps"] = self.record["total_steps"] = total
        elif stage in (Stage.DECODE.value, Stage.MUX.value):
            fields["step"] = self.record["total_steps"]
        jobs.update_progress(self.res.r, self.job_id, self.number, fields)
        if self.res.settings.debug_step_delay_s:
            time.sleep(self.res.settings.debug_step_delay_s)
        if self.res.settings.debug_oom_at is not None:  # test knob: raises torch's OOM error inside the pipeline
            from h3batch.worker.oom import InjectedOom  # noqa: PLC0415  (torch)

            InjectedOom(*self.res.settings.debug_oom_at).check(stage, self.rows)

    def should_cancel(self) -> bool:
        """Pipeline callback at step boundaries; also stops an attempt that lost its lease (re-claimed elsewhere, or
        released by the run deadline)."""
        r = self.res.r
        return self.res.deadline.fired(self.job_id) or jobs.cancel_requested(r, self.job_id) or not lease.still_owner(r, self.job_id, self.holder,
                                                                                self.number)

    # 3. Publish ---------------------------------------------------------------------------------------------------

    def publish(self, result: Any) -> dict[str, Any]:
        """Hand the rendered file to the artifact store while still the lease holder (local: `<job>/video.mp4`;
        S3: a confirmed upload to `<job>/attempt-<n>/video.mp4`); returns its record fields, `artifact` the key."""
        r = self.res.r
        lease.count(r, self.job_id, "rendered")
        jobs.update_progress(r, self.job_id, self.number, {"stage": Stage.FINALIZE, "progress": 0.98})
        t0 = time.perf_counter()
        sha256, size = sha256_file(result.path), result.path.stat().st_size
        stored = lease.publish(r, self.job_id, self.holder, self.number, result.path, self.job_dir / VIDEO_NAME,
                               store=self.store, sha256=sha256)
        timings = {**{k: round(float(v), 6) for k, v in result.timings.items()},
                   "finalize": round(time.perf_counter() - t0, 6)}
        return {"artifact": stored.key, "sha256": sha256, "size_bytes": size, "timings": timings}

    # 4. Finish: one transition per outcome ------------------------------------------------------------------------

    def finish(self, to: JobStatus, fields: dict[str, Any]) -> dict[str, Any] | None:
        """`in_progress` → `to` for this attempt only; unless completed, the attempt's files go too."""
        record_ttl = self.res.settings.result_ttl_s + defaults.RECORD_GRACE_S
        done = jobs.transition(self.res.r, self.job_id, to, expect={JobStatus.IN_PROGRESS},
                               expect_attempt=self.number, fields=fields, record_ttl_s=record_ttl)
        if done is None or to is not JobStatus.COMPLETED:  # deleted, cancelled, failed or superseded
            try:
                lease.clean_up(self.res.r, self.job_id, self.number, self.job_dir, self.store)
            except StoreUnavailable as exc:  # the garbage pass removes what is left
                log.warning("could not remove this attempt's objects: %s", exc, extra=self.log_extra)
        return done

    def finish_completed(self, result: Any, published: dict[str, Any]) -> None:
        # Each outcome's line is logged before its transition, so a client that sees the job finished also finds the
        # line in GET /jobs/{id}/logs (logged after, it raced the client's read).
        log.info("render completed frames=%d bytes=%d seconds=%.3f", result.frames, published["size_bytes"],
                 sum(published["timings"].values()), extra=self.log_extra)
        now = time.time()
        done = self.finish(JobStatus.COMPLETED, {
            "stage": Stage.FINALIZE, "progress": 1.0, "step": self.record["total_steps"], **published,
            "tokens": dict(result.tokens), "frames": result.frames, "finished_at": now, "metadata": self.meta,
            "expires_at": now + self.res.settings.result_ttl_s})
        if done is None:  # finish() already removed the files
            log.info("render finished but the job was deleted or cancelled meanwhile", extra=self.log_extra)

    def finish_cancelled(self) -> None:
        """Cancel requested, or the lease was lost to another attempt or to the run deadline."""
        if self.res.deadline.fired(self.job_id):
            log.info("render stopped after its run deadline stage=%s", self.stage, extra=self.log_extra)
        else:
            log.info("render cancelled stage=%s", self.stage, extra=self.log_extra)
        self.finish(JobStatus.CANCELLED, {"cancelled_at_stage": self.stage})
        _free_accelerator_memory()

    def finish_refused(self, exc: JobError) -> None:
        """The job cannot run here (bad request, other release): fails with the error's code and message."""
        log.info("render refused code=%s message=%s", exc.code, exc.message, extra=self.log_extra)
        self.finish(JobStatus.FAILED, {"error": {"code": exc.code, "message": exc.message,
                                                 "retryable": exc.retryable, "stage": self.stage}})

    def finish_out_of_memory(self, exc: Exception, kind) -> None:
        """Host or GPU memory ran out mid-render (worker/memory_errors.py): the job fails `out_of_memory` (not
        retryable: the same request would run out again) naming the memory, stage and size asked, the memory the
        render held is freed, and the worker takes the next job."""
        from h3batch.worker import memory_errors, oom  # noqa: PLC0415  (torch)

        request = self.record
        canvas = f"{request.get('width')}x{request.get('height')}, {float(request.get('seconds') or 0):g} s"
        error = memory_errors.out_of_memory(exc, kind, stage=self.stage, rows=self.rows, canvas=canvas,
                                            max_rows=self.res.max_rows)
        log.error("render out of %s memory stage=%s rows=%d max_rows=%d error=%s", kind.value, self.stage, self.rows,
                  self.res.max_rows, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__,
                  extra=self.log_extra)
        self.finish(JobStatus.FAILED, {"error": {"code": error.code, "message": error.message,
                                                 "retryable": error.retryable, "stage": self.stage}})
        oom.release_memory(exc)
        log.info("memory released after out-of-memory %s", oom.memory_summary(), extra=self.log_extra)

    def finish_crashed(self, exc: Exception) -> None:
        """Unexpected error; call inside the `except`: the traceback goes to the log and a private record field."""
        log.exception("render failed", extra=self.log_extra)
        self.finish(JobStatus.FAILED, {"error": {"code": "render_error", "retryable": False, "stage": self.stage,
                                                 "message": f"the render failed at stage {self.stage} "
                                                            f"({type(exc).__name__})"},
                                       "traceback": traceback.format_exc()[-8000:]})
        _free_accelerator_memory()

    def exit_for_restart(self, exc: Exception) -> None:
        """A rank died or failed: the group refuses further work, so this worker must go. The job stays
        `in_progress`; its lease lapses and a healthy worker re-runs it (attempt + 1). The supervisor restarts
        this worker."""
        log.error("rank group failed error=%s; exiting so the supervisor restarts the worker", exc,
                  extra=self.log_extra)
        lease.attempt_path(self.job_dir, self.number).unlink(missing_ok=True)
        self.res.heartbeat.stop()
        os._exit(3)

    def leave_to_reaper(self, exc: redis.exceptions.ConnectionError | StoreUnavailable) -> None:
        """Redis went away mid-render (restart, failover), or the object store refused the upload: an
        infrastructure fault, not the job's. The record stays `in_progress`; once the lease is dropped or lapses
        the reaper requeues it (attempt + 1, a fresh render; an unconfirmed upload is never referenced)."""
        if isinstance(exc, StoreUnavailable):
            log.warning("upload failed: %s; the job is requeued and rendered again", exc, extra=self.log_extra)
        else:
            log.warning("lost Redis mid-render error=%s; the job is requeued when its lease lapses",
                        type(exc).__name__, extra=self.log_extra)
        lease.attempt_path(self.job_dir, self.number).unlink(missing_ok=True)

    def requeue_for_disk(self, fault: OSError) -> None:
        """A write failed with ENOSPC/EDQUOT (worker/disk.py): the disk's fault, not the job's. The attempt's files
        go, the job goes back to `queued` (attempt + 1 later; a cancel asked for meanwhile is honoured instead) with
        a fresh render message sent once this attempt's lease is dropped, and the heartbeat says DISK_FULL."""
        r = self.res.r
        log.error("render stopped: no disk space at stage %s (%s); the job goes back to the queue", self.stage,
                  fault, extra=self.log_extra)
        try:
            lease.clean_up(r, self.job_id, self.number, self.job_dir, self.store)
        except StoreUnavailable as exc:  # the garbage pass removes what is left
            log.warning("could not remove this attempt's objects: %s", exc, extra=self.log_extra)
        self.res.heartbeat.set_disk(self.res.disk.record_fault(fault))
        if jobs.cancel_requested(r, self.job_id):
            self.finish_cancelled()
            return
        if reaper.requeue(r, self.job_id, self.number, reason="disk_full"):
            jobs.drop_lease(r, self.job_id, self.holder)
            self.res.heartbeat.resend(self.job_id)

    def release(self) -> None:
        """Always last: drop the lease (if Redis answers) and tell the heartbeat this worker is free."""
        self.res.deadline.end()
        try:
            jobs.drop_lease(self.res.r, self.job_id, self.holder)
        except redis.exceptions.RedisError:
            pass  # Redis still away: the lease lapses by its TTL
        self.res.heartbeat.set_ready()
