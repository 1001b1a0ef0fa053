"""Disk space as a worker health input: a full disk is the worker's fault, never the job's.

Failure handled: the artifacts dir (the render's scratch space, and with a local store where finished MP4s live)
runs out of space or hits a quota. Before this, the mux's ENOSPC failed the job `render_error` (not retryable), the
heartbeat stayed READY and the worker went on taking jobs and failing each of them.

Now (steps in the order they happen):
1. Before a job is claimed, and on every idle heartbeat, the free space of the artifacts dir is read (statvfs). Below
   H3BATCH_MIN_FREE_DISK_MB the worker is not ready: heartbeat state DISK_FULL with a `reason` (what /readyz and
   /metrics show); a job it was handed is not claimed but handed back with a fresh render message.
2. A write that fails with ENOSPC or EDQUOT anywhere in a render (the scratch folder, the mux, the publish) is an
   infrastructure fault (`disk_fault` finds the errno anywhere in the exception's chain; PyAV raises its own
   OSError subclass carrying it): the attempt's files are removed, the job goes back to `queued` with a fresh
   message (worker/attempt.py `requeue_for_disk`), and the worker turns DISK_FULL.
3. While DISK_FULL the worker's consumer takes nothing: the task that found the fault waits (worker/tasks.py) until
   space is back, polling once per heartbeat period; the idle watchdog leaves a DISK_FULL worker alone, and a warm
   shutdown (SIGTERM) ends the wait.
4. Space is back when the free space reaches the floor and, after a failed write, a probe file can be written,
   flushed and removed in the artifacts dir. The probe is twice the space that was free once the failed attempt's
   files were removed (PROBE_MIN_BYTES..PROBE_MAX_BYTES): that space was not enough for the render, so freeing just
   the attempt's own bytes does not hand the job back to fail again; and a write is what notices that a quota
   (EDQUOT), which statvfs does not show, has room again.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("h3batch.worker")

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""errnos of a write refused for want of space: no space left on the device, disk quota exceeded."""

PROBE_MIN_BYTES = 64 * 1024
"""Smallest probe write that says space is back after a failed write."""
PROBE_MAX_BYTES = 64 * 1024 * 1024
"""Largest probe write (twice the space free after the failed attempt was removed, within these bounds)."""

_MB = 1024 * 1024


def disk_fault(exc: BaseException | None) -> OSError | None:
    """The ENOSPC/EDQUOT OSError in `exc`'s chain (itself, its cause or context), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


@dataclass
class _Fault:
    reason: str
    probe_bytes: int


class DiskHealth:
    """Free-space checks of one directory, and the fault state a failed write leaves; thread-safe (the task and the
    heartbeat thread both ask)."""

    def __init__(self, path: Path, min_free_mb: int):
        self.path = Path(path)
        self.floor_bytes = int(min_free_mb) * _MB
        self._fault: _Fault | None = None
        self._lock = threading.Lock()

    def free_bytes(self) -> int:
        self.path.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.path).free

    def record_fault(self, exc: OSError) -> str:
        """A write failed for want of space (the attempt's files already removed); returns the reason the worker
        reports until space is back."""
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        where = getattr(exc, "filename", None) or self.path
        reason = (f"disk_full: a write failed with {name} ({os.strerror(exc.errno or 0)}) at {where}; no jobs are "
                  f"taken until space is back in {self.path}")
        try:
            free = self.free_bytes()
        except OSError:
            free = 0
        with self._lock:
            self._fault = _Fault(reason, min(PROBE_MAX_BYTES, max(PROBE_MIN_BYTES, 2 * free)))
        return reason

    def check(self) -> str | None:
        """None when the worker may render; otherwise why not: a failed write whose probe does not pass yet, or
        free space under the floor."""
        with self._lock:
            try:
                free = self.free_bytes()
            except OSError as exc:
                return f"disk_unreadable: cannot read the free space of {self.path} ({exc.strerror})"
            if self._fault is not None:
                if free < self.floor_bytes or not self._probe(self._fault.probe_bytes):
                    return self._fault.reason
                log.info("disk space is back in %s (%.1f MB free, a %d-byte probe written)", self.path, free / _MB,
                         self._fault.probe_bytes)
                self._fault = None
            if free < self.floor_bytes:
                return (f"disk_low: {free / _MB:.1f} MB free in {self.path}, under H3BATCH_MIN_FREE_DISK_MB="
                        f"{self.floor_bytes // _MB}")
            return None

    def _probe(self, size: int) -> bool:
        """Write, flush and remove `size` bytes in the directory: True when the disk took them."""
        probe = self.path / f".disk-probe-{uuid.uuid4().hex}"
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * size)
                f.flush()
                os.fsync(f.fileno())
            return True
        except OSError:  # no space, or no write at all (a read-only remount): not back either way
            return False
        finally:
            probe.unlink(missing_ok=True)


def wait_until_ok(health: DiskHealth, on_reason, interval_s: float, should_stop) -> bool:
    """Poll `health.check()` every `interval_s` until it passes (True) or `should_stop()` (False); `on_reason(reason
    or None)` reports each look (the heartbeat's state)."""
    while True:
        reason = health.check()
        on_reason(reason)
        if reason is None:
            return True
        if should_stop():
            return False
        time.sleep(interval_s)
