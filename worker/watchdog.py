"""Consumer watchdog: a worker that is idle while render messages wait for longer than H3BATCH_STALL_S exits, so its
supervisor (compose `restart: unless-stopped`, systemd, the test harness) starts a fresh one.

Failure handled: a live worker whose Celery consumer died (heartbeat fine, nothing taken from the broker). Dead
workers are the heartbeat's and the reaper's business (worker/heartbeat.py, worker/reaper.py), not this module's.

This is the known Celery + Redis failure mode of spec §3 pitfall 6: after a broker restart the worker reconnects,
its heartbeat thread keeps beating, yet the consumer takes nothing (celery#8030, #8091, #9054). The heartbeat alone
cannot see that, and Docker does not restart an `unhealthy` container by itself, so the watchdog ends the process.

Stalled means, at every check during the last `stall_s` seconds: the broker list of a consumed queue held messages,
this worker was not rendering (heartbeat state not BUSY) nor holding back for want of disk space (DISK_FULL: it
takes nothing on purpose, worker/disk.py), and no task started in this process (Celery's `task_prerun`
signal, which also fires for deliveries that are skipped as stale). Redis errors reset nothing and decide nothing:
while Redis is down there is no way to tell, and the consumer's own reconnect logic is still running.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import redis

from h3batch.core import broker, keys
from h3batch.core.exceptions import ConfigError
from h3batch.worker.heartbeat import WorkerState

log = logging.getLogger("h3batch.worker")

EXIT_STALLED = 75
"""Process exit status of a stalled worker (EX_TEMPFAIL: try again), so a supervisor can tell it from a crash."""

DEFAULT_STALL_S = 60.0


@dataclass(frozen=True)
class WatchdogConfig:
    """H3BATCH_STALL_S: seconds of idle-with-work before the worker exits (0 turns the watchdog off)."""

    stall_s: float = DEFAULT_STALL_S
    check_every_s: float = 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WatchdogConfig":
        env = os.environ if env is None else env
        raw = env.get("H3BATCH_STALL_S", "").strip()
        if not raw:
            return cls()
        try:
            stall_s = float(raw)
        except ValueError:
            raise ConfigError(f"H3BATCH_STALL_S: expected seconds (a number >= 0), found {raw!r}") from None
        if not stall_s >= 0:
            raise ConfigError(f"H3BATCH_STALL_S: expected seconds (a number >= 0), found {raw!r}")
        return cls(stall_s=stall_s, check_every_s=min(1.0, max(stall_s / 5, 0.1)))


class Watchdog(threading.Thread):
    """Checks once per `check_every_s`; calls `on_stall` (default: exit the process) when stalled."""

    def __init__(self, r: redis.Redis, worker_name: str, queues: list[str], state: Callable[[], WorkerState],
                 config: WatchdogConfig, on_stall: Callable[[float], None] | None = None):
        super().__init__(name="h3batch-watchdog", daemon=True)
        self.r, self.worker_name, self.queues, self.state, self.config = r, worker_name, queues, state, config
        self.on_stall = on_stall or self._exit
        self.last_task_started = time.monotonic()
        self._armed = threading.Event()  # set once the consumer is up (Celery worker_ready): start-up is not a stall
        self._stop_event = threading.Event()

    def arm(self, **_: object) -> None:
        """Celery `worker_ready` receiver: from now on the consumer should be taking messages."""
        self.last_task_started = time.monotonic()
        self._armed.set()

    def task_started(self, **_: object) -> None:
        """Celery `task_prerun` receiver: the consumer delivered something to this process."""
        self.last_task_started = time.monotonic()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        stalled_since: float | None = None
        while not self._stop_event.wait(self.config.check_every_s):
            now = time.monotonic()
            if not self._armed.is_set():
                continue
            try:
                waiting = sum(broker.ready_depth(self.r, q) for q in self.queues)
            except redis.exceptions.RedisError:
                continue  # cannot tell while Redis is away
            if waiting == 0 or self.state() in (WorkerState.BUSY, WorkerState.DISK_FULL):
                stalled_since = None
                continue
            stalled_since = stalled_since if stalled_since is not None else now
            idle_for = now - max(stalled_since, self.last_task_started)
            if idle_for >= self.config.stall_s:
                self.on_stall(idle_for)
                stalled_since = None

    def _exit(self, idle_for: float) -> None:
        log.error("watchdog: consumer stalled (messages waiting, nothing taken for %.0f s); exiting with %d so "
                  "the supervisor restarts this worker", idle_for, EXIT_STALLED, extra={"worker": self.worker_name})
        try:
            self.r.delete(keys.worker(self.worker_name))  # /readyz stops counting this worker at once
        except redis.exceptions.RedisError:
            pass
        logging.shutdown()
        os._exit(EXIT_STALLED)  # the consumer is wedged: a clean Celery shutdown could wedge too


def start(r: redis.Redis, worker_name: str, queues: list[str], state: Callable[[], WorkerState],
          config: WatchdogConfig | None = None) -> Watchdog | None:
    """Start the watchdog for a consuming worker and hook it to Celery's task_prerun; None when turned off.

    `state` reads the worker's heartbeat state; a BUSY worker is rendering, never stalled.
    """
    config = config or WatchdogConfig.from_env()
    if config.stall_s == 0:
        log.warning("watchdog off (H3BATCH_STALL_S=0): a consumer that stops taking messages is not restarted")
        return None
    from celery.signals import task_prerun, worker_ready  # noqa: PLC0415

    dog = Watchdog(r, worker_name, queues, state, config)
    task_prerun.connect(dog.task_started, weak=False)
    worker_ready.connect(dog.arm, weak=False)
    dog.start()
    log.info("watchdog on stall_s=%.1f queues=%s", config.stall_s, ",".join(queues))
    return dog

