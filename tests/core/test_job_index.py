"""Listing and admission at scale, through the real API (gunicorn, 8 threads) on its own Redis database: a page of
GET /jobs costs O(page) however many jobs other keys hold (per-owner indexes), and the queue cap admits exactly
H3BATCH_MAX_QUEUED jobs under concurrent creates (cap check and create in one Lua step, core/jobs.py)."""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests

from h3batch.core import jobs, keys
from tests.service_stack import ApiProcess, service_env

DB = 12
CAP = 100


@pytest.fixture(scope="module")
def capped_api(redis_url, tmp_path_factory):
    """An open API with H3BATCH_MAX_QUEUED=100 on DB 12 (flushed around the module), no worker: jobs stay queued."""
    url = redis_url.rsplit("/", 1)[0] + f"/{DB}"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    root = tmp_path_factory.mktemp("capped")
    server = ApiProcess(service_env(url, root / "artifacts", H3BATCH_MAX_QUEUED=str(CAP)), root / "api.log")
    server.start()
    yield server, client
    server.stop()
    client.flushdb()
    client.close()


def test_concurrent_creates_admit_exactly_the_queue_cap(capped_api):
    """200 concurrent POST /jobs at H3BATCH_MAX_QUEUED=100: exactly 100 are 202, the other 100 are 503 queue_full
    with Retry-After, and 100 jobs are queued (the check-then-act version admitted 103)."""
    api, r = capped_api
    r.flushdb()

    def post(i: int) -> requests.Response:
        return requests.post(f"{api.base}/jobs", json={"prompt": f"rain {i}", "width": 128, "height": 32},
                             timeout=60)

    with ThreadPoolExecutor(max_workers=50) as pool:
        replies = list(pool.map(post, range(2 * CAP)))
    codes = [reply.status_code for reply in replies]
    assert codes.count(202) == CAP and codes.count(503) == CAP, sorted(set(codes))
    refused = [reply for reply in replies if reply.status_code == 503]
    assert all(reply.json()["error"]["code"] == "queue_full" and reply.headers["Retry-After"] for reply in refused)
    assert r.zcard(keys.QUEUE) == CAP and r.zcard(keys.JOBS_INDEX) == CAP
    r.flushdb()


def _fill_other_owner(r: redis.Redis, count: int) -> None:
    """`count` completed jobs of another key, written straight into Redis with one pipeline per 5,000 (what 50k
    finished jobs leave behind), indexed as core/jobs.py indexes them."""
    template = {"status": "completed", "stage": "finalize", "step": "8", "total_steps": "8", "progress": "1.0",
                "prompt": "someone else's job", "seconds": "4.0", "width": "128", "height": "32", "seed": "1",
                "owner": "other-owner", "created_at": repr(time.time()), "attempt": "1"}
    base = int(r.incrby(keys.SEQ, count)) - count
    for start in range(0, count, 5000):
        with r.pipeline(transaction=False) as pipe:
            for seq in range(base + start + 1, base + min(start + 5000, count) + 1):
                job_id = f"job_other{seq:019d}"
                pipe.hset(keys.job(job_id), mapping={**template, "id": job_id, "seq": str(seq)})
                pipe.zadd(keys.JOBS_INDEX, {job_id: seq})
                pipe.zadd(keys.owner_jobs("other-owner"), {job_id: seq})
                pipe.zadd(keys.owner_status("other-owner", "completed"), {job_id: seq})
            pipe.execute()


def test_a_page_costs_o_page_with_50k_jobs_of_another_key(capped_api):
    """With 50,000 jobs of another key created after the caller's own, GET /jobs?limit=1 (and ?status=queued)
    answers the caller's newest job in under 50 ms (median of 20; it took 2.6 s when a page scanned the global
    index), and paging on with `after` still finds the older one."""
    api, r = capped_api
    r.flushdb()
    spec = jobs.JobSpec(prompt="mine", seconds=4.0, width=128, height=32, seed=1)
    mine = [jobs.create_job(r, spec)["id"] for _ in range(2)]
    _fill_other_owner(r, 50_000)
    assert r.zcard(keys.JOBS_INDEX) == 50_002
    for query in ("limit=1", "limit=1&status=queued"):
        timings = []
        for _ in range(21):
            started = time.perf_counter()
            reply = requests.get(f"{api.base}/jobs?{query}", timeout=60)
            timings.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text
            page = reply.json()
            assert [job["id"] for job in page["data"]] == [mine[1]] and page["has_more"] is True, page
        print(f"GET /jobs?{query} beside 50k other jobs: median {statistics.median(timings[1:]) * 1000:.1f} ms")
        assert statistics.median(timings[1:]) < 0.050, (query, timings)
    rest = requests.get(f"{api.base}/jobs?limit=1&after={mine[1]}", timeout=60).json()
    assert [job["id"] for job in rest["data"]] == [mine[0]] and rest["has_more"] is False, rest
    r.flushdb()
