"""Adapters through the real service: the API, Redis and a real worker process on the tiny release.

The tiny release is FastH3 V2, which takes no adapters: a job with `loras` that reaches its worker anyway (the fleet
changed after the API accepted it) fails `lora_base_mismatch` and the worker keeps serving. The tiny native release
renders per-job LoRAs (a batch of one set applies it once) and, on a worker started with H3BATCH_ADAPTER, the legacy
adapter's own four steps."""
from __future__ import annotations

import pytest
import redis
import requests

from h3batch.core import celery_app, jobs, keys
from h3batch.core.celery_app import make_celery
from h3batch.worker.h3.mp4 import probe_mp4
from tests.conftest import start_redis
from tests.service_stack import ApiProcess, poll_until, service_env, start_worker, wait_batch

SMALL = {"width": 128, "height": 32}
NATIVE = {"width": 128, "height": 32, "seconds": 5.0}
"""The native release renders from 5 s (diffusers' min_duration)."""


def test_a_v2_worker_fails_a_lora_job_and_keeps_serving(api, worker, r, redis_url):
    """A queued job naming a LoRA (as the API records one) fails on the V2 worker with lora_base_mismatch, not a
    crash: the next plain job completes on the same worker."""
    spec = jobs.JobSpec(prompt="rain on a tin roof", seconds=4.0, seed=1, **SMALL,
                        loras=({"ref": "style", "scale": 1.0, "path": "/nonexistent/lora-style"},))
    record = jobs.create_job(r, spec, max_queued=100)
    celery_app.send_render(make_celery(redis_url, max_run_s=60), r, record["id"])
    failed = poll_until(api.base, record["id"], lambda job: job["status"] in ("failed", "completed"), 300)
    assert failed["status"] == "failed", failed
    assert failed["error"]["code"] == "lora_base_mismatch" and "native MiniMax-H3" in failed["error"]["message"]
    assert failed["loras"][0]["ref"] == "style"
    plain = requests.post(f"{api.base}/jobs", json={"prompt": "a kettle whistles", **SMALL, "seed": 2}, timeout=60)
    assert plain.status_code == 202, plain.text
    done = poll_until(api.base, plain.json()["id"], lambda job: job["status"] in ("failed", "completed"), 300)
    assert done["status"] == "completed" and done["worker"] == failed["worker"], done


@pytest.fixture(scope="module")
def native_stack(tmp_path_factory):
    """Its own Redis (no V2 worker can take these jobs), the tiny native release, the tiny adapters, and the API with
    the adapters' folders allow-listed."""
    from h3batch.worker.h3.tiny_adapters import build_tiny_adapters
    from h3batch.worker.h3.tiny_release import build_tiny_native_release

    root = tmp_path_factory.mktemp("adapters-stack")
    proc, url = start_redis(root / "redis")
    release = build_tiny_native_release(root / "release", seed=0).release_dir
    build_tiny_adapters(root / "adapters")
    allow = f"style={root / 'adapters' / 'lora-style'},char={root / 'adapters' / 'lora-character'}"
    api = ApiProcess(service_env(url, root / "artifacts", H3BATCH_LORA_ALLOW=allow), root / "api.log")
    api.start()
    yield {"url": url, "root": root, "release": release, "allow": allow, "api": api,
           "r": redis.Redis.from_url(url, decode_responses=True)}
    api.stop()
    proc.terminate()
    proc.wait(timeout=10)


def _render(base: str, **body) -> dict:
    reply = requests.post(f"{base}/jobs", json={"prompt": "rain on a tin roof", **NATIVE, **body}, timeout=60)
    assert reply.status_code == 202, reply.text
    return poll_until(base, reply.json()["id"], lambda job: job["status"] in ("failed", "completed"), 300)


def test_per_job_loras_render_on_the_native_release_and_a_batch_applies_its_set_once(native_stack, tmp_path):
    """A native worker renders a job with a LoRA: the record, its metadata and the MP4's h3batch_loras tag name the
    adapter and scale. A batch of three jobs sharing another adapter applies it once (h3b:stats lora_applies)."""
    stack, base, r = native_stack, native_stack["api"].base, native_stack["r"]
    worker = start_worker(stack["url"], stack["root"] / "artifacts", stack["release"], "native-lora-worker",
                          stack["root"] / "worker-lora.log", H3BATCH_LORA_ALLOW=stack["allow"])
    try:
        job = _render(base, seed=3, loras=[{"ref": "style", "scale": 0.8}])
        assert job["status"] == "completed", job
        assert job["metadata"]["loras"][0]["ref"] == "style"
        assert int(r.hget(keys.STATS, "lora_applies")) == 1
        mp4 = tmp_path / "style.mp4"
        mp4.write_bytes(requests.get(f"{base}/jobs/{job['id']}/content", timeout=60).content)
        tags = probe_mp4(mp4)["metadata"]
        assert tags["h3batch_loras"] == f"{stack['root'] / 'adapters' / 'lora-style'}*0.8", tags
        lines = [{"prompt": f"rain {i}", **NATIVE, "seed": i, "loras": [{"ref": "char"}]} for i in range(3)]
        reply = requests.post(f"{base}/batches", json={"requests": lines}, timeout=60)
        assert reply.status_code == 202, reply.text
        batch = wait_batch(base, reply.json()["id"], timeout_s=600)
        assert batch["counts"]["completed"] == 3, batch
        assert int(r.hget(keys.STATS, "lora_applies")) == 2  # the batch's one set, applied once for three jobs
        plain = _render(base, seed=9)
        assert plain["status"] == "completed" and "loras" not in plain["metadata"], plain
    finally:
        worker.stop()


def test_the_legacy_adapter_serves_its_own_four_steps_on_the_native_release(native_stack):
    """A worker started with H3BATCH_ADAPTER on the tiny native release renders with the adapter's four forwards
    (the release's own tiny ladder has three), and says so in the job's provenance."""
    stack = native_stack
    adapter = stack["root"] / "adapters" / "legacy-fasth3"
    worker = start_worker(stack["url"], stack["root"] / "artifacts", stack["release"], "native-legacy-worker",
                          stack["root"] / "worker-legacy.log", H3BATCH_ADAPTER=str(adapter))
    try:
        job = _render(stack["api"].base, seed=4)
        assert job["status"] == "completed", job
        provenance = job["metadata"]["provenance"]
        assert provenance["adapter"] == str(adapter) and provenance["adapter_steps"] == 4
        assert provenance["adapter_model"] == "FastVideo/FastH3-tiny-4-step"
    finally:
        worker.stop()
