"""N nodes on one machine (docs/deploy.md "Many nodes"): one API, one Redis, one S3 server (moto, tests/object_store.py)
and three `h3batch worker` processes with distinct names, each with its own artifacts directory, so nothing passes
between them but Redis and the bucket. Twelve jobs spread over the three; the first worker seen mid-render after it
has completed a job of its own is killed -9; its job is re-rendered by another node. Every job completes exactly once and
every MP4 downloads through the API, from the bucket (the API's own directory never holds one).

About 40 s on 2 cores (three model loads, twelve renders, a lease lapse of 6 s), so it runs in `make test`; on a
machine loaded many times over it has taken 6 min, hence the generous timeouts.
"""
from __future__ import annotations

import hashlib
import io
import time
from collections import Counter

import av
import pytest
import requests

from tests.object_store import MotoServer
from tests.system.conftest import SMALL, completed_events, wait_all_finished, wait_consuming

JOBS = 12
NODES = ("node-a", "node-b", "node-c")
# A 10 s lease (not the system tests' 3 s): three workers on two busy cores can miss renewals while alive (CI saw
# a 6 s one lapse), and a requeue of a live worker's job would render it twice (fenced at publish, but not what this
# test measures).
NODE_ENV = {"H3BATCH_DEBUG_STEP_DELAY_S": "0.1", "OMP_NUM_THREADS": "1", "H3BATCH_LEASE_TTL_S": "10"}
"""Each progress report sleeps 0.1 s: a render lasts about a second longer, so twelve jobs spread over the three
workers instead of the first one to start draining the queue, and the victim is caught mid-render. One torch
thread per worker: three nodes on a 2-core machine would otherwise oversubscribe it."""


def _wait_victim_mid_render(r, nodes: tuple[str, ...], timeout_s: float = 300.0) -> tuple[str, str]:
    """Block until some node has completed a job of its own and is in the denoise loop (step >= 1) of another;
    that node and that job's id. The victim is picked by state, not by name: which node the queue feeds first is
    the scheduler's business, and on a loaded machine a named node may finish its share before it is ever seen
    mid-render."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = set()
        rendering = {}
        for job_id in r.zrange("h3b:jobs", 0, -1):
            worker, status, stage, step = r.hmget(f"h3b:job:{job_id}", ["worker", "status", "stage", "step"])
            if worker not in nodes:
                continue
            if status == "completed":
                done.add(worker)
            if status == "in_progress" and stage == "denoise" and int(step or 0) >= 1:
                rendering[worker] = job_id
        for worker in sorted(done & set(rendering)):
            return worker, rendering[worker]
        if not r.zcard("h3b:queue") and not r.zcard("h3b:running"):
            break
        time.sleep(0.01)
    pytest.fail("no node ever had a completed job and another mid-render")


def _lines_of(stack, job_id: str) -> str:
    """Every log line of the stack that names `job_id` (why a job ran twice: lease, upload, Redis)."""
    return "\n".join(line for line in stack.logs().splitlines() if job_id in line)[-4000:]


def test_three_nodes_share_only_redis_and_the_bucket_and_survive_a_lost_node(stack_factory, tmp_path):
    """12 jobs over three workers with their own artifacts dirs on one Redis and one bucket; kill -9 one mid-render:
    each node completed at least one job, the victim's job completed elsewhere as attempt 2, 12/12 completed
    exactly once (one `completed` event, one finished render each), each MP4 is one object in the bucket under its
    attempt's key, and GET /jobs/{id}/content serves it (SHA-256 of the record, decodable by PyAV)."""
    moto = MotoServer.start(tmp_path / "moto.log")
    try:
        stack = stack_factory()
        store = moto.env(prefix="nodes")
        api = stack.start_api(**store)
        r = stack.redis.client()
        workers = {}
        for name in NODES:  # spawned together: the model loads overlap
            node_dir = stack.root / f"{name}-artifacts"
            workers[name] = stack.spawn_worker(name, H3BATCH_ARTIFACTS_DIR=str(node_dir), **store, **NODE_ENV)
        for worker in workers.values():
            wait_consuming(r, worker)
        started = time.monotonic()
        ids = []
        for i in range(JOBS):
            reply = requests.post(f"{api.base}/jobs", json={"prompt": f"take {i}: rain on a tin roof", "seed": 500 + i,
                                                            **SMALL}, timeout=10)
            assert reply.status_code == 202, reply.text
            ids.append(reply.json()["id"])
        victim, lost_job = _wait_victim_mid_render(r, NODES)
        workers[victim].kill()
        statuses = wait_all_finished(r, ids, timeout_s=600)
        wall_s = time.monotonic() - started
        assert statuses == {job_id: "completed" for job_id in ids}, (statuses, stack.logs()[-4000:])

        records = {job_id: r.hgetall(f"h3b:job:{job_id}") for job_id in ids}
        by_worker = Counter(record["worker"] for record in records.values())
        assert set(by_worker) == set(NODES), by_worker  # each node completed at least one
        lost = records[lost_job]
        assert lost["attempt"] == "2" and lost["worker"] != victim, lost
        for job_id in ids:
            runs = r.hgetall(f"h3b:runs:{job_id}")
            assert completed_events(r, job_id) == 1, job_id
            if job_id == lost_job:  # the kill lands between two polls: the dying attempt may have reached publish
                assert runs.get("rendered") in ("1", "2"), (job_id, runs)  # (its completion never landed: attempt 2)
            else:
                assert runs.get("rendered") == "1", (job_id, runs, _lines_of(stack, job_id))  # no twin execution
            assert int(runs["started"]) == int(records[job_id]["attempt"]), (job_id, runs, _lines_of(stack, job_id))
        assert r.hget(f"h3b:runs:{lost_job}", "requeues") == "1"

        objects = moto.keys("nodes/")
        videos = [key for key in objects if key.endswith("/video.mp4")]
        assert sorted(key.split("/")[1] for key in videos) == sorted(ids), objects  # one MP4 object per job
        for job_id in ids:
            (key,) = [k for k in videos if k.split("/")[1] == job_id]
            assert f"/attempt-{records[job_id]['attempt']}/" in key, key  # the completing attempt's own key

        for job_id in ids:
            reply = requests.get(f"{api.base}/jobs/{job_id}/content", timeout=30)
            assert reply.status_code == 200, (job_id, reply.text[:300])
            assert hashlib.sha256(reply.content).hexdigest() == records[job_id]["sha256"], job_id
            with av.open(io.BytesIO(reply.content)) as container:
                frames = sum(1 for _ in container.decode(video=0))
            assert frames == int(records[job_id]["frames"]) >= 96, job_id
        assert not list(stack.artifacts.rglob("*.mp4")), "the API's directory must not hold MP4s: they are in S3"
        # The dead attempt's scratch stays on the dead node's disk; the node that completed the job never saw it.
        assert (stack.root / f"{victim}-artifacts" / lost_job).is_dir()
        finisher_dir = stack.root / f"{lost['worker']}-artifacts"
        assert not list((finisher_dir / lost_job).glob(".attempt-1*")), "attempt 1's file reached another node"
        print(f"\nNODES jobs={JOBS} per-node={dict(by_worker)} lost={lost_job} wall_s={wall_s:.1f}")
    finally:
        moto.stop()
