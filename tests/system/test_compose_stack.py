"""`docker compose up` for real (`make test-compose`, not in `make test`): the images built from the lock, the whole
stack of docker-compose.yml + docker/compose.cpu.yml on this machine's engine (docker/compose-host.sh picks Docker or
podman and makes the base image when no registry answers), then, through the published API port only:

- /readyz answers 200 once model-init has filled the model volume and the worker beats;
- one job: POST /jobs, wait, download the MP4, PyAV decodes its video and audio;
- one batch of 3, every item completed;
- one load sweep: beat's `reference-smoke` against the reference duplex server, with its stored result and plot;
- the worker container killed (SIGKILL) mid-render and started again: the job completes, with one `completed`
  event;
- `compose down -v`: no container, volume or network of the project is left.

Prints one JSON line with the time of each phase. The project name is `h3batch-test`, so a user's own `h3batch`
stack is left alone.
"""
from __future__ import annotations

import io
import json
import os
import secrets
import shlex
import subprocess
import time
from pathlib import Path

import av
import pytest
import requests

from tests.service_stack import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600),
              pytest.mark.skipif(os.environ.get("H3BATCH_COMPOSE") != "1",
                                 reason="builds images and runs containers (minutes): `make test-compose`")]

PROJECT = "h3batch-test"
ENV_FILE = REPO / "var" / "compose" / "env"
SMALL = {"width": 128, "height": 32, "seconds": 4}


def read_env(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if "=" in line]
    return {key: value for key, value in pairs}


class Stack:
    def __init__(self, tmp: Path):
        host = read_env(ENV_FILE)
        self.engine = host["ENGINE"]
        self.key = "h3b-compose-" + secrets.token_hex(12)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **{k: v for k, v in host.items() if k not in ("ENGINE", "COMPOSE")},
                    "H3BATCH_API_KEYS": self.key, "H3BATCH_API_PORT": str(self.port)}
        # The test's own override: render steps slowed so that the kill lands mid-render (the worker's debug knob).
        override = tmp / "compose.test.yml"
        override.write_text("services:\n  gpu-worker:\n    environment:\n      H3BATCH_DEBUG_STEP_DELAY_S: \"0.5\"\n")
        self.compose = [*shlex.split(host["COMPOSE"]), "-p", PROJECT, "-f", str(REPO / "docker-compose.yml"),
                        "-f", str(REPO / "docker" / "compose.cpu.yml"), "-f", str(override)]

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.compose, *args], cwd=REPO, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                                 f"{done.stderr[-3000:]}")
        return done

    def engine_out(self, *args: str) -> str:
        return subprocess.run([self.engine, *args], env=self.env, capture_output=True, text=True, timeout=120,
                              check=True).stdout

    def project_objects(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={PROJECT}"
        if self.engine == "podman":
            label = f"label=io.podman.compose.project={PROJECT}"
        return {
            "containers": self.engine_out("ps", "-a", "-q", "--filter", label).split(),
            "volumes": [v for v in self.engine_out("volume", "ls", "-q").split() if v.startswith(f"{PROJECT}_")],
            "networks": [n for n in self.engine_out("network", "ls", "--format", "{{.Name}}").split()
                         if n.startswith(f"{PROJECT}_")],
        }

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.base + path, headers=self.headers(), timeout=30, **kw)

    def redis(self, *command: str) -> str:
        return self.run("exec", "-T", "redis", "redis-cli", *command).stdout


def wait_for(what: str, probe, timeout_s: float, interval_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except requests.RequestException as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def decode(mp4: bytes) -> tuple[int, int]:
    """(video frames, audio frames) PyAV decodes from the MP4."""
    with av.open(io.BytesIO(mp4)) as container:
        video = sum(1 for _ in container.decode(video=0))
    with av.open(io.BytesIO(mp4)) as container:
        audio = sum(1 for _ in container.decode(audio=0))
    return video, audio


def finished(stack: Stack, job_id: str, timeout_s: float = 900) -> dict:
    def probe():
        job = stack.get(f"/jobs/{job_id}").json()
        return job if job["status"] in ("completed", "failed", "cancelled", "expired") else None
    return wait_for(f"job {job_id} finished", probe, timeout_s)


def completed_events(stack: Stack, job_id: str) -> int:
    return stack.redis("XRANGE", f"h3b:events:{job_id}", "-", "+").split().count("completed")


def test_compose_stack_end_to_end(tmp_path):
    times: dict[str, float] = {}
    stack = Stack(tmp_path)
    mark = time.monotonic()
    stack.run("build", timeout=3600)
    times["build_s"] = time.monotonic() - mark
    try:
        mark = time.monotonic()
        stack.run("up", "-d", timeout=900)
        wait_for("/readyz 200", lambda: requests.get(stack.base + "/readyz", timeout=5).status_code == 200, 900)
        times["up_to_ready_s"] = time.monotonic() - mark

        mark = time.monotonic()
        reply = requests.post(stack.base + "/jobs", json={"prompt": "rain on a tin roof", **SMALL},
                              headers=stack.headers(), timeout=30)
        assert reply.status_code == 202, reply.text
        job = finished(stack, reply.json()["id"])
        assert job["status"] == "completed", job
        content = stack.get(f"/jobs/{job['id']}/content")
        assert content.status_code == 200 and content.headers["Content-Type"] == "video/mp4"
        video_frames, audio_frames = decode(content.content)
        assert video_frames > 0 and audio_frames > 0
        times["job_s"] = time.monotonic() - mark

        mark = time.monotonic()
        reply = requests.post(stack.base + "/batches", headers=stack.headers(), timeout=30,
                              json={"requests": [{"prompt": f"clip {i}: wind over a field", **SMALL, "seed": i}
                                                 for i in range(3)]})
        assert reply.status_code == 202, reply.text
        batch = wait_for("batch finished", lambda: (b := stack.get(f"/batches/{reply.json()['id']}").json())
                         ["finished_at"] and b, 1800, 2.0)
        assert batch["status"] == "completed" and batch["counts"]["completed"] == 3, batch
        times["batch_of_3_s"] = time.monotonic() - mark

        mark = time.monotonic()
        sweep = wait_for("the scheduled reference sweep finished",
                         lambda: next((s for s in stack.get("/sweeps").json()["sweeps"]
                                       if s["status"] in ("done", "failed")), None), 900, 2.0)
        assert sweep["status"] == "done", sweep
        links = stack.get(f"/sweeps/{sweep['id']}").json()["links"]
        assert links.get("plots") and links.get("reports"), links
        for link in [links["summary_json"], *links["reports"].values()]:
            got = stack.get(link)
            assert got.status_code == 200 and got.json(), link
        for link in links["plots"].values():
            got = stack.get(link)
            assert got.status_code == 200 and got.content.startswith(b"\x89PNG"), link
        times["sweep_s"] = time.monotonic() - mark

        mark = time.monotonic()
        reply = requests.post(stack.base + "/jobs", json={"prompt": "a kettle whistles", **SMALL, "seed": 7},
                              headers=stack.headers(), timeout=30)
        assert reply.status_code == 202, reply.text
        job_id = reply.json()["id"]
        wait_for("job rendering", lambda: stack.get(f"/jobs/{job_id}").json().get("stage") == "denoise", 600, 0.2)
        stack.run("kill", "gpu-worker")
        stack.run("start", "gpu-worker")
        job = finished(stack, job_id)
        assert job["status"] == "completed", job
        assert job["attempt"] >= 2, job  # the killed attempt did not finish it; a later one did
        assert completed_events(stack, job_id) == 1
        assert decode(stack.get(f"/jobs/{job_id}/content").content)[0] > 0
        times["worker_kill_s"] = time.monotonic() - mark
    finally:
        mark = time.monotonic()
        logs = stack.run("logs", "--tail", "40", check=False)
        (tmp_path / "compose.log").write_text(logs.stdout + logs.stderr)
        stack.run("down", "-v", timeout=600)
        times["down_s"] = time.monotonic() - mark
        print(json.dumps({"compose_times": {k: round(v, 1) for k, v in times.items()}}))
    left = stack.project_objects()
    assert left == {"containers": [], "volumes": [], "networks": []}, left
