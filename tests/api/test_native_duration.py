"""The native release renders 5-15 s (diffusers' min_duration), V2 from 4 s: what the door does with `seconds`.

A request that names no duration gets the default raised to the shortest clip the fleet's workers for its task render,
on POST /jobs, /v1/videos and /batches alike; one that asks for less than every such worker renders is refused with
422 `no_capable_worker` naming `seconds`, and nothing is written. (Before, a 4 s job was queued on a native fleet and
failed on the worker.) Real Redis, the app's own capability hash as live heartbeats write it.
"""
from __future__ import annotations

import pytest
import redis

from h3batch.api import create_app
from h3batch.core import capacity, keys
from h3batch.core.routing import Capability


@pytest.fixture
def client(app_redis, tmp_path):
    app = create_app({"REDIS_URL": app_redis, "ARTIFACTS_DIR": str(tmp_path), "API_KEYS": []})
    r = redis.Redis.from_url(app_redis, decode_responses=True)
    r.flushdb()
    yield app.test_client(), r
    r.flushdb()


def serve(r, name: str, kind: str) -> None:
    capacity.record(r, name, Capability(max_rows=100_000, release_kind=kind))


def seconds_of(r, job_id: str) -> float:
    return float(r.hget(keys.job(job_id), "seconds"))


def test_a_plain_request_to_a_native_fleet_renders_its_shortest_clip(client):
    http, r = client
    serve(r, "worker-native", "native")
    job = http.post("/jobs", json={"prompt": "a fox"})
    assert job.status_code == 202, job.get_json()
    assert seconds_of(r, job.get_json()["id"]) == 5.0
    video = http.post("/v1/videos", json={"prompt": "a fox"})
    assert video.status_code == 202, video.get_json()
    assert video.get_json()["seconds"] == "5" and seconds_of(r, video.get_json()["id"]) == 5.0
    batch = http.post("/batches", json={"requests": [{"prompt": "a"}, {"prompt": "b", "seconds": 7}]})
    assert batch.status_code == 202, batch.get_json()
    items = sorted(seconds_of(r, j) for j in r.zrange(keys.JOBS_INDEX, 0, -1)
                   if j not in (job.get_json()["id"], video.get_json()["id"]))
    assert items == [5.0, 7.0]


def test_asking_for_less_than_a_native_fleet_renders_is_refused_and_writes_nothing(client):
    http, r = client
    serve(r, "worker-native", "native")
    for path, body in (("/jobs", {"prompt": "a fox", "seconds": 4}), ("/v1/videos", {"prompt": "a fox", "seconds": "4"})):
        reply = http.post(path, json=body)
        error = reply.get_json()["error"]
        assert reply.status_code == 422 and error["code"] == "no_capable_worker", (path, error)
        assert error["message"].startswith("seconds: 4 s is shorter than the native MiniMax-H3 release renders")
    refused = http.post("/batches", json={"requests": [{"prompt": "a", "seconds": 4.4}]})
    detail = refused.get_json()["error"]["details"][0]
    assert refused.status_code == 422 and detail["field"] == "seconds" and "seconds: 4.4 s" in detail["message"]
    assert r.zcard(keys.JOBS_INDEX) == 0 and r.zcard(keys.QUEUE) == 0


def test_a_fleet_with_a_v2_worker_keeps_the_4_s_default(client):
    http, r = client
    serve(r, "worker-native", "native")
    serve(r, "worker-v2", "v2")
    job = http.post("/jobs", json={"prompt": "a fox"})
    assert job.status_code == 202 and seconds_of(r, job.get_json()["id"]) == 4.0
    short = http.post("/jobs", json={"prompt": "a fox", "seconds": 4})
    assert short.status_code == 202 and seconds_of(r, short.get_json()["id"]) == 4.0
