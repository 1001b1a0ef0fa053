"""The native MiniMax-H3 release behind a real API and a real Celery worker: t2va, fl2va (keyframes as multipart
files) and ref2va (references as data: URLs) render into decodable MP4s; OpenAI's `input_reference` is fl2va's first
keyframe; bad images get a 4xx naming the field and store nothing."""
from __future__ import annotations

import base64
import io
import json
import subprocess

import numpy as np
import openai
import pytest
import requests
from PIL import Image

from h3batch.core import keys
from h3batch.worker.h3.mp4 import probe_mp4
from tests.service_stack import REPO, poll_until  # noqa: I001
from tests.service_stack import H3BATCH, wait_batch
from tests.system.conftest import RedisServer, Stack

SIZE = {"width": 256, "height": 128, "seconds": 5}  # 5 s: the native release's shortest clip


def png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-stack")
    release = root / "native-release"
    done = subprocess.run(H3BATCH + ["build-tiny", "--kind", "native", "--out", str(release)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    server = RedisServer(root / "redis")
    server.start()
    made = Stack(root=root, release=release, redis=server)
    made.start_api()
    made.start_worker("native")
    yield made
    made.close()


def finished(stack: Stack, job_id: str) -> dict:
    return poll_until(stack.api.base, job_id, lambda j: j["status"] in ("completed", "failed", "cancelled"),
                      timeout_s=600)


def assert_clip(stack: Stack, job_id: str, tmp_path) -> None:
    job = finished(stack, job_id)
    assert job["status"] == "completed", job
    # The record counts the release's forwards (the tiny release's grid: 4 points, 3 forwards), not V2's 8.
    grid = json.loads((stack.release / "h3batch_sampling.json").read_text())["num_inference_steps"]
    assert job["step"] == job["total_steps"] == grid - 1, job
    body = requests.get(f"{stack.api.base}/jobs/{job_id}/content", timeout=30)
    assert body.status_code == 200
    out = tmp_path / f"{job_id}.mp4"
    out.write_bytes(body.content)
    info = probe_mp4(out)
    assert (info["video_codec"], info["width"], info["height"], info["frames"]) == ("h264", 256, 128, 124)


def test_the_heartbeat_advertises_the_native_kind_and_its_tasks(stack):
    beat = json.loads(stack.redis.client().get(keys.worker("native")))
    assert beat["release_kind"] == "native" and beat["tasks"] == ["t2va", "fl2va", "ref2va"]


def test_each_task_renders_a_decodable_mp4(stack, tmp_path):
    """t2va (JSON), fl2va (multipart: first and last keyframe files) and ref2va (JSON: two data: URLs) complete;
    the images are stored as PNG under <job>/inputs/ (keyframes at the canvas size)."""
    base = stack.api.base
    t2va = requests.post(f"{base}/jobs", json={"prompt": "a kettle whistles", **SIZE}, timeout=30)
    fl2va = requests.post(f"{base}/jobs", data={"prompt": "a fox runs", "task": "fl2va",
                                                **{k: str(v) for k, v in SIZE.items()}},
                          files={"first_frame": ("a.png", png(200, 120, 1), "image/png"),
                                 "last_frame": ("b.png", png(150, 200, 2), "image/png")}, timeout=30)
    ref2va = requests.post(f"{base}/jobs", json={"prompt": "<Picture 1> walks past <Picture 2>", "task": "ref2va",
                                                 "references": [data_url(png(64, 96, 3)), data_url(png(96, 64, 4))],
                                                 **SIZE}, timeout=30)
    for reply in (t2va, fl2va, ref2va):
        assert reply.status_code == 202, reply.text
    fl2va_dir = stack.artifacts / fl2va.json()["id"] / "inputs"
    assert sorted(p.name for p in fl2va_dir.iterdir()) == ["first_frame.png", "last_frame.png"]
    assert all(Image.open(p).size == (256, 128) for p in fl2va_dir.iterdir())
    refs = stack.artifacts / ref2va.json()["id"] / "inputs"
    assert sorted(p.name for p in refs.iterdir()) == ["reference-0.png", "reference-1.png"]
    for reply in (t2va, fl2va, ref2va):
        assert_clip(stack, reply.json()["id"], tmp_path)


def test_the_openai_sdk_sends_input_reference_and_gets_a_clip(stack, tmp_path):
    """`input_reference` (a file, as the SDK sends it) becomes fl2va's first keyframe; the clip downloads."""
    sdk = openai.OpenAI(base_url=f"{stack.api.base}/v1", api_key="none", max_retries=0, timeout=30)
    video = sdk.videos.create(prompt="the lighthouse beam sweeps", size="256x128", seconds="8",
                              input_reference=("ref.png", png(300, 160, 5), "image/png"))
    record = stack.redis.client().hgetall(keys.job(video.id))
    assert record["task"] == "fl2va" and "first_frame" in json.loads(record["inputs"])
    job = finished(stack, video.id)
    assert job["status"] == "completed", job
    out = tmp_path / "sdk.mp4"
    sdk.videos.download_content(video.id).write_to_file(out)
    assert probe_mp4(out)["frames"] == 192  # 8 s at 24 fps


def _big_png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4097, 4096)).save(out, format="PNG")  # compresses to little; 4097x4096 pixels decoded
    return out.getvalue()


@pytest.mark.parametrize("send,status,code,field", [
    (lambda b: requests.post(f"{b}/jobs", json={"prompt": "x", "task": "fl2va", "first_frame":
                                                "data:image/png;base64," + base64.b64encode(b"nope").decode(),
                                                **SIZE}, timeout=30), 400, "invalid_image", "first_frame"),
    (lambda b: requests.post(f"{b}/jobs", data={"prompt": "x", "task": "fl2va"},
                             files={"last_frame": ("x.png", _big_png(), "image/png")}, timeout=60),
     413, "image_too_large", "last_frame"),
    (lambda b: requests.post(f"{b}/jobs", json={"prompt": "x", "task": "fl2va", **SIZE}, timeout=30),
     400, "invalid_request", "first_frame"),
    (lambda b: requests.post(f"{b}/jobs", json={"prompt": "x", "task": "ref2va", "first_frame":
                                                data_url(png(64, 64, 1)), **SIZE}, timeout=30),
     400, "invalid_request", "first_frame"),
    (lambda b: requests.post(f"{b}/jobs", json={"prompt": "x", "task": "ref2va", "references":
                                                [data_url(png(32, 32, 1))] * 10, **SIZE}, timeout=30),
     400, "invalid_request", "references"),
    (lambda b: requests.post(f"{b}/jobs", json={"prompt": "x", "task": "fl2va", "first_frame":
                                                "https://example.invalid/a.png", **SIZE}, timeout=30),
     400, "invalid_image", "first_frame"),
    (lambda b: requests.post(f"{b}/v1/videos", data={"prompt": "x", "size": "256x128", "seconds": "8"},
                             files={"input_reference": ("r.png", b"GIF89a broken", "image/gif")}, timeout=30),
     400, "invalid_image", "input_reference"),
])
def test_bad_images_get_a_4xx_naming_the_field_and_store_nothing(stack, send, status, code, field):
    r = stack.redis.client()
    jobs_before = r.zcard(keys.JOBS_INDEX)
    dirs_before = sorted(p.name for p in stack.artifacts.iterdir()) if stack.artifacts.exists() else []
    reply = send(stack.api.base)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["code"] == code and error["message"].startswith(field), error
    assert r.zcard(keys.JOBS_INDEX) == jobs_before
    assert sorted(p.name for p in stack.artifacts.iterdir()) == dirs_before


def test_a_batch_line_takes_images_and_a_bad_one_is_refused_by_line(stack, tmp_path):
    """POST /batches: an fl2va line with a data: URL keyframe renders (its keyframe stored under the item's job);
    a line whose image is not one is refused naming its line and field, and nothing is written."""
    base = stack.api.base
    bad = requests.post(f"{base}/batches", json={"requests": [
        {"prompt": "fine", **SIZE},
        {"prompt": "x", "task": "fl2va", "first_frame": "data:image/png;base64,AAAA", **SIZE}]}, timeout=30)
    assert bad.status_code == 422, bad.text
    detail = bad.json()["error"]["details"][0]
    assert (detail["line"], detail["field"]) == (2, "first_frame"), detail
    reply = requests.post(f"{base}/batches", json={"requests": [
        {"prompt": "a door opens", "task": "fl2va", "first_frame": data_url(png(90, 60, 9)), **SIZE}]}, timeout=30)
    assert reply.status_code in (200, 201, 202), reply.text
    batch = wait_batch(base, reply.json()["id"])
    results = requests.get(f"{base}/batches/{batch['id']}/results", timeout=30)
    item = json.loads(results.text.splitlines()[0])  # JSONL, one line per item
    assert item["status"] == "completed", item
    job_id = item["job_id"]
    assert (stack.artifacts / job_id / "inputs" / "first_frame.png").is_file()
    assert_clip(stack, job_id, tmp_path)
