"""A Celery worker started with H3BATCH_RANKS=2 serves jobs through its resident sequence-parallel rank group."""
from __future__ import annotations

import json

import av
import redis
import requests

from tests.service_stack import ApiProcess, poll_until, service_env, start_worker


def test_two_rank_worker_renders_a_job_end_to_end(redis_url, tiny_release, tmp_path):
    """Job → 2-rank worker (gloo on CPU) → completed MP4 that decodes; the heartbeat and record say 2 ranks."""
    url = redis_url.rsplit("/", 1)[0] + "/9"  # its own database: the session worker must not take this job
    artifacts = tmp_path / "artifacts"
    api = ApiProcess(service_env(url, artifacts), tmp_path / "api.log")
    api.start()
    worker = start_worker(url, artifacts, tiny_release, "ranked-worker", tmp_path / "worker.log", H3BATCH_RANKS="2")
    r = redis.Redis.from_url(url, decode_responses=True)
    try:
        assert json.loads(r.get("h3b:worker:ranked-worker"))["ranks"] == 2
        reply = requests.post(f"{api.base}/jobs", json={"prompt": "two ranks, one clip", "seed": 5}, timeout=60)
        assert reply.status_code == 202, reply.text
        job = poll_until(api.base, reply.json()["id"], lambda j: j["status"] in ("completed", "failed"),
                         timeout_s=300)
        assert job["status"] == "completed", job
        assert job["step"] == 8
        video = requests.get(f"{api.base}{job['links']['content']}", timeout=30)
        assert video.status_code == 200
        path = tmp_path / "out.mp4"
        path.write_bytes(video.content)
        with av.open(str(path)) as container:
            assert sum(1 for _ in container.decode(video=0)) == 107
    finally:
        worker.stop()
        api.stop()
        r.flushdb()
        r.close()
