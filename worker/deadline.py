"""Run deadline: a render that runs too long, or stops making progress, fails `run_deadline` and frees its worker;
one past its own `timeout_s` (counted from the job's creation) fails `timeout` the same way.

Failure handled: a hung render (a wedged device, a deadlock in a library, a stage that never returns). Without
this the heartbeat thread renews the job's lease for ever, the watchdog leaves a BUSY worker alone, and /readyz stays
green while the job and the worker are lost. Dead workers are the lease's business (worker/heartbeat.py); idle
consumers the watchdog's (worker/watchdog.py).

Two limits, checked by a thread of their own every `check_every_s` while a job is in hand:
- `H3BATCH_MAX_RUN_S`: the claim (this attempt) is older than this;
- `H3BATCH_RENDER_STALL_S`: no progress report (stage start or denoise step) for this long. It is a new name
  because `H3BATCH_STALL_S` already is the watchdog's idle limit, a different failure with a different cure.

When one fires (steps numbered as they run):
1. the heartbeat stops renewing the lease and says STALLED (what /readyz reports);
2. the job fails `run_deadline` (compare-and-set on this attempt; if the render finished just before, nothing
   happens); retryable when the stall limit fired (a hang is likely the worker's, a fresh one may succeed), not when
   a progressing render ran past MAX_RUN_S (the same request would take as long again);
3. the lease is dropped; the render's next step-boundary check sees it is no longer the owner and stops, its files
   are removed (worker/attempt.py), and the worker takes the next job;
4. a render that reaches no boundary within `RUN_STOP_GRACE_S` cannot be stopped from inside Python: the worker
   deletes its heartbeat and exits 75, so the supervisor starts a fresh process (the broker redelivers the unacked
   message only after the visibility timeout, and `claim_job` then finds the job failed and does nothing).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from h3batch.core import defaults, jobs, keys
from h3batch.core.jobs import JobStatus

log = logging.getLogger("h3batch.worker")

EXIT_RECYCLE = 75
"""Exit status of a worker whose render could not be stopped (EX_TEMPFAIL, as the watchdog's: restart me)."""


@dataclass(frozen=True)
class DeadlineConfig:
    """The two limits (0 = off) and how often to look."""

    max_run_s: float = float(defaults.MAX_RUN_S)
    stall_s: float = defaults.RENDER_STALL_S
    stop_grace_s: float = defaults.RUN_STOP_GRACE_S
    check_every_s: float = 0.5


@dataclass
class _Held:
    job_id: str
    holder: str
    attempt: int
    claimed: float
    last_progress: float
    timeout_at: float | None = None  # wall clock (time.time()): the job's own created_at + timeout_s
    fired_at: float | None = None


class RunDeadline(threading.Thread):
    """Watches the job in hand; `begin`/`progressed`/`end` are called from the render thread."""

    def __init__(self, r: redis.Redis, worker_name: str, config: DeadlineConfig, *, record_ttl_s: int,
                 on_fire: Callable[[str], None] = lambda job_id: None,
                 on_unstoppable: Callable[[str], None] | None = None):
        super().__init__(name="h3batch-run-deadline", daemon=True)
        self.r, self.worker_name, self.config, self.record_ttl_s = r, worker_name, config, record_ttl_s
        self.on_fire = on_fire  # the heartbeat: stop renewing the lease, say STALLED
        self.on_unstoppable = on_unstoppable or self._exit
        self._held: _Held | None = None
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def begin(self, job_id: str, holder: str, attempt: int, timeout_at: float | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            self._held = _Held(job_id, holder, attempt, claimed=now, last_progress=now, timeout_at=timeout_at)

    def progressed(self) -> None:
        with self._lock:
            if self._held is not None:
                self._held.last_progress = time.monotonic()

    def end(self) -> None:
        with self._lock:
            self._held = None

    def fired(self, job_id: str) -> bool:
        """True once the deadline failed this job (the render must stop at its next boundary)."""
        with self._lock:
            return self._held is not None and self._held.job_id == job_id and self._held.fired_at is not None

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.config.check_every_s):
            try:
                self.check()
            except redis.exceptions.RedisError as exc:  # retried next check; the lease lapses if Redis stays away
                log.warning("run deadline check failed error=%s", type(exc).__name__)

    def check(self, now: float | None = None) -> str | None:
        """One look; returns what it did: None, "fired" or "unstoppable"."""
        now = time.monotonic() if now is None else now
        with self._lock:
            held = self._held
            if held is None:
                return None
            if held.fired_at is not None:
                if now - held.fired_at < self.config.stop_grace_s:
                    return None
                job_id = held.job_id
            else:
                job_id = None
                reason = self._reason(held, now)
                if reason is None:
                    return None
        if job_id is not None:
            self.on_unstoppable(job_id)
            return "unstoppable"
        return "fired" if self._fire(held, reason, now) else None

    def _reason(self, held: _Held, now: float) -> tuple[str, bool, str] | None:
        """(message, retryable, error code) when a limit is passed: the job's own timeout_s first (`timeout`),
        then the operator's run and stall limits (`run_deadline`)."""
        max_run, stall = self.config.max_run_s, self.config.stall_s
        if held.timeout_at is not None and time.time() >= held.timeout_at:
            return "the job was not finished within its timeout_s (counted from its creation)", False, "timeout"
        if max_run and now - held.claimed > max_run:
            return f"the render ran longer than H3BATCH_MAX_RUN_S ({max_run:g} s)", False, "run_deadline"
        if stall and now - held.last_progress > stall:
            return f"the render made no progress for H3BATCH_RENDER_STALL_S ({stall:g} s)", True, "run_deadline"
        return None

    def _fire(self, held: _Held, reason: tuple[str, bool, str], now: float) -> bool:
        message, retryable, code = reason
        self.on_fire(held.job_id)
        stage = self.r.hget(keys.job(held.job_id), "stage")
        failed = jobs.transition(self.r, held.job_id, JobStatus.FAILED, expect={JobStatus.IN_PROGRESS},
                                 expect_attempt=held.attempt, record_ttl_s=self.record_ttl_s,
                                 fields={"error": {"code": code, "message": message,
                                                   "retryable": retryable, "stage": stage}})
        jobs.drop_lease(self.r, held.job_id, held.holder)
        with self._lock:
            if self._held is held:
                held.fired_at = now
        if failed is not None:
            log.error("run deadline: %s; job failed, lease released", message,
                      extra={"job_id": held.job_id, "worker": self.worker_name})
        return failed is not None

    def _exit(self, job_id: str) -> None:
        log.error("run deadline: the render did not stop within %.0f s; exiting with %d so the supervisor starts "
                  "a fresh worker", self.config.stop_grace_s, EXIT_RECYCLE,
                  extra={"job_id": job_id, "worker": self.worker_name})
        try:
            self.r.delete(keys.worker(self.worker_name))
        except redis.exceptions.RedisError:
            pass
        logging.shutdown()
        os._exit(EXIT_RECYCLE)  # the render thread is stuck in native code or a sleep: nothing else can end it
