"""Worker liveness, seen from outside: the heartbeat thread, the state it announces, and the reaper trigger it carries.

Failure handled: a worker that is gone (killed, frozen, cut off from Redis). Its `h3b:worker:{name}` key (TTL 15 s)
stops being refreshed, so /readyz stops counting it, and the lease of the job it was rendering stops being renewed,
so the lease lapses and `resend_lost_jobs` (run by any live worker's heartbeat) puts the job back in line through
`worker/reaper.py`.
"""
from __future__ import annotations

import enum
import json
import logging
import os
import threading
import time
from typing import Any, Callable

import redis

from h3batch.core import batches, capacity, defaults, jobs, keys
from h3batch.core.artifact_store import StoreUnavailable, open_store
from h3batch.core.routing import Capability
from h3batch.settings import Settings
from h3batch.worker import reaper
from h3batch.worker.disk import DiskHealth

log = logging.getLogger("h3batch.worker")


class WorkerState(str, enum.Enum):
    """The `state` of a worker's heartbeat payload (the strings /readyz and the container health check read)."""

    STARTING = "STARTING"  # model loaded, consumer not taking messages yet (not counted by /readyz)
    READY = "READY"  # consuming, no job in hand
    BUSY = "BUSY"  # rendering a job (its lease is renewed with every beat)
    STALLED = "STALLED"  # its render hit the run deadline and has not stopped yet (worker/deadline.py)
    DISK_FULL = "DISK_FULL"  # takes no jobs: free disk under the floor, or a write failed (worker/disk.py; `reason`)


class Heartbeat(threading.Thread):
    """Refreshes `h3b:worker:{name}` (TTL 15 s) every 5 s and renews the lease of the job being rendered; a second
    thread feeds held batch items and every 10 s (one worker at a time, under a Redis lock) runs the reaper
    (`resend_lost_jobs`), so no slow pass delays a renewal. When `info` has
    `max_rows` (worker/capacity.py), each beat also writes the worker's capability (max_rows, precision,
    release_kind, tasks, canvas: core/routing.Capability) to `h3b:capacity`, which the API routes and refuses
    requests by (core/capacity.py)."""

    def __init__(self, r: redis.Redis, name: str, info: dict[str, Any], resend: Callable[[str], None],
                 settings: Settings, state: WorkerState = WorkerState.READY, disk: DiskHealth | None = None):
        super().__init__(name="h3batch-heartbeat", daemon=True)
        self.r = r
        self.settings = settings
        self.worker_name = name
        self.info = dict(info)
        self.resend = resend
        self.state = state
        self.job_id: str | None = None
        self.lease_holder: str | None = None
        self.disk = disk  # checked on every idle beat (worker/disk.py)
        self.disk_reason: str | None = None  # why the worker takes no jobs now; None when it may
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def set_busy(self, job_id: str, holder: str) -> None:
        with self._lock:
            self.state, self.job_id, self.lease_holder = WorkerState.BUSY, job_id, holder
        self.beat()

    def set_stalled(self, job_id: str) -> None:
        """The run deadline fired: stop renewing the job's lease; /readyz reports this worker as stalled."""
        with self._lock:
            self.state, self.job_id, self.lease_holder = WorkerState.STALLED, job_id, None
        self.beat()

    def set_ready(self) -> None:
        """No job in hand: READY, or DISK_FULL while the disk says no."""
        with self._lock:
            self.job_id, self.lease_holder = None, None
            self.state = WorkerState.DISK_FULL if self.disk_reason else WorkerState.READY
        self.beat()

    def set_disk(self, reason: str | None) -> None:
        """The disk's verdict (None: fine). Between jobs it decides READY or DISK_FULL; a render in hand keeps BUSY
        (its own writes decide its outcome)."""
        with self._lock:
            changed = reason != self.disk_reason
            self.disk_reason = reason
            if self.state in (WorkerState.READY, WorkerState.DISK_FULL):
                changed = changed or (self.state is WorkerState.DISK_FULL) != bool(reason)
                self.state = WorkerState.DISK_FULL if reason else WorkerState.READY
        if changed:
            if reason:
                log.error("not taking jobs: %s", reason, extra={"worker": self.worker_name})
            else:
                log.info("taking jobs again: disk space is back", extra={"worker": self.worker_name})
            self.beat()

    def check_disk(self) -> None:
        """An idle beat's disk look: free space against the floor, or the probe after a failed write."""
        if self.disk is not None and self.state in (WorkerState.READY, WorkerState.DISK_FULL):
            self.set_disk(self.disk.check())

    def beat(self) -> None:
        with self._lock:
            payload = {**self.info, "name": self.worker_name, "state": self.state.value, "job_id": self.job_id,
                       "ts": time.time(), "pid": os.getpid()}
            if self.state is WorkerState.DISK_FULL:
                payload["reason"] = self.disk_reason
            job_id, holder = self.job_id, self.lease_holder
        try:
            with self.r.pipeline(transaction=False) as pipe:
                pipe.set(keys.worker(self.worker_name), json.dumps(payload), ex=defaults.HEARTBEAT_TTL_S)
                if payload.get("max_rows") is not None:  # what the API routes and refuses by (core/capacity.py)
                    capacity.record(pipe, self.worker_name, Capability.from_json(payload), payload["ts"])
                pipe.execute()
            if job_id and holder:
                jobs.renew_lease(self.r, job_id, holder, int(self.settings.lease_ttl_s * 1000))
        except redis.exceptions.RedisError as exc:  # Redis blip: the next beat retries; the key's TTL tells readers
            log.warning("heartbeat failed error=%s", type(exc).__name__)

    def resend_lost_jobs(self) -> list[str]:
        """One reaper pass, unless another worker ran one within the interval (`h3b:reconcile` lock).

        Running jobs whose lease lapsed go back to `queued` with a new render message (claim_job then re-claims
        them with attempt + 1); queued jobs whose message was lost get a new one; artifacts of expired or missing
        records are removed (`reaper.collect_garbage`). Returns the ids sent again.
        """
        lock_ms = int(self.settings.reconcile_interval_s * 1000)
        if not self.r.set(keys.RECONCILE_LOCK, self.worker_name, nx=True, px=lock_ms):
            return []  # another worker ran the reaper within the interval
        report = reaper.reap(self.r, self.resend, grace_s=max(self.settings.lease_ttl_s, 1.0),
                             record_ttl_s=self.settings.result_ttl_s + defaults.RECORD_GRACE_S)
        try:
            reaper.collect_garbage(self.r, self.settings.artifacts_dir,
                                   orphan_age_s=self.settings.result_ttl_s + defaults.RECORD_GRACE_S,
                                   store=open_store(self.settings), upload_age_s=self.settings.visibility_timeout_s)
        except StoreUnavailable as exc:  # the object store is away: the next pass tries again
            log.warning("garbage pass skipped: %s", exc)
        batches.check_open(self.r, record_ttl_s=self.settings.result_ttl_s + defaults.RECORD_GRACE_S)
        if report.requeued:
            log.warning("re-enqueuing job whose worker lost its lease", extra={"job_id": ",".join(report.requeued)})
        return report.requeued + report.resent

    def run(self) -> None:
        housekeeping = threading.Thread(target=self._housekeep, name="h3batch-housekeeping", daemon=True)
        housekeeping.start()
        while not self._stop_event.wait(self.settings.heartbeat_interval_s):
            self.check_disk()
            self.beat()

    def _housekeep(self) -> None:
        """The batch feed and the reaper pass, on their own thread: a slow pass (a bucket listing in the garbage
        sweep, a long queue) must never delay the beat that renews the lease of the job in hand, or a live
        worker's job would lapse and be rendered twice."""
        last_reap = 0.0
        while not self._stop_event.wait(self.settings.heartbeat_interval_s):
            try:  # held batch items into idle capacity (core/batches.py): catches any missed top-up
                batches.feed(self.r, self.resend, interactive_streak=self.settings.interactive_streak)
            except redis.exceptions.RedisError as exc:
                log.warning("batch feed failed error=%s", type(exc).__name__)
            if time.monotonic() - last_reap >= self.settings.reconcile_interval_s:
                last_reap = time.monotonic()
                try:
                    self.resend_lost_jobs()
                except Exception:  # never let a reaper error stop housekeeping; it is retried next interval
                    log.exception("reaper pass failed")

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)  # a beat in flight must not re-create the key after we delete it
        try:
            self.r.delete(keys.worker(self.worker_name))
        except redis.exceptions.RedisError:
            pass  # the key expires by itself within HEARTBEAT_TTL_S
