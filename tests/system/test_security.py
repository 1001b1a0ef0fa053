"""Security: API keys (hashed, constant-time, per-key jobs), per-key rate limits, the queue cap, JSON-only messaging,
artifact paths derived from ids only, and no secret in any log, error body or Redis value; the webhook secret is
checked at start, compose hands it to API and worker, and the dispatcher's Redis-outage logging is rate-limited."""
from __future__ import annotations

import base64
import hashlib
import inspect
import json
import logging
import re
import subprocess
import time

import pytest
import redis
import requests
import yaml
from kombu import Connection, Exchange, Producer

from h3batch.core import keys, routing
from h3batch.settings import Settings
from tests.system.conftest import (
    H3BATCH,
    KEY_A,
    KEY_B,
    REPO,
    SMALL,
    ApiProcess,
    RedisServer,
    Stack,
    bearer,
    service_env,
    wait_all_finished,
)

SOURCE_DIRS = ("api", "worker", "kernels", "loadrunner", "bench", "docker")
PICKLE_USE = re.compile(r"\bimport\s+(c?pickle|dill|cloudpickle|shelve)\b|\bfrom\s+(c?pickle|dill|cloudpickle)\s+import"
                        r"|\b(c?pickle|dill|cloudpickle)\.(loads?|dumps?|Unpickler)\b|torch\.load\(|"
                        r"serializer\s*=\s*['\"]pickle|accept_content[^\n]*pickle")


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_release):
    """Keyed API + one worker on a private Redis; one job rendered to completion with KEY_A."""
    root = tmp_path_factory.mktemp("security")
    server = RedisServer(root / "redis")
    server.start()
    stack = Stack(root=root, release=tiny_release, redis=server)
    try:
        stack.start_api(H3BATCH_API_KEYS=f"{KEY_A},{KEY_B}", H3BATCH_LOG_LEVEL="DEBUG")
        stack.start_worker("sec-worker", H3BATCH_LOG_LEVEL="DEBUG")
        job = requests.post(f"{stack.api.base}/jobs", json={"prompt": "a lighthouse hums", **SMALL},
                            headers=bearer(KEY_A), timeout=30).json()
        statuses = wait_all_finished(server.client(), [job["id"]], timeout_s=120)
        assert statuses[job["id"]] == "completed", stack.logs()[-3000:]
        yield stack, job
    finally:
        stack.close()


def test_keys_are_kept_as_digests_and_compared_in_constant_time():
    """create_app keeps only SHA-256 digests of H3BATCH_API_KEYS, and the check compares with hmac.compare_digest
    against every digest (no early exit on a match)."""
    from h3batch.api import auth, create_app  # noqa: PLC0415

    app = create_app({"API_KEYS": [KEY_A, KEY_B], "REDIS_URL": "redis://127.0.0.1:1/0"})
    digests = app.extensions["h3batch.key_digests"]
    assert digests == [hashlib.sha256(k.encode()).digest() for k in (KEY_A, KEY_B)]
    source = inspect.getsource(auth._authenticate)
    assert "hmac.compare_digest" in source and "break" not in source and "return" not in source.split("for ")[1]


def test_every_route_needs_a_key_and_jobs_are_private(served):
    """Without or with a wrong key every job route is 401 + WWW-Authenticate: Bearer (health and OpenAPI stay open);
    another key's job reads as 404, and a wrong key is not echoed back."""
    stack, job = served
    base, job_id = stack.api.base, job["id"]
    routes = [("POST", "/jobs"), ("GET", "/jobs"), ("GET", f"/jobs/{job_id}"), ("DELETE", f"/jobs/{job_id}"),
              ("POST", f"/jobs/{job_id}/cancel"), ("GET", f"/jobs/{job_id}/content"), ("GET", f"/jobs/{job_id}/events")]
    wrong = "wrong-key-" + KEY_A[::-1]
    for method, path in routes:
        for headers in ({}, bearer(wrong), {"Authorization": KEY_A}, {"Authorization": "Basic " + KEY_A}):
            reply = requests.request(method, base + path, headers=headers, json={"prompt": "x"}, timeout=60)
            assert reply.status_code == 401 and reply.headers["WWW-Authenticate"].startswith("Bearer"), (path, reply)
            assert reply.json()["error"]["code"] == "unauthorized"
            assert wrong not in reply.text and KEY_A not in reply.text
    for path in ("/healthz", "/openapi.json"):
        assert requests.get(base + path, timeout=60).status_code == 200
    for method, path in routes[2:]:
        assert requests.request(method, base + path, headers=bearer(KEY_B), timeout=60).status_code == 404
    assert requests.get(f"{base}/jobs/{job_id}", headers=bearer(KEY_A), timeout=60).status_code == 200


def test_rate_limit_answers_429_with_retry_after_then_recovers(served, tmp_path):
    """Past a key's create quota (30/min) POST /jobs is 429 rate_limited with an integer Retry-After and draft-10
    RateLimit headers; reads and the other key are unaffected; after Retry-After the key creates again."""
    stack, _ = served
    api = ApiProcess(service_env(stack.redis.url, stack.artifacts, H3BATCH_API_KEYS=f"{KEY_A},{KEY_B}",
                                 H3BATCH_RATE_CREATES_PER_MIN="30", H3BATCH_RATE_READS_PER_MIN="600"),
                     tmp_path / "api-limited.log")
    api.start()
    try:
        stack.redis.client().delete(*stack.redis.client().keys("h3b:rate:*") or ["-"])
        body = {"prompt": "rain", "seconds": 4, **SMALL}
        replies = [requests.post(f"{api.base}/jobs", json=body, headers=bearer(KEY_A), timeout=60) for _ in range(31)]
        assert [r.status_code for r in replies[:30]] == [202] * 30
        limited = replies[30]
        assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limited"
        assert limited.json()["error"]["retryable"] is True
        retry_after = int(limited.headers["Retry-After"])
        assert 1 <= retry_after <= 2  # 30/min refills one token every 2 s
        assert limited.headers["RateLimit-Policy"] == '"creates";q=30;w=60'
        assert re.fullmatch(r'"creates";r=0;t=\d+', limited.headers["RateLimit"])
        assert requests.get(f"{api.base}/jobs", headers=bearer(KEY_A), timeout=60).status_code == 200
        assert requests.post(f"{api.base}/jobs", json=body, headers=bearer(KEY_B), timeout=60).status_code == 202
        time.sleep(retry_after)
        assert requests.post(f"{api.base}/jobs", json=body, headers=bearer(KEY_A), timeout=60).status_code == 202
    finally:
        api.stop()
        for job_id in stack.redis.client().zrange("h3b:queue", 0, -1):  # leave the shared worker nothing to do
            requests.post(f"{stack.api.base}/jobs/{job_id}/cancel", headers=bearer(KEY_A), timeout=60)
            requests.post(f"{stack.api.base}/jobs/{job_id}/cancel", headers=bearer(KEY_B), timeout=60)


def test_queue_cap_answers_503_with_retry_after(keyed_stack, tmp_path):
    """With H3BATCH_MAX_QUEUED reached, POST /jobs is 503 queue_full with Retry-After (≤ 120 s, the OpenAI SDK's
    limit) instead of growing the queue; the queued jobs keep their places. The cap counts every queued job, held
    batch-lane jobs included (h3b:backlog), not only those in h3b:queue: the shared stack holds one here, as the
    schemathesis run may leave others (a CI run once read h3b:queue alone and got 503 for the first create)."""
    r = keyed_stack.redis.client()
    held = requests.post(f"{keyed_stack.api.base}/jobs", json={"prompt": "held back", **SMALL, "priority": "batch"},
                         headers=bearer(KEY_A), timeout=10)
    assert held.status_code == 202 and held.json()["queue_position"] is None, held.text
    backlog, queued = r.zcard(keys.BACKLOG), r.zcard(keys.QUEUE)
    assert backlog > queued  # the held job counts toward the cap without a place in the render queue
    api = ApiProcess(service_env(keyed_stack.redis.url, keyed_stack.artifacts, H3BATCH_API_KEYS=KEY_A,
                                 H3BATCH_MAX_QUEUED=str(backlog + 2)), tmp_path / "api-capped.log")
    api.start()
    try:
        made = [requests.post(f"{api.base}/jobs", json={"prompt": "queue me", **SMALL}, headers=bearer(KEY_A),
                              timeout=10) for _ in range(2)]
        assert [m.status_code for m in made] == [202, 202], [m.text for m in made]
        full = requests.post(f"{api.base}/jobs", json={"prompt": "one too many", **SMALL}, headers=bearer(KEY_A),
                             timeout=10)
        assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
        assert full.json()["error"]["retryable"] is True and 1 <= int(full.headers["Retry-After"]) <= 120
        assert (r.zcard(keys.BACKLOG), r.zcard(keys.QUEUE)) == (backlog + 2, queued + 2)
        positions = [requests.get(f"{api.base}/jobs/{m.json()['id']}", headers=bearer(KEY_A), timeout=60)
                     .json()["queue_position"] for m in made]
        assert positions == [queued + 1, queued + 2]
    finally:
        api.stop()


def test_celery_is_json_only_and_no_source_file_uses_pickle():
    """The Celery app serializes and accepts JSON only, and no h3batch source file imports pickle, dill or
    cloudpickle or calls torch.load (which unpickles)."""
    from h3batch.core.celery_app import make_celery  # noqa: PLC0415

    conf = make_celery("redis://127.0.0.1:1/0").conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json" and conf.result_serializer == "json"
    hits = []
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if PICKLE_USE.search(line):
                    hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, hits


def test_a_pickled_message_is_refused_and_nothing_runs(served):
    """A pickle-serialized render message published straight to the queue is refused by the worker
    (ContentDisallowed) and never reaches the task: the named job stays queued and no execution is counted."""
    stack, _ = served
    r = stack.redis.client()
    victim_id = "job_" + "0" * 24
    record = {"id": victim_id, "status": "queued", "stage": "queued", "attempt": "0",
              "created_at": repr(time.time()), "seq": "0", "owner": "", "prompt": "p",
              "seconds": "4", "width": "128", "height": "32", "seed": "1"}
    r.hset(f"h3b:job:{victim_id}", mapping=record)
    queue = routing.queue_of(record)  # the capability queue the worker consumes (docs/service.md "Routing")
    with Connection(stack.redis.url) as conn:
        producer = Producer(conn, exchange=Exchange(queue, type="direct"), routing_key=queue,
                            serializer="pickle")
        producer.publish([[victim_id], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
                         headers={"lang": "py", "task": "h3batch.render", "id": "pickled-1", "argsrepr": "pickled"},
                         declare=[])
    worker = stack.workers[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "pickle" not in worker.log_text().lower():
        time.sleep(0.2)
    log = worker.log_text()
    assert re.search(r"ContentDisallowed|Refusing to deserialize|untrusted content", log), log[-2000:]
    time.sleep(1)
    assert r.hget(f"h3b:job:{victim_id}", "status") == "queued" and not r.exists(f"h3b:runs:{victim_id}")
    r.delete(f"h3b:job:{victim_id}")


@pytest.mark.parametrize("path", ["/jobs/..%2F..%2Fetc%2Fpasswd/content", "/jobs/%2e%2e/content",
                                  "/jobs/%2e%2e%2f%2e%2e%2fetc%2fpasswd/content", "/jobs/%2Fetc%2Fpasswd/content",
                                  "/jobs/..%5c..%5cwindows/content", "/jobs/%252e%252e/content", "//etc/passwd",
                                  "/jobs/../../etc/passwd", "/jobs/%2e%2e"])
def test_traversal_ids_never_reach_a_file(served, path):
    """Ids made of `..`, encoded slashes or absolute paths answer 404 (or 405) with the error envelope, never a file."""
    stack, _ = served
    for method in ("GET", "DELETE"):
        reply = requests.request(method, stack.api.base + path, headers=bearer(KEY_A), timeout=60)
        assert reply.status_code in (400, 404, 405), (method, path, reply.status_code)  # 405: DELETE on /content
        assert reply.headers["Content-Type"].startswith("application/json") and "root:" not in reply.text
    assert stack.artifacts.is_dir()


def test_a_tampered_artifact_path_is_not_served(served):
    """Even a record whose artifact field points outside the artifacts dir (a corrupted or forged record) is not
    served: the path is resolved and must stay under the artifacts dir (410, no bytes of the outside file)."""
    stack, job = served
    r = stack.redis.client()
    outside = stack.root / "secret.txt"
    outside.write_text("outside the artifacts dir")
    original = r.hget(f"h3b:job:{job['id']}", "artifact")
    try:
        for forged in ("../secret.txt", str(outside), f"{job['id']}/../../secret.txt"):
            r.hset(f"h3b:job:{job['id']}", "artifact", forged)
            reply = requests.get(f"{stack.api.base}/jobs/{job['id']}/content", headers=bearer(KEY_A), timeout=60)
            assert reply.status_code == 410 and b"outside" not in reply.content, forged
    finally:
        r.hset(f"h3b:job:{job['id']}", "artifact", original)
    assert requests.get(f"{stack.api.base}/jobs/{job['id']}/content", headers=bearer(KEY_A),
                        timeout=10).status_code == 200


def test_no_key_or_key_digest_in_logs_bodies_or_redis(served):
    """After a rendered job, 401s, 404s and a fuzz of bad bodies with the canary keys set, neither key nor its SHA-256
    digest appears in the API or worker logs, in any Redis key or value, or in /openapi.json."""
    stack, job = served
    base = stack.api.base
    for bad in ({"prompt": ""}, {"prompt": "x", "width": 7}, {"nope": 1}):
        requests.post(f"{base}/jobs", json=bad, headers=bearer(KEY_A), timeout=60)
    requests.get(f"{base}/jobs/{job['id']}", headers=bearer(KEY_A[:-1]), timeout=60)
    requests.get(f"{base}/jobs/job_missing", headers=bearer(KEY_B), timeout=60)
    openapi = requests.get(f"{base}/openapi.json", timeout=60).text
    canaries = [KEY_A, KEY_B, KEY_A[:-1]] + [hashlib.sha256(k.encode()).hexdigest() for k in (KEY_A, KEY_B)]
    r = stack.redis.client()
    dump = []
    for key in r.scan_iter(count=1000):
        kind = r.type(key)
        dump.append(key)
        if kind == "string":
            dump.append(r.get(key) or "")
        elif kind == "hash":
            dump.append(json.dumps(r.hgetall(key)))
        elif kind == "list":
            dump.append(json.dumps(r.lrange(key, 0, -1)))
        elif kind == "zset":
            dump.append(json.dumps(r.zrange(key, 0, -1)))
        elif kind == "stream":
            dump.append(json.dumps(r.xrange(key)))
    haystacks = {"logs": stack.logs(), "redis": "\n".join(dump), "openapi": openapi}
    assert len(haystacks["logs"]) > 1000  # the logs really were captured
    for name, text in haystacks.items():
        for canary in canaries:
            assert canary not in text, f"a key or its digest leaked into {name}"
    assert "Traceback" not in stack.api.log_path.read_text(errors="replace")  # (the worker logs the pickle refusal)


# --- P5 round two, item 10: the webhook secret, compose, the dispatcher during a Redis outage ---

BAD_SECRETS = {
    "not base64": "whsec_not*base64!",
    "too short": "whsec_" + base64.b64encode(b"short").decode(),
    "too long": "whsec_" + base64.b64encode(b"k" * 65).decode(),
}


@pytest.mark.parametrize("command", ["api", "worker"])
@pytest.mark.parametrize("why", sorted(BAD_SECRETS))
def test_malformed_webhook_secret_stops_api_and_worker_at_start(tmp_path, command, why):
    """A malformed `whsec_` H3BATCH_WEBHOOK_SECRET makes `h3batch api` and `h3batch worker` exit 2 with one line
    naming the variable (never its value), before anything connects; it used to fail inside sign() on every
    delivery attempt."""
    secret = BAD_SECRETS[why]
    env = service_env("redis://127.0.0.1:9/0", tmp_path / "artifacts", H3BATCH_WEBHOOK_SECRET=secret,
                      H3BATCH_RELEASE=str(tmp_path / "no-release"))
    done = subprocess.run(H3BATCH + [command, "--port", "9"] if command == "api" else H3BATCH + [command],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-2000:])
    assert lines[0].startswith(f"h3batch {command}: H3BATCH_WEBHOOK_SECRET: ")
    assert secret[len("whsec_"):] not in done.stderr + done.stdout


def test_a_good_webhook_secret_parses():
    good = "whsec_" + base64.b64encode(b"k" * 32).decode()
    assert Settings.from_env({"H3BATCH_WEBHOOK_SECRET": good}).webhook_secret == good
    assert Settings.from_env({"H3BATCH_WEBHOOK_SECRET": "plain text secret"}).webhook_secret == "plain text secret"


def test_compose_passes_the_webhook_secret_to_api_and_worker():
    """docker-compose.yml gives H3BATCH_WEBHOOK_SECRET (the same value) to both the api and the gpu-worker."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    values = {name: compose["services"][name]["environment"].get("H3BATCH_WEBHOOK_SECRET")
              for name in ("api", "gpu-worker")}
    assert values["api"] == values["gpu-worker"] == "${H3BATCH_WEBHOOK_SECRET:-}", values


def test_dispatcher_logs_a_redis_outage_once_per_period_without_tracebacks(tmp_path, caplog):
    """The webhook dispatcher polling a dead Redis every 50 ms for 2.5 s logs one warning per 1 s period (3 at
    most), none with a traceback, and one line when Redis is back (it logged a traceback every poll)."""
    from h3batch.core.webhook_urls import WebhookSettings  # noqa: PLC0415
    from h3batch.worker.webhook_delivery import WebhookDispatcher  # noqa: PLC0415

    server = RedisServer(tmp_path / "redis")
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=0.5,
                                  socket_connect_timeout=0.5)
    dispatcher = WebhookDispatcher(client, WebhookSettings(secret="s", poll_s=0.05), outage_log_every_s=1.0)
    caplog.set_level(logging.INFO, logger="h3batch.webhooks")
    try:
        server.kill9()
        dispatcher.start()
        time.sleep(2.5)
        outage = [r for r in caplog.records if "webhook dispatch" in r.getMessage()]
        server.start()
        deadline = time.monotonic() + 10
        while not any("resumed" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        dispatcher.stop()
        server.kill9()
    assert 2 <= len(outage) <= 3, [r.getMessage() for r in outage]
    assert all("paused: redis unavailable" in r.getMessage() and r.exc_info is None for r in outage)
    assert any("resumed" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info]
