"""A full disk stops the worker, never the queue (worker/disk.py), on a real 2 MiB tmpfs as the artifacts dir, with
the real API, Redis and worker.

Three phases, each waiting on states and events (heartbeat state, job record, worker log), never on sleeps:
A. free space under H3BATCH_MIN_FREE_DISK_MB (a ballast file): the worker turns DISK_FULL (`disk_low`), /readyz
   answers 503 with the reason, and a job sent meanwhile is handed back unclaimed (attempt 0, still queued);
B. the ballast goes: the worker takes the job; mid-render the disk is filled to the last byte, so the mux write fails
   with ENOSPC: the job goes back to `queued` (never `failed`), the worker turns DISK_FULL (`disk_full`, ENOSPC) and
   /readyz says so;
C. the filler goes: the worker is READY again and the same job completes with a decodable MP4.

Mounting a tmpfs needs root (CAP_SYS_ADMIN); elsewhere the test is skipped saying so.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time

import pytest
import requests

from h3batch.worker.h3.mp4 import probe_mp4
from tests.system.conftest import SMALL, post_job

TMPFS_SIZE = "2m"
FLOOR_MB = "1"
STEP_DELAY_S = "0.3"
"""Each progress report of the render sleeps this long, so the test can fill the disk between denoise and mux."""


def _mount_tmpfs(path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); the disk-full test runs where it can")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")


def _until(what: str, check, timeout_s: float = 180.0, worker=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker is not None and worker.proc.poll() is not None:
            pytest.fail(f"worker exited with {worker.proc.returncode}: {worker.log_text()[-3000:]}")
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}" + (f"; worker log:\n{worker.log_text()[-3000:]}"
                                                            if worker else ""))


def _beat(r, name: str) -> dict:
    raw = r.get(f"h3b:worker:{name}")
    return json.loads(raw) if raw else {}


def _fill(path) -> None:
    """Write until the filesystem refuses a byte more."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while True:
            os.write(fd, b"\xff" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def test_full_disk_requeues_the_job_and_stops_the_worker_until_space_is_back(stack_factory):
    stack = stack_factory()
    _mount_tmpfs(stack.artifacts)
    try:
        _run(stack)
    finally:
        for worker in stack.workers:
            worker.kill()
        subprocess.run(["umount", "-l", str(stack.artifacts)], capture_output=True)


def _run(stack) -> None:
    r = stack.redis.client()
    api = stack.start_api()
    worker = stack.start_worker("disk", H3BATCH_MIN_FREE_DISK_MB=FLOOR_MB, H3BATCH_DEBUG_STEP_DELAY_S=STEP_DELAY_S)
    ballast, filler = stack.artifacts / "ballast", stack.artifacts / "filler"

    # A. under the floor: DISK_FULL (disk_low), /readyz 503 with the reason, a job handed back unclaimed
    ballast.write_bytes(b"\0" * (1536 * 1024))
    beat = _until("DISK_FULL disk_low", lambda: (b := _beat(r, "disk")).get("state") == "DISK_FULL" and b, worker=worker)
    assert beat["reason"].startswith("disk_low: ") and "H3BATCH_MIN_FREE_DISK_MB=1" in beat["reason"], beat
    ready = requests.get(f"{api.base}/readyz", timeout=10)
    assert ready.status_code == 503, ready.text
    workers = ready.json()["checks"]["workers"]
    assert workers["count"] == 0 and workers["not_ready"] == [{"name": "disk", "state": "DISK_FULL",
                                                                "reason": beat["reason"]}], workers
    assert "disk_low" in ready.json()["error"]["message"]
    job_id = post_job(api.base, seconds=4, **SMALL)["id"]
    _until("the job handed back", lambda: "job handed back unclaimed" in worker.log_text() and job_id in
           worker.log_text(), worker=worker)
    record = r.hgetall(f"h3b:job:{job_id}")
    assert (record["status"], record["attempt"]) == ("queued", "0"), record

    # B. space back: the job runs; the disk fills mid-render, the mux hits ENOSPC: requeued, not failed
    ballast.unlink()
    _until("the job in denoise", lambda: r.hget(f"h3b:job:{job_id}", "stage") == "denoise", worker=worker)
    _fill(filler)
    _until("the job requeued", lambda: r.hget(f"h3b:job:{job_id}", "requeue_reason") == "disk_full", worker=worker)
    record = r.hgetall(f"h3b:job:{job_id}")
    assert record["status"] in ("queued", "in_progress") and record["attempt"] == "1", record
    beat = _until("DISK_FULL disk_full", lambda: (b := _beat(r, "disk")).get("state") == "DISK_FULL"
                  and b["reason"].startswith("disk_full") and b, worker=worker)
    assert "ENOSPC" in beat["reason"], beat
    ready = requests.get(f"{api.base}/readyz", timeout=10)
    assert ready.status_code == 503 and "ENOSPC" in ready.json()["error"]["message"], ready.text
    assert r.hget(f"h3b:job:{job_id}", "status") == "queued"  # still waiting: this worker takes nothing now
    assert not [p for p in stack.artifacts.rglob("*") if p.is_file() and p != filler], "the attempt left files"

    # C. the filler goes: READY again, the same job completes once, never failed
    filler.unlink()
    _until("the job completed", lambda: r.hget(f"h3b:job:{job_id}", "status") == "completed", worker=worker)
    events = [fields.get("event") for _, fields in r.xrange(f"h3b:events:{job_id}")]
    statuses = [json.loads(fields["data"]).get("status") for _, fields in r.xrange(f"h3b:events:{job_id}")
                if fields.get("event") in ("status", "completed", "failed")]
    assert "failed" not in events and events.count("completed") == 1, events
    assert statuses == ["queued", "in_progress", "queued", "in_progress", "completed"], statuses
    assert r.hgetall(f"h3b:runs:{job_id}")["requeues"] == "1"
    record = r.hgetall(f"h3b:job:{job_id}")
    assert record["attempt"] == "2", record
    info = probe_mp4(stack.artifacts / record["artifact"])
    assert info["frames"] == 107 and (info["width"], info["height"]) == (SMALL["width"], SMALL["height"])
    _until("READY", lambda: _beat(r, "disk").get("state") == "READY", worker=worker)
    assert requests.get(f"{api.base}/readyz", timeout=10).status_code == 200
