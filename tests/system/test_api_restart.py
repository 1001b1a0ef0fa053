"""API restart while jobs run: kill -9 of the whole gunicorn process group mid-render, then a restart on the same
port. Jobs are unaffected (the API holds no job state) and polling clients see one consistent story."""
from __future__ import annotations

import json
import threading
import time

import requests

from tests.system.conftest import SMALL, completed_events, post_job, wait_all_finished

ORDER = {"queued": 0, "in_progress": 1, "completed": 2}


def test_api_kill9_mid_render_has_no_effect_on_jobs_or_pollers(stack_factory):
    """While 4 jobs render and a client polls each of them, kill -9 and restart the API: every job completes on its
    first attempt; pollers get only connection errors (while it is down) or 200 with a valid job, never a 5xx;
    each job's status never goes backwards and its progress never decreases; a create retried with its
    Idempotency-Key across the restart returns the original job."""
    stack = stack_factory()
    api = stack.start_api()
    stack.start_worker("steady", H3BATCH_DEBUG_STEP_DELAY_S="0.1")
    ids = [post_job(api.base, seed=i)["id"] for i in range(3)]
    body = {"prompt": "a train passes at night", "seed": 99, **SMALL}
    first = requests.post(f"{api.base}/jobs", json=body, headers={"Idempotency-Key": "restart-1"}, timeout=60)
    assert first.status_code == 202
    ids.append(first.json()["id"])
    seen: dict[str, list[tuple[str, float, int]]] = {job_id: [] for job_id in ids}
    failures: list[str] = []
    errors_at: list[float] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for job_id in ids:
                try:
                    reply = requests.get(f"{api.base}/jobs/{job_id}", timeout=60)
                except requests.RequestException:
                    errors_at.append(time.monotonic())
                    continue
                if reply.status_code != 200:
                    failures.append(f"{reply.status_code} {reply.text[:200]}")
                    continue
                job = reply.json()
                seen[job_id].append((job["status"], job["progress"], job["attempt"]))
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    r = stack.redis.client()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not r.zcard("h3b:running"):
        time.sleep(0.01)
    killed_at = time.monotonic()
    api.kill()
    time.sleep(1.0)
    api.start()  # same port
    back_at = time.monotonic()
    replay = requests.post(f"{api.base}/jobs", json=body, headers={"Idempotency-Key": "restart-1"}, timeout=60)
    statuses = wait_all_finished(r, ids, timeout_s=120)
    time.sleep(0.3)
    stop.set()
    poller.join(timeout=10)

    assert replay.status_code == 202 and replay.json()["id"] == first.json()["id"]
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert statuses == {job_id: "completed" for job_id in ids}
    assert not failures, failures[:5]
    assert errors_at and all(killed_at - 0.5 <= t <= back_at + 0.5 for t in errors_at)  # only while it was down
    for job_id in ids:
        record = r.hgetall(f"h3b:job:{job_id}")
        assert record["attempt"] == "1" and completed_events(r, job_id) == 1
        steps = seen[job_id]
        ranks = [ORDER[status] for status, _, _ in steps]
        assert ranks == sorted(ranks), (job_id, steps)
        progress = [p for _, p, _ in steps]
        assert progress == sorted(progress) and progress[-1] == 1.0, (job_id, steps)
    print("\nRELIABILITY api-restart " + json.dumps({
        "jobs": len(ids), "completed": len(ids), "polls": sum(len(v) for v in seen.values()),
        "poll_5xx": len(failures), "poll_connection_errors": len(errors_at),
        "api_down_s": round(back_at - killed_at, 2)}))
