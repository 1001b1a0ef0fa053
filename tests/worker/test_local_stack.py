"""`h3batch demo` and `h3batch serve` as a user runs them: real subprocesses, real HTTP, and nothing left running
afterwards. Each uses its own Redis DB so the session worker never takes their jobs."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import av
import redis
import requests

from tests.service_stack import H3BATCH, REPO, free_port, service_env


def local_env(redis_url: str, db: int, tmp_path, tiny_release) -> dict[str, str]:
    env = service_env(redis_url.rsplit("/", 1)[0] + f"/{db}", tmp_path / "var" / "artifacts",
                      H3BATCH_RELEASE=str(tiny_release), H3BATCH_HF_CACHE=str(tiny_release.parent / "hf-cache"),
                      H3BATCH_DEVICE="cpu")
    return env


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_demo_renders_out_demo_mp4_and_stops_everything(redis_url, tiny_release, tmp_path):
    """`h3batch demo` posts a job over HTTP, shows stage/step progress, writes a decodable out/demo.mp4, prints the
    completed job JSON, and leaves no API port open and no worker heartbeat behind."""
    env = local_env(redis_url, 4, tmp_path, tiny_release)
    done = subprocess.run(H3BATCH + ["demo", "--width", "128", "--height", "32"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "denoise 8/8" in done.stdout or "denoise" in done.stdout
    job = json.loads(done.stdout[done.stdout.index("\n{") + 1:])
    assert job["status"] == "completed" and job["seed"] == 42
    with av.open(str(tmp_path / "out" / "demo.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == job["frames"]
    port = int(re.search(r"API on http://127\.0\.0\.1:(\d+)", done.stdout).group(1))
    assert port_closed(port)
    r = redis.Redis.from_url(env["H3BATCH_REDIS_URL"], decode_responses=True)
    assert list(r.scan_iter("h3b:worker:*")) == []


def test_serve_runs_until_interrupted_then_stops_its_children(redis_url, tiny_release, tmp_path):
    """`h3batch serve` becomes ready (a worker heartbeat counted by /readyz) and on SIGINT stops API and worker,
    also when it was started with SIGINT ignored, as a background job of a script or a CI step inherits it (Python
    then never raises KeyboardInterrupt by itself; a loaded `make test` launched that way saw serve outlive SIGINT)."""
    env = local_env(redis_url, 5, tmp_path, tiny_release)
    port = free_port()
    ignoring_sigint = ["sh", "-c", 'trap "" INT; exec "$@"', "sh"]  # exec: proc.pid is serve itself
    proc = subprocess.Popen(ignoring_sigint + H3BATCH + ["serve", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: list[str] = []
    guard = threading.Timer(600, proc.kill)  # a hang guard, not a timing assertion: a wedged serve ends the test
    guard.start()
    try:
        for line in proc.stdout:  # the event: serve prints "ready:" once /readyz counts a worker heartbeat
            seen.append(line)
            if line.startswith("h3batch: ready: "):
                break
        assert proc.poll() is None, "serve exited before it was ready:\n" + "".join(seen)
        assert requests.get(f"http://127.0.0.1:{port}/readyz", timeout=60).status_code == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)  # a hang guard; 120 s was outrun under the core-0 hog
        output = "".join(seen) + rest
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert "ready: http://127.0.0.1" in output and "stopped" in output
    assert port_closed(port)
    r = redis.Redis.from_url(env["H3BATCH_REDIS_URL"], decode_responses=True)
    assert list(r.scan_iter("h3b:worker:*")) == []


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_serve_runs_its_own_persistent_redis_and_restarts_a_killed_worker_and_api(tiny_release, tmp_path):
    """`h3batch serve` with H3BATCH_REDIS_URL unset starts its own redis-server under var/redis with AOF on (never
    the Redis on 6379), and keeps the stack up: after kill -9 of the worker mid-render and then of the API, each is
    started again, and every queued job completes once; SIGINT then stops everything."""
    env = local_env("redis://unused/0", 0, tmp_path, tiny_release)
    del env["H3BATCH_REDIS_URL"]
    env.update(H3BATCH_LEASE_TTL_S="3", H3BATCH_RECONCILE_INTERVAL_S="0.5", H3BATCH_DEBUG_STEP_DELAY_S="0.2")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.out").open("w")
    proc = subprocess.Popen(H3BATCH + ["serve", "--port", str(port)], cwd=tmp_path, env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def output() -> str:
        return (tmp_path / "serve.out").read_text()

    def all_completed() -> dict | None:
        try:
            seen = {i: requests.get(f"{base}/jobs/{i}", timeout=60).json()["status"] for i in ids}
        except requests.RequestException:  # the restarted API is still binding its port
            return None
        return seen if set(seen.values()) == {"completed"} else None

    try:
        _wait(lambda: "ready: http" in output() or proc.poll() is not None, 180, "serve ready")
        assert proc.poll() is None, output()
        redis_port = int(re.search(r"private redis-server on 127\.0\.0\.1:(\d+)", output()).group(1))
        r = redis.Redis(port=redis_port, decode_responses=True)
        assert r.config_get("appendonly")["appendonly"] == "yes"
        assert r.config_get("dir")["dir"] == str((tmp_path / "var" / "redis").resolve())
        ids = [requests.post(f"{base}/jobs", json={"prompt": f"rain {i}", "width": 128, "height": 32},
                             timeout=60).json()["id"] for i in range(3)]
        _wait(lambda: r.hget(f"h3b:job:{ids[0]}", "stage") == "denoise", 60, "the first job to be rendering")
        worker_pid = int(re.findall(r"worker started pid=(\d+)", output())[-1])
        os.killpg(worker_pid, signal.SIGKILL)
        _wait(lambda: len(re.findall(r"worker started pid=", output())) == 2, 30, "the worker restarted")
        api_pid = int(re.findall(r"api started pid=(\d+)", output())[-1])
        os.killpg(api_pid, signal.SIGKILL)
        _wait(lambda: len(re.findall(r"api started pid=", output())) == 2, 30, "the API restarted")
        _wait(all_completed, 180, "every job completed")
        assert all(sum(1 for _, f in r.xrange(f"h3b:events:{i}") if f["event"] == "completed") == 1 for i in ids)
        assert r.hget(f"h3b:job:{ids[0]}", "attempt") == "2"  # the killed render ran again, once
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)  # a hang guard; 60 s was outrun under the core-0 hog
    finally:
        if proc.poll() is None:  # SIGINT first: serve stops its children (each in its own session) itself
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    assert proc.returncode == 0, output()[-3000:]
    assert port_closed(port) and port_closed(redis_port)
