"""Worker crash: kill -9 of the rendering worker at varied points of a render, many times over; a supervisor (this
test) starts a fresh worker each time. Every accepted job must end `completed` exactly once with a decodable MP4.

`make test` runs 3 kills over 3 jobs; `make test-chaos` runs 20 kills over 20 jobs (H3BATCH_CHAOS_KILLS overrides).
"""
from __future__ import annotations

import json
import os
import time

import av
import pytest
import redis

from tests.system.conftest import completed_events, post_job, wait_all_finished

KILL_POINTS = (("denoise", 1), ("denoise", 5), ("decode", 0), ("mux", 0), ("denoise", 0))
"""(stage, minimum step) at which the next victim is killed, in turn."""

STEP_DELAY = {"H3BATCH_DEBUG_STEP_DELAY_S": "0.15"}
"""Each progress report sleeps 0.15 s, so every kill point is open long enough to be hit while polling Redis."""


def _wait_for_kill_point(r: redis.Redis, worker_name: str, stage: str, min_step: int,
                         timeout_s: float = 90.0) -> str | None:
    """The id of the job `worker_name` renders once it reaches (stage, step >= min_step); None if nothing runs."""
    order = ("text_encode", "denoise", "decode", "mux", "finalize")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for job_id in r.zrange("h3b:running", 0, -1):
            worker, current, step = r.hmget(f"h3b:job:{job_id}", ["worker", "stage", "step"])
            if worker != worker_name or current not in order:
                continue
            if order.index(current) > order.index(stage) or (current == stage and int(step or 0) >= min_step):
                return job_id
        if not r.zcard("h3b:queue") and not r.zcard("h3b:running"):
            return None
        time.sleep(0.01)
    return None


def _decoded_frames(path) -> tuple[int, int, tuple[int, int]]:
    """(video frames, audio channels, (width, height)) of an MP4, decoding every video frame."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        channels = container.streams.audio[0].codec_context.channels
        size = (video.codec_context.width, video.codec_context.height)
        frames = sum(1 for _ in container.decode(video=0))
    return frames, channels, size


def run_kill_chaos(stack_factory, jobs: int, kills: int) -> dict:
    """Post `jobs` jobs, kill -9 `kills` workers mid-render, let a last worker finish; assert; return figures."""
    stack = stack_factory()
    api = stack.start_api()
    r = stack.redis.client()
    ids = [post_job(api.base, seed=1000 + i, prompt=f"take {i}: a door creaks open")["id"] for i in range(jobs)]
    killed: list[tuple[str, float, str]] = []  # (job id, kill time, kill point)
    started = time.monotonic()
    for n in range(kills):
        stage, step = KILL_POINTS[n % len(KILL_POINTS)]
        victim = stack.start_worker(f"victim-{n}", **STEP_DELAY)
        job_id = _wait_for_kill_point(r, victim.name, stage, step)
        if job_id is None:
            victim.kill()
            pytest.fail(f"kill {n}: worker {victim.name} never reached {stage}@{step}: {victim.log_text()[-2000:]}")
        victim.kill()
        killed.append((job_id, time.time(), f"{stage}@{step}"))
    last = stack.start_worker("survivor")
    statuses = wait_all_finished(r, ids, timeout_s=60 + 15 * jobs)
    elapsed = time.monotonic() - started

    assert statuses == {job_id: "completed" for job_id in ids}, (statuses, last.log_text()[-3000:])
    kills_per_job = {job_id: sum(1 for k, _, _ in killed if k == job_id) for job_id in ids}
    requeue_latency = []
    for job_id in ids:
        record = r.hgetall(f"h3b:job:{job_id}")
        runs = r.hgetall(f"h3b:runs:{job_id}")
        assert completed_events(r, job_id) == 1, job_id  # one `completed` transition
        assert int(runs.get("rendered", 0)) == 1, (job_id, runs)  # one render ran to its end: no twin execution
        assert int(runs["started"]) == int(record["attempt"]) == kills_per_job[job_id] + 1, (job_id, runs, record)
        assert int(runs.get("requeues", 0)) == kills_per_job[job_id], (job_id, runs)
        job_dir = stack.artifacts / job_id
        assert sorted(p.name for p in job_dir.iterdir()) == ["video.mp4"], job_id  # no partial of a dead attempt
        frames, channels, size = _decoded_frames(job_dir / "video.mp4")
        assert frames == int(record["frames"]) >= 96 and channels == 2 and size == (128, 32), job_id
    last_kill = {job_id: killed_at for job_id, killed_at, _ in killed}  # requeued_at is the last requeue's
    for job_id, killed_at in last_kill.items():
        requeued_at = float(r.hget(f"h3b:runs:{job_id}", "requeued_at") or "nan")
        requeue_latency.append(requeued_at - killed_at)
    assert all(0 < lat < 120 for lat in requeue_latency), requeue_latency
    assert r.zcard("h3b:running") == 0 and r.zcard("h3b:queue") == 0
    figures = {"jobs": jobs, "kills": len(killed), "completed": sum(s == "completed" for s in statuses.values()),
               "lost": sum(s != "completed" for s in statuses.values()), "duplicate_renders": 0,
               "kill_points": sorted({p for _, _, p in killed}),
               "requeue_latency_s": {"max": round(max(requeue_latency), 2),
                                     "mean": round(sum(requeue_latency) / len(requeue_latency), 2)},
               "wall_s": round(elapsed, 1)}
    print("\nRELIABILITY worker-kill " + json.dumps(figures))
    return figures


def test_three_kills_lose_and_duplicate_nothing(stack_factory):
    """kill -9 of three workers mid-render (denoise step 1, denoise step 5, decode): all 3 jobs complete exactly
    once, each render ran to its end once, attempt = kills + 1, one decodable MP4 per job, requeue within 120 s."""
    run_kill_chaos(stack_factory, jobs=3, kills=3)


@pytest.mark.chaos
def test_twenty_kills_over_twenty_jobs(stack_factory):
    """kill -9 twenty times over twenty jobs, cycling the kill point through denoise steps 0, 1 and 5, decode and mux:
    every job completes exactly once with a decodable MP4 and nothing is left in_progress or queued."""
    kills = int(os.environ.get("H3BATCH_CHAOS_KILLS", "20"))
    run_kill_chaos(stack_factory, jobs=kills, kills=kills)


@pytest.mark.chaos
def test_requeue_latency_with_default_lease_settings(stack_factory):
    """With the shipped defaults (lease 30 s, reaper every 10 s, heartbeat 5 s), a job whose worker is killed -9
    mid-render is requeued within 2 minutes of the death (bound: lease TTL + reaper interval + a heartbeat) and
    completes on attempt 2."""
    stack = stack_factory()
    api = stack.start_api()
    stack.worker_env = {"H3BATCH_LEASE_TTL_S": "30", "H3BATCH_RECONCILE_INTERVAL_S": "10"}
    r = stack.redis.client()
    job_id = post_job(api.base)["id"]
    victim = stack.start_worker("victim", **STEP_DELAY)
    assert _wait_for_kill_point(r, victim.name, "denoise", 1) == job_id
    victim.kill()
    killed_at = time.time()
    stack.start_worker("successor")
    assert wait_all_finished(r, [job_id], timeout_s=180) == {job_id: "completed"}
    latency = float(r.hget(f"h3b:runs:{job_id}", "requeued_at")) - killed_at
    assert latency < 30 + 10 + 5 + 10 and r.hget(f"h3b:job:{job_id}", "attempt") == "2", latency
    print("\nRELIABILITY default-lease " + json.dumps({"requeue_latency_s": round(latency, 1)}))
