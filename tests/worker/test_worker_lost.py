"""Worker loss: kill -9 of the GPU worker mid-render; a fresh worker finishes the job exactly once (attempt 2).

Runs on its own Redis DB with its own API and short lease/reconcile periods, so the session worker never sees it.
"""
from __future__ import annotations

import requests

from tests.service_stack import ApiProcess, poll_until, service_env, start_worker

FAST_RECOVERY = {"H3BATCH_LEASE_TTL_S": "1.5", "H3BATCH_RECONCILE_INTERVAL_S": "0.5",
                 "H3BATCH_DEBUG_STEP_DELAY_S": "0.25"}


def test_killed_worker_job_completes_once_on_another_worker(redis_url, tiny_release, tmp_path):
    """After SIGKILL of the rendering worker, its lease lapses, the reconciler re-enqueues the job and a new worker
    completes it with attempt 2: one completed record, one MP4, no leftovers, and usage counts the job once."""
    url = redis_url.rsplit("/", 1)[0] + "/3"
    artifacts = tmp_path / "artifacts"
    api = ApiProcess(service_env(url, artifacts), tmp_path / "api.log")
    api.start()
    first = start_worker(url, artifacts, tiny_release, "doomed", tmp_path / "doomed.log", **FAST_RECOVERY)
    second = None
    try:
        job = requests.post(f"{api.base}/jobs", json={"prompt": "a bell rings twice", "width": 128, "height": 32}, timeout=60).json()
        poll_until(api.base, job["id"], lambda j: j["stage"] == "denoise" and j["step"] >= 2, interval_s=0.02)
        first.kill()
        second = start_worker(url, artifacts, tiny_release, "rescuer", tmp_path / "rescuer.log", **FAST_RECOVERY)
        done = poll_until(api.base, job["id"], lambda j: j["status"] not in ("queued", "in_progress"))
        assert done["status"] == "completed", done
        assert done["attempt"] == 2 and done["worker"] == "rescuer"
        assert [p.name for p in (artifacts / job["id"]).iterdir()] == ["video.mp4"]
        assert requests.get(f"{api.base}/jobs/{job['id']}/content", timeout=30).status_code == 200
        assert "re-enqueuing job whose worker lost its lease" in second.log_text()
        # Usage (auth off: the one anonymous bucket) counts the job once, with the rescuer's render time only.
        used = requests.get(f"{api.base}/usage", timeout=30).json()
        assert used["jobs"] == {"completed": 1, "failed": 0, "cancelled": 0, "total": 1}, used
        assert used["video_seconds"] == done["seconds"]
        assert abs(used["gpu_seconds"] - done["inference_time_s"]) < 1e-5
    finally:
        first.kill()
        if second is not None:
            second.stop()
        api.stop()
