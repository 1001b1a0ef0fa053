"""Sweeps end to end: API → real Redis → real `h3batch sweep-worker` → reference server subprocess → records,
summary JSON/CSV and PNG plots; the single-beat lock with a scheduled sweep; request validation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from h3batch.api import create_app
from h3batch.loadrunner.sweep_settings import SweepSettings
from h3batch.loadrunner.config import build_parser
from h3batch.loadrunner.sweep_spec import driver_argv, parse_sweep_request, points
from h3batch.loadrunner.sweep_store import BEAT_LOCK_KEY, create_sweep, get_sweep
from tests.loadrunner.harness import REPO_ROOT, start_server_process, stop_process

H3BATCH = str(Path(sys.executable).parent / "h3batch")
SMALL = {"sessions": [1, 2], "load_frames": [6], "drain_s": 0.3, "tail_s": 0.0, "timeout_s": 5.0,
         "cleanup_timeout_s": 1.0, "min_voiced_frames": 1, "minimum_audio_chunks": 1,
         "labels": {"server_revision": "reference", "server_hardware": "cpu-loopback"}}


@pytest.fixture(scope="module")
def reference_url():
    proc, url = start_server_process(["--mode", "realtime", "--port", "0", "--max-sessions", "8"])
    yield url
    stop_process(proc)


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sweep-results")


@pytest.fixture(scope="module")
def sweep_env(redis_url, results_dir) -> dict:
    return {**os.environ, "H3BATCH_REDIS_URL": redis_url, "H3BATCH_SWEEP_RESULTS_DIR": str(results_dir)}


@pytest.fixture(scope="module")
def worker(sweep_env, redis_url):
    """A real `h3batch sweep-worker` process on a flushed Redis."""
    redis.Redis.from_url(redis_url).flushdb()
    proc = subprocess.Popen([H3BATCH, "sweep-worker", "--without-gossip", "--without-mingle"], env=sweep_env,
                            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc
    stop_process(proc)


@pytest.fixture
def client(redis_url, results_dir):
    app = create_app({"TESTING": True, "REDIS_URL": redis_url, "API_KEYS": [],
                      "SWEEP_RESULTS_DIR": str(results_dir), "SWEEP_ALLOW_LOOPBACK": True})
    return app.test_client()


def wait_done(client, sweep_id: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = client.get(f"/sweeps/{sweep_id}").get_json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.25)
    pytest.fail(f"sweep {sweep_id} did not finish in {timeout} s: {body}")


def test_sweep_end_to_end(worker, client, reference_url, redis_url, results_dir):
    """POST /sweeps runs one load per point through the worker, stores records, summary, reports and plots."""
    created = client.post("/sweeps", json={**SMALL, "url": reference_url})
    assert created.status_code == 202, created.get_json()
    sweep_id = created.get_json()["id"]
    assert created.headers["Location"].endswith(f"/sweeps/{sweep_id}")
    body = wait_done(client, sweep_id)
    assert body["status"] == "done", body
    assert [p["id"] for p in body["points"]] == ["n01-f6-r0", "n02-f6-r0"]
    for point in body["points"]:
        assert point["status"] == "passed" and point["ok"] is True and point["exit_status"] == 0
        assert point["passed_sessions"] == point["sessions"]
        assert point["aggregates"]["client_send_lateness_p99_ms"]["count"] == point["sessions"]
        report_path = Path(point["report_path"])
        assert report_path.parent == results_dir / sweep_id / point["id"]
        assert json.loads(report_path.read_text())["reported_server"] == {"revision": "reference",
                                                                          "hardware": "cpu-loopback"}
    rows = body["summary"]["points"]
    assert all(r["send_lateness_p99_ms"] is not None and r["first_audio_ms"] is not None
               and r["client_stream_rtf"] is not None for r in rows)
    assert body["summary"]["capacity_sessions"] == {"6": 2}
    plot = client.get(body["links"]["plots"]["send_lateness_p99"])
    assert plot.status_code == 200 and plot.data.startswith(b"\x89PNG")
    report = client.get(body["links"]["reports"]["n02-f6-r0"])
    assert report.status_code == 200 and report.get_json()["requested_sessions"] == 2
    summary_file = json.loads((results_dir / sweep_id / "summary.json").read_text())
    assert summary_file == body["summary"]
    assert (results_dir / sweep_id / "summary.csv").read_text().startswith("point_id,sessions")
    r = redis.Redis.from_url(redis_url)
    assert r.exists(f"h3batch:sweep:{sweep_id}") and r.hlen(f"h3batch:sweep:{sweep_id}:points") == 2
    assert r.zscore("h3batch:sweeps", sweep_id) is not None
    listed = client.get("/sweeps").get_json()["sweeps"]
    assert sweep_id in [s["id"] for s in listed]


def test_existing_report_is_ingested_not_rerun(redis_url, results_dir, tmp_path):
    """A point directory that already holds load-result.json is ingested; the dead server URL is never dialled."""
    from h3batch.loadrunner.sweep_tasks import execute_point

    request = parse_sweep_request({**SMALL, "url": "ws://127.0.0.1:9/v1/realtime", "sessions": [1]})
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    create_sweep(r, "sw_00000000000000aa", request.to_dict(), [p.id for p in points(request)], "test")
    point_dir = results_dir / "sw_00000000000000aa" / "n01-f6-r0"
    point_dir.mkdir(parents=True)
    stored = {"ok": True, "requested_sessions": 1, "passed_sessions": 1, "sessions": [
        {"index": 0, "ok": True, "client_send_lateness_ms": {"p99": 1.5, "median": 0.5}, "client_stream_rtf": 1.1}]}
    (point_dir / "load-result.json").write_text(json.dumps(stored))
    settings = SweepSettings(redis_url=redis_url, results_dir=results_dir)
    entry = execute_point(settings, r, "sw_00000000000000aa", "n01-f6-r0")
    assert entry["ingested"] is True and entry["status"] == "passed"
    assert entry["aggregates"]["client_send_lateness_p99_ms"] == {"count": 1, "median": 1.5, "max": 1.5}
    assert get_sweep(r, "sw_00000000000000aa")["points"][0]["status"] == "passed"


@pytest.mark.parametrize("body,fragment", [
    ({"url": "http://x", "sessions": [1]}, "`url` must be a ws:// or wss:// URL"),
    ({"url": "ws://x", "sessions": [0]}, "`sessions` values must be in [1,64]"),
    ({"url": "ws://x", "sessions": [1], "timeout_s": 0}, "timeout_s must be finite and non-negative"),
    ({"url": "ws://x", "sessions": [1], "bogus": 1}, "unknown sweep fields: ['bogus']"),
    ({"url": "ws://x", "sessions": [1], "repetitions": 99}, "`repetitions` must be in [1,16]"),
    # a value argparse would read as an option (not a plain negative number): it used to exit the API process
    ({"url": "ws://x", "sessions": [1], "tail_s": -1e16}, "tail_s must be finite and non-negative"),
])
def test_invalid_sweep_is_refused(client, body, fragment):
    """Bad grids get 400 invalid_sweep with the reason, before anything is queued."""
    response = client.post("/sweeps", json=body)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["code"] == "invalid_sweep" and fragment in error["message"] and error["retryable"] is False


def test_dash_leading_values_reach_the_driver_as_values():
    """A model, label or digest starting with `-` is a value of its option, not an option of the driver."""
    request = parse_sweep_request({"url": "ws://x", "sessions": [1], "model": "-m", "expected_input_sha256": "-d",
                                   "labels": {"server_revision": "-r", "server_hardware": "-h"}})
    args = build_parser().parse_args(driver_argv(request, points(request)[0], "-in.wav", "-out"))
    assert (args.model, args.expected_input_sha256, args.server_revision, args.server_hardware, args.input_wav,
            args.output_dir) == ("-m", "-d", "-r", "-h", "-in.wav", "-out")


def test_unknown_sweep_and_file(client):
    """Unknown sweeps and files answer 404 in the JSON error shape."""
    assert client.get("/sweeps/sw_0123456789abcdef").get_json()["error"]["code"] == "sweep_not_found"
    assert client.get("/sweeps/../etc").status_code == 404
    missing = client.get("/sweeps/sw_0123456789abcdef/files/summary.json")
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "sweep_not_found"


def test_single_beat_and_scheduled_sweep(worker, sweep_env, reference_url, redis_url, client, tmp_path):
    """`h3batch beat` takes the lock and fires its schedule; a second beat exits 1 with one line; exit releases."""
    schedule = [{"name": "smoke", "every_s": 3600, "run_on_start": True,
                 "sweep": {**SMALL, "url": reference_url, "sessions": [1], "load_frames": [4]}}]
    env = {**sweep_env, "H3BATCH_SWEEP_SCHEDULE": json.dumps(schedule), "H3BATCH_BEAT_LOCK_TTL_S": "6",
           "H3BATCH_BEAT_SCHEDULE_FILE": str(tmp_path / "beat-schedule")}
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    first = subprocess.Popen([H3BATCH, "beat"], env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not r.exists(BEAT_LOCK_KEY) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.exists(BEAT_LOCK_KEY)
        second = subprocess.run([H3BATCH, "beat"], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1].startswith("h3batch beat: another beat instance holds")
        deadline = time.monotonic() + 90
        scheduled = []
        while time.monotonic() < deadline:
            scheduled = [s for s in client.get("/sweeps").get_json()["sweeps"] if s["origin"] == "schedule:smoke"]
            if scheduled and scheduled[0]["status"] == "done":
                break
            time.sleep(0.25)
        assert scheduled and scheduled[0]["status"] == "done", scheduled
        assert client.get(f"/sweeps/{scheduled[0]['id']}").get_json()["points"][0]["status"] == "passed"
    finally:
        stop_process(first)
    assert not r.exists(BEAT_LOCK_KEY)


def wait_until(predicate, timeout_s: float, what: str):
    """Poll `predicate` until it returns something truthy (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


def test_beat_lock_renewed_expires_after_kill_and_never_taken_from_another(sweep_env, redis_url, tmp_path):
    """A running beat keeps its lock (same token) over several expiries; killed with SIGKILL it leaves the lock,
    which expires so the next beat takes it; a beat that finds another token in the lock stops itself and leaves
    that token in place."""
    ttl_s = 3
    env = {**sweep_env, "H3BATCH_SWEEP_SCHEDULE": "", "H3BATCH_BEAT_LOCK_TTL_S": str(ttl_s),
           "H3BATCH_BEAT_SCHEDULE_FILE": str(tmp_path / "beat-schedule")}
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    r.delete(BEAT_LOCK_KEY)
    beats = []

    def start_beat(log: Path) -> tuple[subprocess.Popen, str]:
        with log.open("w") as stderr:
            proc = subprocess.Popen([H3BATCH, "beat"], env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                                    stderr=stderr)
        beats.append(proc)
        token = wait_until(lambda: (held := r.get(BEAT_LOCK_KEY)) and f":{proc.pid}:" in held and held, 60,
                           f"beat {proc.pid} taking the lock")
        return proc, token

    try:
        first, token = start_beat(tmp_path / "first.log")
        time.sleep(ttl_s * 3)  # three expiries' worth: only renewal keeps the key
        assert r.get(BEAT_LOCK_KEY) == token and 0 < r.pttl(BEAT_LOCK_KEY) <= ttl_s * 1000
        first.kill()
        first.wait(timeout=30)
        assert r.get(BEAT_LOCK_KEY) == token  # a killed holder cannot release: the expiry frees the lock
        wait_until(lambda: not r.exists(BEAT_LOCK_KEY), ttl_s + 30, "the dead beat's lock expiring")

        second, _ = start_beat(tmp_path / "second.log")
        # Celery's SIGTERM handler is in place once beat says it is starting; before that SIGTERM ends the process
        # without the release step this test also checks.
        wait_until(lambda: "beat: Starting" in (tmp_path / "second.log").read_text(), 60, "celery beat starting")
        r.set(BEAT_LOCK_KEY, "elsewhere:1:intruder", px=60_000)  # as if its lock had expired and been taken
        wait_until(lambda: second.poll() is not None, 60, "the beat that lost its lock stopping")
        assert r.get(BEAT_LOCK_KEY) == "elsewhere:1:intruder"
        log = (tmp_path / "second.log").read_text()
        assert f"beat lock {BEAT_LOCK_KEY} lost to elsewhere:1:intruder; stopping this beat" in log, log[-2000:]
        assert "was no longer ours at exit" in log, log[-2000:]
    finally:
        for proc in beats:
            stop_process(proc)
        r.delete(BEAT_LOCK_KEY)


def test_beat_refuses_invalid_schedule(sweep_env):
    """An invalid schedule stops `h3batch beat` with exit 2 and one line naming the variable."""
    env = {**sweep_env, "H3BATCH_SWEEP_SCHEDULE": '[{"name": "x", "sweep": {}}]'}
    result = subprocess.run([H3BATCH, "beat"], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == ("h3batch beat: H3BATCH_SWEEP_SCHEDULE is invalid: H3BATCH_SWEEP_SCHEDULE "
                                     "entry 0: expected exactly one of `every_s` or `cron`")


def test_compose_services_and_schedule():
    """The compose file has only services; the worker consumes only its queue; beat's schedule is a valid sweep
    aimed at the duplex-reference service's port."""
    import yaml

    from h3batch.loadrunner.sweep_settings import parse_schedule

    compose = yaml.safe_load((REPO_ROOT / "docker" / "compose.loadrunner.yml").read_text())
    assert list(compose) == ["services"]
    services = compose["services"]
    assert set(services) == {"duplex-reference", "loadrunner", "beat"}
    assert services["loadrunner"]["command"] == ["h3batch", "sweep-worker"]
    assert services["loadrunner"]["environment"]["H3BATCH_SWEEP_QUEUE"] == "loadrunner"
    server_cmd = services["duplex-reference"]["command"]
    port = server_cmd[server_cmd.index("--port") + 1]
    (entry,) = parse_schedule(services["beat"]["environment"]["H3BATCH_SWEEP_SCHEDULE"])
    request = parse_sweep_request(entry.sweep)
    assert request.url == f"ws://duplex-reference:{port}/v1/realtime" and entry.run_on_start
    assert int(server_cmd[server_cmd.index("--max-sessions") + 1]) >= max(request.sessions)


@pytest.mark.parametrize("code,absent", [
    ("import h3batch.api.sweeps; from h3batch.api import create_app; create_app({'TESTING': True})",
     ("torch", "numpy", "websockets")),
    ("import h3batch.loadrunner.celery_app, h3batch.loadrunner.sweep_tasks, h3batch.loadrunner.beat, "
     "h3batch.loadrunner.server", ("torch",)),
])
def test_import_footprint(code, absent):
    """The API blueprint stays free of torch/numpy/websockets, and the sweep Celery app never imports torch."""
    probe = f"import sys; {code}; print(','.join(m for m in {absent!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=REPO_ROOT, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_sweep_app_keeps_its_messages_out_of_the_gpu_apps_unacked_restore(redis_url):
    """The two Celery apps on one Redis DB (as compose and `make serve` run them): the sweep app's queue and its
    `unacked` hash carry its own key prefix, so the GPU app's restore of unacked messages by its short visibility
    timeout (2 x H3BATCH_MAX_RUN_S; 2 s here) never re-queues a long sweep point taken by a sweep worker."""
    from h3batch.core.celery_app import make_celery
    from h3batch.loadrunner.celery_app import KEY_PREFIX, make_app

    url = redis_url.rsplit("/", 1)[0] + "/13"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    sweeps, gpu = make_app(SweepSettings(redis_url=url)), make_celery(url, max_run_s=1)
    try:
        sweeps.send_task("loadrunner.run_point", args=["sw_0000000000000000", "p0"], queue="loadrunner")
        assert r.llen(f"{KEY_PREFIX}loadrunner") == 1 and not r.exists("loadrunner")
        with sweeps.connection_for_read() as conn:
            taken = conn.default_channel.basic_get("loadrunner", no_ack=False)  # a sweep worker took the point
            assert taken is not None
            assert r.hlen(f"{KEY_PREFIX}unacked") == 1 and not r.exists("unacked")
            time.sleep(2.5)
            with gpu.connection_for_read() as gpu_conn:
                gpu_conn.default_channel.qos.restore_visible()  # what every GPU worker runs at start and shutdown
            assert r.llen(f"{KEY_PREFIX}loadrunner") == 0 and r.hlen(f"{KEY_PREFIX}unacked") == 1
        assert sweeps.conf.task_time_limit and sweeps.conf.task_time_limit < \
            sweeps.conf.broker_transport_options["visibility_timeout"]
    finally:
        sweeps.close(), gpu.close()
        r.flushdb()
        r.close()


def test_a_redelivered_point_is_not_run_twice(redis_url):
    """The re-run guard of `run_point`: the first delivery of a point claims it; a second one (broker restore,
    duplicate message) while it runs is refused, and so is any delivery once the point has a finished record."""
    from h3batch.loadrunner.sweep_store import PointStatus, put_point
    from h3batch.loadrunner.sweep_tasks import claim_point

    r = redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/13", decode_responses=True)
    r.flushdb()
    try:
        create_sweep(r, "sw_00000000000000aa", {"url": "ws://127.0.0.1:1/"}, ["p0", "p1"], "test")
        assert claim_point(r, "sw_00000000000000aa", "p0") is True
        assert claim_point(r, "sw_00000000000000aa", "p0") is False  # running elsewhere
        put_point(r, "sw_00000000000000aa", {"id": "p1", "status": PointStatus.PASSED.value})
        assert claim_point(r, "sw_00000000000000aa", "p1") is False  # already measured
    finally:
        r.flushdb()
        r.close()


def _keyed_client(redis_url, results_dir, **config):
    url = redis_url.rsplit("/", 1)[0] + "/14"  # no sweep worker consumes here: nothing accepted is ever run
    app = create_app({"TESTING": True, "REDIS_URL": url, "API_KEYS": ["sweep-key-one", "sweep-key-two"],
                      "SWEEP_RESULTS_DIR": str(results_dir), **config})
    return app.test_client(), redis.Redis.from_url(url)


@pytest.mark.parametrize("url, allow, fragment", [
    ("ws://169.254.169.254/latest", {}, "link-local"),
    ("ws://[fe80::1]:8099/", {}, "link-local"),
    ("wss://metadata.google.internal/", {}, "metadata host"),
    ("ws://127.0.0.1:8099/v1/realtime", {}, "H3BATCH_SWEEP_ALLOW_LOOPBACK=1"),
    ("ws://[::1]:8099/v1/realtime", {}, "H3BATCH_SWEEP_ALLOW_LOOPBACK=1"),  # IPv6 loopback: the same flag
    ("ws://10.0.0.7:8099/", {}, "H3BATCH_SWEEP_ALLOW_PRIVATE=1"),
    ("ws://169.254.169.254/", {"SWEEP_ALLOW_LOOPBACK": True, "SWEEP_ALLOW_PRIVATE": True}, "link-local"),
    ("ws://user:pw@127.0.0.1:8099/", {"SWEEP_ALLOW_LOOPBACK": True}, "credentials"),
])
def test_sweep_targets_are_vetted_like_webhooks_at_submission(redis_url, results_dir, url, allow, fragment):
    """POST /sweeps refuses link-local, metadata, loopback (unless H3BATCH_SWEEP_ALLOW_LOOPBACK) and private
    (unless H3BATCH_SWEEP_ALLOW_PRIVATE) targets with 400 invalid_sweep, before any record or message exists; no
    sweep worker runs, so nothing is ever sent to them."""
    client, r = _keyed_client(redis_url, results_dir, **allow)
    r.flushdb()
    reply = client.post("/sweeps", json={**SMALL, "url": url}, headers={"Authorization": "Bearer sweep-key-one"})
    assert reply.status_code == 400, reply.get_json()
    error = reply.get_json()["error"]
    assert error["code"] == "invalid_sweep" and fragment in error["message"] and error["retryable"] is False
    # no record, index or message (rate buckets and request metrics are the API's own)
    assert [k for k in r.scan_iter() if not k.startswith((b"h3b:rate:", b"h3b:metrics:"))] == []
    r.close()


@pytest.mark.parametrize("name", ["/etc/passwd", "../secrets.wav", "inputs/voice.wav", "voice.mp3", ".hidden.wav"])
def test_input_wav_names_the_input_set_and_is_never_a_path(client, name):
    """`input_wav` must name a WAV file of the input set (H3BATCH_SWEEP_INPUTS_DIR); a server path is 400."""
    reply = client.post("/sweeps", json={**SMALL, "url": "ws://127.0.0.1:9/", "input_wav": name})
    assert reply.status_code == 400 and "input set" in reply.get_json()["error"]["message"]


def test_a_named_input_resolves_inside_the_input_set(tmp_path):
    """A valid name is looked up in the input set directory, never elsewhere."""
    settings = SweepSettings(results_dir=tmp_path / "results")
    assert parse_sweep_request({**SMALL, "url": "ws://x", "input_wav": "voice-1.wav"}).input_wav == "voice-1.wav"
    assert settings.input_set_dir == tmp_path / "results" / "inputs"


def test_sweeps_are_owned_by_the_key_that_created_them(redis_url, results_dir):
    """Key one's sweep is listed and readable by key one only; key two gets 404 for the record and its files and
    an empty list; a scheduled sweep (no owner) is visible to both."""
    client, r = _keyed_client(redis_url, results_dir, SWEEP_ALLOW_LOOPBACK=True)
    r.flushdb()
    one, two = ({"Authorization": f"Bearer sweep-key-{n}"} for n in ("one", "two"))
    created = client.post("/sweeps", json={**SMALL, "url": "ws://127.0.0.1:9/v1/realtime"}, headers=one)
    assert created.status_code == 202, created.get_json()
    sweep_id = created.get_json()["id"]
    assert client.get(f"/sweeps/{sweep_id}", headers=one).status_code == 200
    assert client.get(f"/sweeps/{sweep_id}", headers=two).get_json()["error"]["code"] == "sweep_not_found"
    assert client.get(f"/sweeps/{sweep_id}/files/summary.json", headers=two).status_code == 404
    assert [s["id"] for s in client.get("/sweeps", headers=one).get_json()["sweeps"]] == [sweep_id]
    assert client.get("/sweeps", headers=two).get_json()["sweeps"] == []
    create_sweep(r, "sw_00000000000000bb", {"url": "ws://x"}, [], "schedule:nightly")
    for headers in (one, two):
        assert "sw_00000000000000bb" in [s["id"] for s in client.get("/sweeps", headers=headers).get_json()["sweeps"]]
    r.flushdb()
    r.close()
