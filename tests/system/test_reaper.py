"""The reaper (worker/reaper.py) and lease fencing (core/lease.py): jobs that lost their message are re-sent, and a
worker that comes back after its lease lapsed can neither finish nor clobber the job it used to hold."""
from __future__ import annotations

import hashlib
import os
import signal
import time

from h3batch.core import jobs, keys
from tests.system.conftest import completed_events, post_job, wait_all_finished


def test_a_queued_job_without_a_message_is_resent(stack_factory):
    """A queued record whose Celery message never reached the broker (API killed between the two writes, or a message
    lost in Redis's AOF fsync window) is re-sent by a worker's reaper after the grace period and completes once."""
    stack = stack_factory()
    stack.start_api()
    r = stack.redis.client()
    spec = jobs.JobSpec(prompt="a clock ticks in an empty hall", seconds=4.0, width=128, height=32, seed=3)
    record = jobs.create_job(r, spec)  # the record only: no message is sent
    stack.start_worker("reaper")
    assert wait_all_finished(r, [record["id"]], timeout_s=120) == {record["id"]: "completed"}
    runs = r.hgetall(f"h3b:runs:{record['id']}")
    assert runs["resent"] == "1" and runs["started"] == runs["rendered"] == "1"
    assert completed_events(r, record["id"]) == 1


def test_a_frozen_worker_cannot_finish_or_clobber_a_requeued_job(stack_factory):
    """A worker frozen mid-render (SIGSTOP: as cut off from Redis) loses its lease; another worker's reaper requeues
    the job, which completes there as attempt 2. Resumed, the stale worker stops at its next step without writing:
    one `completed` event, one finished render, and the MP4 on disk is attempt 2's (its SHA-256 matches)."""
    stack = stack_factory()
    api = stack.start_api()
    r = stack.redis.client()
    slow = {"H3BATCH_DEBUG_STEP_DELAY_S": "0.2"}
    workers = {w.name: w for w in (stack.start_worker("left", **slow), stack.start_worker("right", **slow))}
    job_id = post_job(api.base)["id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        holder, stage, step = r.hmget(f"h3b:job:{job_id}", ["worker", "stage", "step"])
        if stage == "denoise" and int(step or 0) >= 1:
            break
        time.sleep(0.01)
    frozen = workers[holder]
    os.killpg(frozen.proc.pid, signal.SIGSTOP)
    try:
        statuses = wait_all_finished(r, [job_id], timeout_s=120)
    finally:
        os.killpg(frozen.proc.pid, signal.SIGCONT)
    record = r.hgetall(f"h3b:job:{job_id}")
    assert statuses[job_id] == "completed" and record["attempt"] == "2" and record["worker"] != frozen.name
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "render cancelled" not in frozen.log_text():
        time.sleep(0.2)
    assert "render cancelled" in frozen.log_text(), frozen.log_text()[-2000:]
    runs = r.hgetall(f"h3b:runs:{job_id}")
    assert runs["started"] == "2" and runs["rendered"] == "1" and runs["requeues"] == "1"
    assert completed_events(r, job_id) == 1 and r.hget(f"h3b:job:{job_id}", "status") == "completed"
    video = stack.artifacts / job_id / "video.mp4"
    assert sorted(p.name for p in video.parent.iterdir()) == ["video.mp4"]
    assert hashlib.sha256(video.read_bytes()).hexdigest() == record["sha256"]


def _wait_gone(path, timeout_s: float = 120.0) -> None:
    """Until `path` no longer exists. The bound only ends a broken run: how soon the reaper acts depends on how busy
    the machine is, so no test reads the time it took."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        assert time.monotonic() < deadline, f"{path} still there after {timeout_s} s"
        time.sleep(0.05)


def _wait_until(predicate, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not so after {timeout_s} s"
        time.sleep(0.05)


def test_the_reaper_removes_files_of_expired_and_missing_records_and_prunes_the_index(stack_factory):
    """Artifact garbage collection, against a live worker (reaper every 0.5 s, heartbeat 1 s): a completed job whose
    `expires_at` passed becomes `expired` and its MP4 directory goes; a cancelled job whose record TTL ran out (1 s)
    loses its leftover directory and its entries in the global, per-owner and per-status indexes; a directory with
    no record and no expiry trace goes once older than a record can live; one younger stays."""
    stack = stack_factory()
    api = stack.start_api()
    r = stack.redis.client()
    stack.start_worker("gc")
    done = post_job(api.base)["id"]
    assert wait_all_finished(r, [done], timeout_s=120) == {done: "completed"}
    assert (stack.artifacts / done / "video.mp4").is_file()
    r.hset(f"h3b:job:{done}", "expires_at", repr(time.time() - 1))  # as if RESULT_TTL_S had passed
    _wait_gone(stack.artifacts / done)
    assert r.hget(f"h3b:job:{done}", "status") == "expired"

    spec = jobs.JobSpec(prompt="a door creaks", seconds=4.0, width=128, height=32, seed=1, owner="gc-owner")
    short = jobs.create_job(r, spec)["id"]
    jobs.request_cancel(r, short, record_ttl_s=1)
    (stack.artifacts / short).mkdir()
    (stack.artifacts / short / ".attempt-1.mp4").write_bytes(b"left by a killed worker")
    orphan = stack.artifacts / "job_000000000000000000000000"  # no record, no trace: lost with a Redis crash
    orphan.mkdir()
    young = stack.artifacts / "job_111111111111111111111111"
    young.mkdir()
    two_days_ago = time.time() - 2 * 86_400  # older than any record lives (RESULT_TTL_S + RECORD_GRACE_S)
    os.utime(orphan, (two_days_ago, two_days_ago))
    _wait_gone(stack.artifacts / short)
    _wait_gone(orphan)
    # The orphan's removal shows a reaper pass ran after `young` was made: an unknown directory younger than a
    # record's lifetime is left alone.
    assert young.is_dir()
    # A cancelled job's files may go before its record does (not servable); the record itself lives its 1 s TTL.
    _wait_until(lambda: not r.exists(f"h3b:job:{short}"), "the cancelled record's 1 s TTL ended")
    _wait_until(lambda: r.zscore(keys.JOBS_INDEX, short) is None, "the index pruned")
    assert r.zscore(keys.owner_jobs("gc-owner"), short) is None
    assert r.zscore(keys.owner_status("gc-owner", "cancelled"), short) is None
    assert r.zscore(keys.EXPIRY, f"{short}:gc-owner") is None
    assert r.zscore(keys.JOBS_INDEX, done) is not None  # the expired record is still listed until its TTL ends
