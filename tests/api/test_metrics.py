"""GET /metrics against the real stack: a private redis-server, the API under gunicorn with two worker processes (so
request counts must add up across processes), a second API process without a metrics token, and one real
`h3batch worker` on the tiny release.

One module-scoped scenario runs a few jobs (two completed, one failed by the worker, one cancelled mid-render), a
404, a 400 and a queued sweep, counting every request it sends; the tests scrape /metrics with prometheus_client's
parser and compare with those counts and with the job records (statuses, error codes, the stage timings the worker
wrote). Access: the token API answers 401 without the token; the open API answers loopback clients only.
"""
from __future__ import annotations

import calendar
import math
import os
import time
from collections import Counter

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from h3batch.core import defaults, metrics
from h3batch.loadrunner import sweep_store
from h3batch.loadrunner.sweep_summary import summary_row
from tests.conftest import start_redis
from tests.service_stack import ApiProcess, service_env, start_worker

TOKEN = "metrics-token-for-tests-0123"
SMALL = {"width": 128, "height": 32, "seconds": 4}
STEP_DELAY_S = 0.12
"""The worker sleeps this long at each progress report, so the job to cancel is still rendering when the cancel
arrives."""
UNCOUNTED_ROUTES = {"/healthz", "/metrics"}
"""Routes the scenario does not count exactly: start-up polls /healthz, and scrapes count themselves."""


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def series(samples: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


class Client:
    """Requests to the token API, each counted by (method, route, status) as /metrics should show it."""

    def __init__(self, base: str):
        self.base = base
        self.sent: Counter[tuple[str, str, str]] = Counter()
        self.session = requests.Session()

    def call(self, method: str, path: str, route: str, **kwargs) -> requests.Response:
        reply = self.session.request(method, self.base + path, timeout=30, **kwargs)
        self.sent[(method, route, str(reply.status_code))] += 1
        return reply

    def job(self, job_id: str) -> dict:
        reply = self.call("GET", f"/jobs/{job_id}", "/jobs/<job_id>")
        assert reply.status_code == 200, reply.text
        return reply.json()

    def until(self, job_id: str, predicate, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if predicate(job):
                return job
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} never got there; last seen {job}")

    def create(self, **body) -> str:
        reply = self.call("POST", "/jobs", "/jobs", json={"prompt": "a lighthouse at dusk", **SMALL, **body})
        assert reply.status_code == 202, reply.text
        return reply.json()["id"]

    def scrape(self) -> dict:
        reply = self.session.get(self.base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(reply.text)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_release):
    root = tmp_path_factory.mktemp("metrics")
    proc, url = start_redis(root / "redis")
    artifacts = root / "artifacts"
    artifacts.mkdir()
    started: list = []
    try:
        api = ApiProcess(service_env(url, artifacts, H3BATCH_METRICS_TOKEN=TOKEN, H3BATCH_SWEEP_ALLOW_LOOPBACK="1"),
                         root / "api.log", workers=2)
        api.start()
        started.append(api)
        open_api = ApiProcess(service_env(url, artifacts), root / "open-api.log")
        open_api.start()
        started.append(open_api)
        worker = start_worker(url, artifacts, tiny_release, f"metrics-worker-{os.getpid()}", root / "worker.log",
                              H3BATCH_DEBUG_STEP_DELAY_S=str(STEP_DELAY_S))
        started.append(worker)
        yield {"api": api, "open_api": open_api, "worker": worker, "redis_url": url}
    finally:
        for process in reversed(started):
            process.kill()  # nothing left to check: no need to wait for graceful stops
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def scenario(stack):
    """Two completed jobs, one failed (release_mismatch), one cancelled while rendering, a 404, a 400, a queued
    sweep; returns the client (with its request counts), the final records and a scrape taken mid-render."""
    client = Client(stack["api"].base)
    done = [client.create() for _ in range(2)]
    for job_id in done:
        client.until(job_id, lambda j: j["status"] == "completed")
    failed = client.create(release="no-such-release")
    client.until(failed, lambda j: j["status"] == "failed")
    doomed = client.create()
    client.until(doomed, lambda j: j["status"] == "in_progress" and j["stage"] == "denoise")
    mid = client.scrape()
    reply = client.call("POST", f"/jobs/{doomed}/cancel", "/jobs/<job_id>/cancel")
    assert reply.status_code == 202, reply.text  # accepted: the worker stops at the next step boundary
    client.until(doomed, lambda j: j["status"] == "cancelled")
    assert client.call("GET", "/jobs/job_000000000000000000000000", "/jobs/<job_id>").status_code == 404
    assert client.call("POST", "/jobs", "/jobs", data=b"not json",
                       headers={"Content-Type": "application/json"}).status_code == 400
    sweep = client.call("POST", "/sweeps", "/sweeps", json={"url": "ws://127.0.0.1:9/v1/realtime", "sessions": [1]})
    assert sweep.status_code == 202, sweep.text
    records = {job_id: client.job(job_id) for job_id in done + [failed, doomed]}
    r = redis.Redis.from_url(stack["redis_url"], decode_responses=True)
    deadline = time.monotonic() + 30  # the worker beats READY once the cancelled attempt is released
    while '"state": "READY"' not in (r.get(f"h3b:worker:{stack['worker'].name}") or "") and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    r.close()
    return {"client": client, "records": records, "mid": mid, "failed": failed, "doomed": doomed}


def test_jobs_by_status_and_error_code_match_the_records(scenario):
    records = scenario["records"].values()
    assert scenario["records"][scenario["failed"]]["error"]["code"] == "release_mismatch"
    assert scenario["records"][scenario["doomed"]]["status"] == "cancelled"
    samples = scenario["client"].scrape()
    finished = Counter(job["status"] for job in records)
    assert finished == {"completed": 2, "failed": 1, "cancelled": 1}
    expected = {"queued": len(records), "in_progress": sum(job["started_at"] is not None for job in records),
                **finished}
    got = {dict(labels)["status"]: v for labels, v in series(samples, "h3batch_jobs_total").items()}
    assert got == {"queued": 4, "in_progress": 4, "completed": 2, "failed": 1, "cancelled": 1, "expired": 0}
    assert got == {**expected, "expired": 0}
    assert series(samples, "h3batch_job_errors_total") == {frozenset({("code", "release_mismatch")}): 1.0}
    assert value(samples, "h3batch_jobs_queued") == 0 and value(samples, "h3batch_jobs_running") == 0


def test_stage_and_queue_wait_histograms_match_the_records(scenario):
    samples = scenario["client"].scrape()
    completed = [job for job in scenario["records"].values() if job["status"] == "completed"]
    for stage in metrics.STAGES:
        seen = [job["timings"][stage] for job in completed]
        name = "h3batch_job_stage_duration_seconds"
        assert value(samples, name + "_count", stage=stage) == len(seen) == 2
        assert math.isclose(value(samples, name + "_sum", stage=stage), sum(seen), abs_tol=1e-9)
        for bound in (*defaults.STAGE_BUCKETS_S, math.inf):
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            assert value(samples, name + "_bucket", stage=stage, le=le) == sum(s <= bound for s in seen), (stage, le)
    claimed = [job for job in scenario["records"].values() if job["started_at"] is not None]
    assert value(samples, "h3batch_job_queue_wait_seconds_count") == len(claimed) == 4
    waits = sum(job["started_at"] - job["created_at"] for job in claimed)
    assert math.isclose(value(samples, "h3batch_job_queue_wait_seconds_sum"), waits, abs_tol=0.5)
    assert value(samples, "h3batch_job_queue_wait_seconds_bucket", le="+Inf") == 4


def test_http_requests_add_up_across_gunicorn_processes(scenario):
    client = scenario["client"]
    expected = {labels: float(n) for labels, n in client.sent.items()}
    assert ("GET", "/jobs/<job_id>", "404") in expected and ("POST", "/jobs", "400") in expected
    deadline = time.monotonic() + 10  # the other gunicorn process adds its counts every METRICS_FLUSH_S
    while True:
        samples = client.scrape()
        got = {(dict(k)["method"], dict(k)["route"], dict(k)["status"]): v
               for k, v in series(samples, "h3batch_http_requests_total").items()
               if dict(k)["route"] not in UNCOUNTED_ROUTES}
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == expected
    assert value(samples, "h3batch_http_requests_total", method="GET", route="/metrics", status="200") >= 1
    totals: Counter[tuple[str, str]] = Counter()
    for (method, route, _), n in client.sent.items():
        totals[(method, route)] += n
    for (method, route), total in totals.items():
        name = "h3batch_http_request_duration_seconds"
        assert value(samples, name + "_count", method=method, route=route) == total
        assert value(samples, name + "_bucket", method=method, route=route, le="+Inf") == total
        assert value(samples, name + "_sum", method=method, route=route) > 0


def test_queue_depth_and_workers_mid_render_and_after(scenario):
    mid = scenario["mid"]
    assert value(mid, "h3batch_jobs_running") == 1
    assert value(mid, "h3batch_workers", state="BUSY") == 1 and value(mid, "h3batch_workers", state="READY") == 0
    samples = scenario["client"].scrape()
    assert value(samples, "h3batch_workers", state="READY") == 1 and value(samples, "h3batch_workers",
                                                                           state="BUSY") == 0
    assert value(samples, "h3batch_queue_depth", queue="render") == 0
    assert value(samples, "h3batch_queue_depth", queue="loadrunner") == 1  # no sweep worker runs here


def test_batches_by_status_through_the_batch_api(stack):
    """A batch submitted where no worker beats (another Redis DB, the app in-process): it stays `queued` with every
    item held; once the feeder releases one item (as a worker's heartbeat would, given one free slot) it is
    `in_progress`; cancelled, it finishes and moves to the finished counter."""
    from h3batch.api import create_app  # noqa: PLC0415
    from h3batch.core import batches  # noqa: PLC0415

    url = _other_db(stack)
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    client = create_app({"REDIS_URL": url, "METRICS_TOKEN": None}).test_client()

    def scrape() -> dict:
        reply = client.get("/metrics")
        assert reply.status_code == 200, reply.get_data(as_text=True)
        return parse(reply.get_data(as_text=True))

    made = client.post("/batches", json={"requests": [{"prompt": "a fox", **SMALL}, {"prompt": "a hen", **SMALL}]})
    assert made.status_code == 202, made.get_json()
    batch_id = made.get_json()["id"]
    samples = scrape()
    assert value(samples, "h3batch_batches", status="queued") == 1
    assert value(samples, "h3batch_batches", status="in_progress") == 0
    assert value(samples, "h3batch_batches_created_total") == 1
    assert value(samples, "h3batch_jobs_total", status="queued") == 2  # its items, created queued (held)
    sent: list[str] = []
    assert len(batches.feed(r, sent.append, capacity=1)) == 1 and len(sent) == 1
    samples = scrape()
    assert value(samples, "h3batch_batches", status="queued") == 0
    assert value(samples, "h3batch_batches", status="in_progress") == 1
    assert client.post(f"/batches/{batch_id}/cancel").status_code in (200, 202)
    samples = scrape()
    assert value(samples, "h3batch_batches", status="in_progress") == 0
    assert value(samples, "h3batch_batches_finished_total", status="cancelled") == 1
    assert value(samples, "h3batch_batches_finished_total", status="completed") == 0
    assert value(samples, "h3batch_jobs_total", status="cancelled") == 2
    r.flushdb()
    r.close()


def test_last_finished_sweep_results(stack, scenario):
    r = redis.Redis.from_url(stack["redis_url"], decode_responses=True)
    points = [{"id": "s1-f6-r1", "sessions": 1, "load_frames": 6, "repetition": 1, "status": "passed", "ok": True,
               "passed_sessions": 1, "requested_sessions": 1,
               "aggregates": {"client_send_lateness_p99_ms": {"max": 4.0}, "client_first_audio_ms": {"median": 250.0},
                              "client_stream_rtf": {"median": 0.5}}},
              {"id": "s2-f6-r1", "sessions": 2, "load_frames": 6, "repetition": 1, "status": "failed", "ok": False,
               "passed_sessions": 1, "requested_sessions": 2, "aggregates": {}}]
    rows = [summary_row(p) for p in points]
    sweep_store.create_sweep(r, "sw_00000000000000f1", {"url": "ws://127.0.0.1:9/"}, [p["id"] for p in points], "api")
    sweep_store.update_record(r, "sw_00000000000000f1", status="done", finished_at="2026-01-02T03:04:05Z",
                              summary={"points": rows, "capacity_sessions": {"6": 1}})
    r.close()
    samples = scenario["client"].scrape()
    assert value(samples, "h3batch_sweep_last_info", sweep_id="sw_00000000000000f1", status="done", origin="api") == 1
    assert value(samples, "h3batch_sweep_last_finished_timestamp_seconds") == calendar.timegm((2026, 1, 2, 3, 4, 5))
    assert series(samples, "h3batch_sweep_last_points") == {frozenset({("status", "passed")}): 1,
                                                            frozenset({("status", "failed")}): 1}
    assert value(samples, "h3batch_sweep_last_capacity_sessions", load_frames="6") == 1
    first = {"point_id": "s1-f6-r1", "sessions": "1", "load_frames": "6"}
    assert value(samples, "h3batch_sweep_last_point_ok", **first) == 1
    assert value(samples, "h3batch_sweep_last_point_ok", point_id="s2-f6-r1", sessions="2", load_frames="6") == 0
    assert math.isclose(value(samples, "h3batch_sweep_last_point_send_lateness_p99_seconds", **first), 0.004)
    assert math.isclose(value(samples, "h3batch_sweep_last_point_first_audio_seconds", **first), 0.25)
    assert value(samples, "h3batch_sweep_last_point_client_stream_rtf", **first) == 0.5


def test_the_token_is_required_when_set(stack):
    url = stack["api"].base + "/metrics"
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}):
        reply = requests.get(url, headers=headers, timeout=60)
        assert reply.status_code == 401, (headers, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "unauthorized" and error["retryable"] is False and error["message"]
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60).status_code == 200
    documented = requests.get(stack["api"].base + "/openapi.json", timeout=60).json()["paths"]["/metrics"]["get"]
    assert {"200", "401", "403"} <= set(documented["responses"])


def test_without_a_token_only_loopback_clients_may_scrape(stack):
    url = stack["open_api"].base + "/metrics"
    reply = requests.get(url, timeout=60)
    assert reply.status_code == 200 and "h3batch_jobs_total" in reply.text
    # its help says it counts transitions, not jobs (issue 30): a requeued job counts twice in queued
    assert "# HELP h3batch_jobs_total Transitions into each status, not a count of jobs" in reply.text
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):  # a proxy on this host: not a loopback client
        reply = requests.get(url, headers={header: "203.0.113.7"}, timeout=60)
        assert reply.status_code == 403, reply.text
        assert reply.json()["error"]["code"] == "forbidden"
    assert requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60).status_code == 200


def _other_db(stack) -> str:
    """The stack's Redis, another DB: in-process apps count their requests there, not among the scenario's."""
    return stack["redis_url"].rsplit("/", 1)[0] + "/1"


def test_peer_addresses_decide_the_open_endpoint(stack):
    """The same app in-process: its WSGI peer address is the one gunicorn passes (a test may reach only loopback
    over TCP, so the non-loopback peers are set in the WSGI environ)."""
    from h3batch.api import create_app  # noqa: PLC0415

    app = create_app({"REDIS_URL": _other_db(stack), "METRICS_TOKEN": None})
    client = app.test_client()
    for peer, status in (("127.0.0.1", 200), ("127.8.9.10", 200), ("::1", 200), ("::ffff:127.0.0.1", 200),
                         ("10.0.0.5", 403), ("192.168.1.2", 403), ("2001:db8::1", 403), ("", 403)):
        assert client.get("/metrics", environ_base={"REMOTE_ADDR": peer}).status_code == status, peer


def test_api_keys_do_not_open_metrics_and_metrics_needs_no_key(stack):
    from h3batch.api import create_app  # noqa: PLC0415

    app = create_app({"REDIS_URL": _other_db(stack), "API_KEYS": ["a-job-key"], "METRICS_TOKEN": TOKEN})
    client = app.test_client()
    assert client.get("/metrics", headers={"Authorization": "Bearer a-job-key"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401


def test_a_scrape_while_redis_is_down_is_a_503_with_the_error_body():
    """Nothing listens on the port: the scrape answers 503 storage_unavailable (retryable), and the request counts
    it could not flush are kept for later rather than lost or raised into other requests."""
    from h3batch.api import create_app  # noqa: PLC0415
    from tests.conftest import free_port  # noqa: PLC0415

    client = create_app({"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "METRICS_TOKEN": None}).test_client()
    assert client.get("/healthz").status_code == 200  # counted in memory; never waits on Redis
    reply = client.get("/metrics")
    assert reply.status_code == 503, reply.get_data(as_text=True)
    error = reply.get_json()["error"]
    assert error["code"] == "storage_unavailable" and error["retryable"] is True
