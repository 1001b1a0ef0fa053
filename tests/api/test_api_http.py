"""The job API over real HTTP (gunicorn subprocess, session Redis), without needing a worker: validation at the door,
error envelope, queue positions, cancel/delete of queued jobs, listing, auth, OpenAPI, and no torch in the API."""
from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pytest
import requests
from werkzeug.serving import make_server

from h3batch.api import create_app
from tests.service_stack import REPO

ERROR_KEYS = {"code", "message", "retryable", "request_id"}


def assert_error(reply: requests.Response, status: int, code: str) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    body = reply.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["retryable"], bool) and body["error"]["message"]
    assert "Traceback" not in reply.text and "<html" not in reply.text.lower()
    assert body["error"]["request_id"] == reply.headers["X-Request-ID"]
    return body["error"]


@pytest.fixture
def jobs_made(api):
    """Ids of jobs a test creates; deleted afterwards so the session worker never renders them."""
    made: list[str] = []
    yield made
    for job_id in made:
        requests.delete(f"{api.base}/jobs/{job_id}", timeout=60)


def create(api, made: list[str], **body) -> requests.Response:
    reply = requests.post(f"{api.base}/jobs", json={"prompt": "rain on a tin roof", **body}, timeout=60)
    if reply.status_code in (200, 202):
        made.append(reply.json()["id"])
    return reply


def test_create_answers_202_with_location_and_a_readable_queued_record(api, jobs_made, r):
    """POST /jobs answers 202 + Location, and the record (with a recorded random 63-bit seed) is readable at once."""
    reply = create(api, jobs_made, width=256, height=128)
    assert reply.status_code == 202, reply.text
    job = reply.json()
    assert reply.headers["Location"] == f"/jobs/{job['id']}"
    assert job["status"] == "queued" and job["stage"] == "queued" and job["progress"] == 0.0
    assert 0 <= job["seed"] < 2**63 and job["links"]["content"] == f"/jobs/{job['id']}/content"
    again = requests.get(f"{api.base}{reply.headers['Location']}", timeout=60)
    assert again.status_code == 200 and again.json()["seed"] == job["seed"]
    assert r.hget(f"h3b:job:{job['id']}", "status") == "queued"


@pytest.mark.parametrize("body, code", [
    ({"prompt": ""}, "invalid_request"),
    ({"prompt": "   "}, "invalid_request"),
    ({"prompt": 7}, "invalid_request"),
    ({"seconds": 4}, "invalid_request"),  # prompt missing
    ({"prompt": "x", "colour": "red"}, "unsupported_parameter"),
    ({"prompt": "x", "width": 100}, "unsupported_size"),
    ({"prompt": "x", "width": 640, "height": 128}, "unsupported_size"),  # aspect 5:1
    ({"prompt": "x", "seconds": 2}, "unsupported_duration"),
    ({"prompt": "x", "seconds": 16}, "unsupported_duration"),
    ({"prompt": "x", "seed": -1}, "invalid_request"),
    ({"prompt": "x", "seed": 2**63}, "invalid_request"),
    ({"prompt": "x" * 4001}, "invalid_request"),
    ({"prompt": "lone \ud800 surrogate"}, "invalid_request"),  # found by schemathesis: was a 500
    ({"prompt": "x", "release": "\udfff"}, "invalid_request"),
    ([1, 2], "invalid_json"),
])
def test_bad_create_bodies_get_400_with_the_error_envelope(api, jobs_made, body, code):
    """Each invalid create body is refused at the door with 400 and a stable error code, never a 500."""
    reply = requests.post(f"{api.base}/jobs", json=body, timeout=60)
    assert_error(reply, 400, code)


def test_non_json_body_gets_400(api):
    """A body that is not JSON at all gets 400 invalid_json."""
    reply = requests.post(f"{api.base}/jobs", data=b"prompt=hi", headers={"Content-Type": "text/plain"}, timeout=60)
    assert_error(reply, 400, "invalid_json")


def test_body_over_64_kib_gets_413(api):
    """A body above 64 KiB on a route without images (POST /sweeps) gets 413 request_too_large in the JSON envelope
    (gunicorn, not the dev server); a create body may be larger (input images), and past 48 MiB gets the same 413."""
    reply = requests.post(f"{api.base}/sweeps", data=b'{"name": "' + b"a" * 70_000 + b'"}',
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert_error(reply, 413, "request_too_large")
    reply = requests.post(f"{api.base}/jobs", data=b'{"prompt": "' + b"a" * 70_000 + b'"}',
                          headers={"Content-Type": "application/json"}, timeout=60)
    assert_error(reply, 400, "invalid_request")
    reply = requests.post(f"{api.base}/jobs", data=b'{"prompt": "' + b"a" * (48 * 2**20 + 1) + b'"}',
                          headers={"Content-Type": "application/json"}, timeout=120)
    assert_error(reply, 413, "request_too_large")


@pytest.mark.parametrize("method, path", [
    ("GET", "/jobs/job_doesnotexist"), ("GET", "/jobs/job_doesnotexist/content"),
    ("POST", "/jobs/job_doesnotexist/cancel"), ("DELETE", "/jobs/job_doesnotexist"),
])
def test_unknown_job_is_404_job_not_found(api, method, path):
    """Every per-job route answers 404 job_not_found for an id that does not exist."""
    assert_error(requests.request(method, api.base + path, timeout=60), 404, "job_not_found")


def test_unknown_route_and_wrong_method_are_json(api):
    """werkzeug's own 404 and 405 come back in the JSON envelope (405 keeps its Allow header)."""
    assert_error(requests.get(f"{api.base}/no/such/route", timeout=60), 404, "not_found")
    reply = requests.put(f"{api.base}/jobs", timeout=60)
    assert_error(reply, 405, "method_not_allowed")
    assert "POST" in reply.headers["Allow"]


def test_content_of_an_unfinished_job_is_409(api, jobs_made):
    """Downloading a queued job's video answers 409 job_not_completed with x-should-retry: false."""
    job = create(api, jobs_made).json()
    reply = requests.get(f"{api.base}/jobs/{job['id']}/content", timeout=60)
    assert_error(reply, 409, "job_not_completed")
    assert reply.headers["x-should-retry"] == "false"


def test_queue_positions_are_fifo_and_cancel_removes_from_the_queue(api, jobs_made, r):
    """Queued jobs hold consecutive positions in creation order; cancelling one makes it cancelled at once,
    removes it from the queue zset and moves the later ones up; a second cancel is 409."""
    ids = [create(api, jobs_made).json()["id"] for _ in range(3)]
    positions = [requests.get(f"{api.base}/jobs/{i}", timeout=60).json()["queue_position"] for i in ids]
    assert positions == sorted(positions) and positions[2] - positions[0] == 2
    cancelled = requests.post(f"{api.base}/jobs/{ids[1]}/cancel", timeout=60)
    assert cancelled.status_code == 202
    body = cancelled.json()
    assert body["status"] == "cancelled" and body["queue_position"] is None and body["started_at"] is None
    assert body["cancel_reason"] == "user" and body["cancelled_at_stage"] == "queued"
    assert r.zscore("h3b:queue", ids[1]) is None
    last = requests.get(f"{api.base}/jobs/{ids[2]}", timeout=60).json()["queue_position"]
    assert last == positions[2] - 1
    assert_error(requests.post(f"{api.base}/jobs/{ids[1]}/cancel", timeout=60), 409, "job_already_terminal")


def test_delete_removes_record_and_index_entries(api, jobs_made, r):
    """DELETE answers 204; the record, its queue entry and index entry are gone and GET is 404."""
    job_id = create(api, jobs_made).json()["id"]
    assert requests.delete(f"{api.base}/jobs/{job_id}", timeout=60).status_code == 204
    assert r.exists(f"h3b:job:{job_id}") == 0
    assert r.zscore("h3b:queue", job_id) is None and r.zscore("h3b:jobs", job_id) is None
    assert_error(requests.get(f"{api.base}/jobs/{job_id}", timeout=60), 404, "job_not_found")


def test_list_pages_newest_first_without_duplicates(api, jobs_made):
    """GET /jobs pages newest first with an `after` cursor; pages neither skip nor repeat; bad cursor/limit → 400."""
    ids = [create(api, jobs_made).json()["id"] for _ in range(5)]
    seen: list[str] = []
    after = None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = requests.get(f"{api.base}/jobs", params=params, timeout=60).json()
        assert page["object"] == "list" and len(page["data"]) <= 2
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"] or all(i in seen for i in ids):
            break
        after = page["last_id"]
    mine = [i for i in seen if i in ids]
    assert mine == list(reversed(ids))
    assert len(seen) == len(set(seen))
    assert_error(requests.get(f"{api.base}/jobs", params={"after": "job_nope"}, timeout=60), 400, "invalid_cursor")
    assert_error(requests.get(f"{api.base}/jobs", params={"limit": 0}, timeout=60), 400, "invalid_request")
    assert_error(requests.get(f"{api.base}/jobs", params={"status": "done"}, timeout=60), 400, "invalid_request")


def test_openapi_documents_every_route_with_schemas_from_the_models(api):
    """/openapi.json is OpenAPI 3.1, lists every job route and status code, and carries the pydantic schemas."""
    doc = requests.get(f"{api.base}/openapi.json", timeout=60).json()
    assert doc["openapi"].startswith("3.1")
    for path in ("/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/content", "/healthz",
                 "/readyz"):
        assert path in doc["paths"], path
    assert {"202", "400", "413"} <= set(doc["paths"]["/jobs"]["post"]["responses"])
    assert {"200", "206", "409", "416"} <= set(doc["paths"]["/jobs/{job_id}/content"]["get"]["responses"])
    schemas = doc["components"]["schemas"]
    assert schemas["CreateJob"]["additionalProperties"] is False
    assert set(schemas["Job"]["properties"]["status"]["enum"]) == {"queued", "in_progress", "completed", "failed",
                                                                   "cancelled", "expired"}


def test_api_process_never_imports_torch():
    """Importing api and building the app (blueprints, schemas, Celery sender) leaves torch unimported."""
    code = ("import sys; from h3batch.api import create_app; app = create_app({'TESTING': True}); "
            "app.test_client().get('/openapi.json'); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-P", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.fixture
def keyed_api(redis_url, artifacts_dir, caplog):
    """The app with two API keys, on a real werkzeug HTTP server thread, Redis DB 1 (no worker heartbeats there)."""
    caplog.set_level(logging.DEBUG)
    url = redis_url.rsplit("/", 1)[0] + "/1"
    app = create_app({"REDIS_URL": url, "ARTIFACTS_DIR": str(artifacts_dir),
                      "API_KEYS": ["canary-key-one-7f3a", "canary-key-two-9b1c"]})
    base, stop = serve_in_thread(app)
    yield base
    stop()


def test_bearer_keys_gate_every_job_route_and_isolate_owners(keyed_api, caplog):
    """Missing or wrong keys get 401 + WWW-Authenticate; a valid key works; another key's job is 404; the open
    routes need no key; the keys never appear in logs."""
    one = {"Authorization": "Bearer canary-key-one-7f3a"}
    two = {"Authorization": "Bearer canary-key-two-9b1c"}
    reply = requests.post(f"{keyed_api}/jobs", json={"prompt": "x"}, timeout=60)
    assert_error(reply, 401, "unauthorized")
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert_error(requests.get(f"{keyed_api}/jobs", headers={"Authorization": "Bearer nope"}, timeout=60),
                 401, "unauthorized")
    assert_error(requests.get(f"{keyed_api}/jobs", headers={"Authorization": "Basic abc"}, timeout=60),
                 401, "unauthorized")
    made = requests.post(f"{keyed_api}/jobs", json={"prompt": "x"}, headers=one, timeout=60)
    assert made.status_code == 202, made.text
    job_id = made.json()["id"]
    assert requests.get(f"{keyed_api}/jobs/{job_id}", headers=one, timeout=60).status_code == 200
    assert_error(requests.get(f"{keyed_api}/jobs/{job_id}", headers=two, timeout=60), 404, "job_not_found")
    listed = requests.get(f"{keyed_api}/jobs", headers=two, timeout=60).json()["data"]
    assert job_id not in [j["id"] for j in listed]
    for path in ("/healthz", "/openapi.json"):
        assert requests.get(keyed_api + path, timeout=60).status_code == 200
    ready = requests.get(f"{keyed_api}/readyz", timeout=60)
    assert ready.status_code == 503 and ready.json()["checks"]["workers"]["ok"] is False
    assert requests.delete(f"{keyed_api}/jobs/{job_id}", headers=one, timeout=60).status_code == 204
    logged = "\n".join(rec.getMessage() for phase in ("setup", "call") for rec in caplog.get_records(phase))
    assert "canary-key" not in logged
    assert "api keys loaded count=2" in logged


def serve_in_thread(app):
    """Run `app` on a real werkzeug HTTP server thread; returns (base URL, stop function)."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        thread.join(timeout=10)

    return f"http://127.0.0.1:{server.server_port}", stop


def test_full_queue_answers_503_queue_full_with_retry_after(redis_url, artifacts_dir):
    """With H3BATCH_MAX_QUEUED jobs queued, POST /jobs answers 503 queue_full + Retry-After; queued jobs stay."""
    import redis as redis_lib

    url = redis_url.rsplit("/", 1)[0] + "/6"
    redis_lib.Redis.from_url(url).flushdb()
    base, stop = serve_in_thread(create_app({"REDIS_URL": url, "ARTIFACTS_DIR": str(artifacts_dir),
                                             "MAX_QUEUED": 2}))
    try:
        ids = [requests.post(f"{base}/jobs", json={"prompt": "x"}, timeout=60).json()["id"] for _ in range(2)]
        reply = requests.post(f"{base}/jobs", json={"prompt": "x"}, timeout=60)
        error = assert_error(reply, 503, "queue_full")
        assert error["retryable"] is True and 0 < int(reply.headers["Retry-After"]) <= 120
        assert [requests.get(f"{base}/jobs/{i}", timeout=60).json()["queue_position"] for i in ids] == [1, 2]
    finally:
        stop()
        redis_lib.Redis.from_url(url).flushdb()


def test_unreachable_redis_is_503_storage_unavailable_not_500(artifacts_dir):
    """When Redis goes away under a running API, job routes answer 503 storage_unavailable, /healthz stays 200 and
    /readyz says which check fails."""
    from tests.service_stack import free_port

    app = create_app({"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "ARTIFACTS_DIR": str(artifacts_dir)})
    base, stop = serve_in_thread(app)
    try:
        assert_error(requests.post(f"{base}/jobs", json={"prompt": "x"}, timeout=30), 503, "storage_unavailable")
        assert_error(requests.get(f"{base}/jobs/job_x", timeout=30), 503, "storage_unavailable")
        assert requests.get(f"{base}/healthz", timeout=60).status_code == 200
        ready = requests.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["checks"]["redis"]["ok"] is False
    finally:
        stop()


def test_idempotency_key_replays_the_same_job_and_refuses_another_body(api, jobs_made, r):
    """A create retried with the same Idempotency-Key and body returns the original job (Idempotent-Replayed);
    the same key with a different body is 422; 20 concurrent identical creates make exactly one job."""
    headers = {"Idempotency-Key": '"retry-me-1"'}
    first = requests.post(f"{api.base}/jobs", json={"prompt": "once"}, headers=headers, timeout=60)
    assert first.status_code == 202
    jobs_made.append(first.json()["id"])
    again = requests.post(f"{api.base}/jobs", json={"prompt": "once"}, headers=headers, timeout=60)
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.json()["seed"] == first.json()["seed"]
    assert_error(requests.post(f"{api.base}/jobs", json={"prompt": "twice"}, headers=headers, timeout=60),
                 422, "idempotency_key_reused")

    before = r.zcard("h3b:jobs")
    results: list[requests.Response] = []

    def create_same():
        results.append(requests.post(f"{api.base}/jobs", json={"prompt": "race"},
                                     headers={"Idempotency-Key": "race-key-7"}, timeout=30))

    threads = [threading.Thread(target=create_same) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = {reply.json()["id"] for reply in results if reply.status_code == 202}
    jobs_made.extend(made)
    assert len(made) == 1 and r.zcard("h3b:jobs") == before + 1
    for reply in results:  # the rest replayed it, or were told to retry while the first was in flight
        assert reply.status_code == 202 or (reply.status_code == 409 and reply.headers["Retry-After"] == "1")
