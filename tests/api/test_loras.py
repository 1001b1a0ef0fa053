"""Per-job LoRAs at the door (api/schemas.py + core/loras.py): `loras` on POST /jobs, /v1/videos (JSON as the
OpenAI SDK's extra_body sends it, and multipart) and /batches, against a real Redis; refusals are 4xx with the
documented codes and write nothing; accepted adapters are on the job record as resolved."""
from __future__ import annotations

import json

import pytest

from h3batch.api import create_app
from h3batch.core import capacity, keys
from h3batch.core.loras import policy_of
from h3batch.core.routing import Capability

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ALLOW = (f"style=acme/h3-style@{COMMIT}", "ink=/srv/loras/ink")


@pytest.fixture
def client(app_redis, tmp_path):
    app = create_app({"REDIS_URL": app_redis, "ARTIFACTS_DIR": str(tmp_path), "API_KEYS": [],
                      "LORA_POLICY": policy_of(ALLOW, max_loras=2)})
    import redis

    r = redis.Redis.from_url(app_redis, decode_responses=True)
    r.flushdb()
    yield app.test_client(), r
    r.flushdb()


def serve(r, kind: str) -> None:
    """A live worker of release kind `kind` in the fleet's capability hash (what its heartbeat writes)."""
    capacity.record(r, f"worker-{kind}", Capability(max_rows=100_000, release_kind=kind))


def test_post_jobs_records_the_resolved_adapters(client):
    """A native fleet: POST /jobs with an allow-listed name and a folder entry is queued; the job shows each adapter
    with its scale and what it resolved to."""
    http, r = client
    serve(r, "native")
    reply = http.post("/jobs", json={"prompt": "a fox", "loras": [{"ref": "style", "scale": 0.8}, {"ref": "ink"}]})
    assert reply.status_code == 202, reply.get_json()
    job = http.get(f"/jobs/{reply.get_json()['id']}").get_json()
    assert job["loras"] == [{"ref": "style", "scale": 0.8, "repo": "acme/h3-style", "revision": COMMIT},
                            {"ref": "ink", "scale": 1.0, "path": "/srv/loras/ink"}]


@pytest.mark.parametrize("loras, status, code", [
    ([{"ref": "nope"}], 400, "unknown_lora"),
    ([{"ref": "https://example.invalid/a.safetensors"}], 400, "unknown_lora"),
    ([{"ref": "acme/h3-style@main"}], 400, "lora_revision_not_allowed"),
    ([{"ref": "style"}, {"ref": "ink"}, {"ref": f"acme/h3-style@{COMMIT}"}], 400, "too_many_loras"),
    ([{"ref": "style", "scale": 9}], 400, "lora_scale_out_of_range"),
    ([{"ref": "style", "weight": 1}], 400, "unsupported_parameter"),
], ids=["unknown", "url", "branch", "too-many", "scale", "extra-key"])
def test_refused_loras_are_4xx_and_write_nothing(client, loras, status, code):
    """Each bad `loras` is refused with its code, naming `loras`, and no job is written."""
    http, r = client
    serve(r, "native")
    reply = http.post("/jobs", json={"prompt": "a fox", "loras": loras})
    error = reply.get_json()["error"]
    assert (reply.status_code, error["code"], error["retryable"]) == (status, code, False), error
    assert "loras" in error["message"]
    assert r.zcard(keys.JOBS_INDEX) == 0


def test_a_v2_fleet_answers_lora_base_mismatch(client):
    """Only FastH3 V2 workers live (or none known): 422 lora_base_mismatch naming the kinds served; a job without
    adapters is still queued."""
    http, r = client
    for seed_fleet in (lambda: None, lambda: serve(r, "v2")):
        seed_fleet()
        reply = http.post("/jobs", json={"prompt": "a fox", "loras": [{"ref": "style"}]})
        error = reply.get_json()["error"]
        assert (reply.status_code, error["code"]) == (422, "lora_base_mismatch")
        assert "the fleet serves v2" in error["message"]
    assert r.zcard(keys.JOBS_INDEX) == 0
    assert http.post("/jobs", json={"prompt": "a fox"}).status_code == 202


def test_v1_videos_takes_loras_as_extra_body_and_as_a_multipart_part(client):
    """The OpenAI SDK's extra_body puts `loras` at the top of the JSON body; a multipart form carries it as JSON text.
    Both queue the job with the adapter; a bad one is 400 with the same code as /jobs."""
    http, r = client
    serve(r, "native")
    sent = http.post("/v1/videos", json={"prompt": "a fox", "loras": [{"ref": "style", "scale": 0.5}]})
    assert sent.status_code == 202, sent.get_json()
    assert sent.get_json()["loras"][0]["revision"] == COMMIT
    form = http.post("/v1/videos", data={"prompt": "a fox", "loras": json.dumps([{"ref": "ink"}])})
    assert form.status_code == 202, form.get_json()
    assert form.get_json()["loras"] == [{"ref": "ink", "scale": 1.0, "path": "/srv/loras/ink"}]
    bad = http.post("/v1/videos", json={"prompt": "a fox", "loras": [{"ref": "acme/h3-style"}]})
    assert (bad.status_code, bad.get_json()["error"]["code"]) == (400, "lora_revision_not_allowed")


def test_batches_check_loras_per_line(client):
    """A batch line with an unknown adapter is refused by line and field; the good line's job carries its adapter."""
    http, r = client
    serve(r, "native")
    body = {"requests": [{"prompt": "a", "loras": [{"ref": "style"}]}, {"prompt": "b", "loras": [{"ref": "x"}]}]}
    refused = http.post("/batches", json=body)
    detail = refused.get_json()["error"]["details"]
    assert refused.status_code == 422 and detail[0]["line"] == 2 and detail[0]["field"] == "loras"
    assert "no adapter named 'x'" in detail[0]["message"]
    accepted = http.post("/batches", json={"requests": body["requests"][:1]})
    assert accepted.status_code == 202, accepted.get_json()
    job_id = next(iter(r.zrange(keys.JOBS_INDEX, 0, -1)))
    assert json.loads(r.hget(keys.job(job_id), "loras"))[0]["repo"] == "acme/h3-style"
