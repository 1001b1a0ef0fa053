"""End to end through the real service: HTTP → gunicorn API → Redis → Celery worker subprocess with the resident tiny
pipeline → MP4 on disk → HTTP download decoded with PyAV. One worker serves the whole module."""
from __future__ import annotations

import json
import time

import av
import pytest
import requests

from h3batch.core import broker
from tests.service_stack import ApiProcess, poll_until, service_env

FINISHED = ("completed", "failed", "cancelled", "expired")


SMALL = {"width": 128, "height": 32}
"""The smallest canvas the geometry rules allow (aspect 4:1): a tiny-release job then renders in about a second."""


def post_job(base: str, **body) -> dict:
    payload = {"prompt": "a kettle whistles in a rainy kitchen", **SMALL, **body}
    reply = requests.post(f"{base}/jobs", json=payload, timeout=60)
    assert reply.status_code == 202, reply.text
    return reply.json()


def finished(job: dict) -> bool:
    return job["status"] in FINISHED


@pytest.fixture(scope="module")
def completed_job(api, worker, artifacts_dir) -> dict:
    """One job rendered to completion, with every state seen while polling."""
    job = post_job(api.base, seed=123)
    seen = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        current = requests.get(f"{api.base}/jobs/{job['id']}", timeout=60).json()
        seen.append(current)
        if finished(current):
            break
        time.sleep(0.03)
    return {"job": seen[-1], "seen": seen}


def test_job_completes_with_monotonic_progress_and_recorded_timings(completed_job, worker):
    """A job goes queued/in_progress → completed; progress never decreases, ends at exactly 1.0; denoise steps and
    per-stage timings, seed and worker are recorded."""
    job, seen = completed_job["job"], completed_job["seen"]
    assert job["status"] == "completed", job
    progress = [s["progress"] for s in seen]
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert all(0.0 <= p < 1.0 for p in progress[:-1])
    stages = {s["stage"] for s in seen}
    assert "denoise" in stages, stages
    steps = [s["step"] for s in seen if s["stage"] == "denoise"]
    assert steps and max(steps) <= 8
    assert job["step"] == 8 and job["total_steps"] == 8
    assert {"text_encode", "denoise", "decode", "mux", "finalize"} <= set(job["timings"])
    assert job["seed"] == 123 and job["worker"] == worker.name and job["attempt"] == 1
    assert job["started_at"] >= job["created_at"] and job["finished_at"] >= job["started_at"]
    assert job["expires_at"] > job["finished_at"] and job["queue_position"] is None and job["error"] is None


def test_mp4_downloads_and_decodes_to_the_requested_clip(api, completed_job, artifacts_dir, tmp_path):
    """GET /content returns video/mp4 with ETag and Content-Length; PyAV decodes the job's frame count at the
    requested 128x32 and a stereo audio stream; no partial files remain beside the artifact."""
    job = completed_job["job"]
    reply = requests.get(f"{api.base}/jobs/{job['id']}/content", timeout=30)
    assert reply.status_code == 200
    assert reply.headers["Content-Type"] == "video/mp4"
    assert int(reply.headers["Content-Length"]) == len(reply.content) == job["size_bytes"]
    assert reply.headers["ETag"].strip('"') and reply.headers["Accept-Ranges"] == "bytes"
    path = tmp_path / "job.mp4"
    path.write_bytes(reply.content)
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio
        assert (video.codec_context.width, video.codec_context.height) == (128, 32)
        assert len(audio) >= 1 and audio[0].codec_context.channels == 2
        frames = sum(1 for _ in container.decode(video=0))
    assert frames == job["frames"] >= 96
    assert [p.name for p in (artifacts_dir / job["id"]).iterdir()] == ["video.mp4"]


def test_range_requests_and_conditional_get(api, completed_job):
    """Range gives 206 with exactly the requested bytes, an unsatisfiable range 416 with Content-Range */size,
    If-None-Match with the ETag 304, and HEAD the length without a body."""
    url = f"{api.base}/jobs/{completed_job['job']['id']}/content"
    whole = requests.get(url, timeout=30)
    size = len(whole.content)
    part = requests.get(url, headers={"Range": "bytes=100-1099"}, timeout=30)
    assert part.status_code == 206 and part.content == whole.content[100:1100]
    assert part.headers["Content-Range"] == f"bytes 100-1099/{size}"
    tail = requests.get(url, headers={"Range": "bytes=-64"}, timeout=30)
    assert tail.status_code == 206 and tail.content == whole.content[-64:]
    beyond = requests.get(url, headers={"Range": f"bytes={size + 10}-{size + 20}"}, timeout=30)
    assert beyond.status_code == 416 and beyond.headers["Content-Range"] == f"bytes */{size}"
    assert beyond.json()["error"]["code"] == "requested_range_not_satisfiable"
    assert requests.get(url, headers={"If-None-Match": whole.headers["ETag"]}, timeout=30).status_code == 304
    head = requests.head(url, timeout=30)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == size and not head.content


def test_second_job_does_not_reload_the_model(api, worker, completed_job, r):
    """After another job on the same worker, Redis still records exactly one model load and the same worker ran
    both jobs."""
    assert r.hget("h3b:stats", "model_loads") == "1"
    second = post_job(api.base, seed=7)
    done = poll_until(api.base, second["id"], finished)
    assert done["status"] == "completed" and done["worker"] == completed_job["job"]["worker"] == worker.name
    assert r.hget("h3b:stats", "model_loads") == "1"
    beat = json.loads(r.get(f"h3b:worker:{worker.name}"))
    assert beat["model_loads"] == 1 and beat["state"] == "READY"
    assert worker.log_text().count("model resident") == 1


def test_prefer_wait_returns_the_finished_job(api, worker):
    """POST with `Prefer: wait=60` answers 200 with the completed job when it finishes in time."""
    reply = requests.post(f"{api.base}/jobs", json={"prompt": "waves on rocks", "seed": 5, **SMALL},
                          headers={"Prefer": "wait=60"}, timeout=90)
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "completed" and reply.headers["Location"].endswith(reply.json()["id"])


def test_cancel_running_job_stops_at_the_next_step(api, worker, artifacts_dir, r):
    """Cancelling during denoise ends the job `cancelled` within one step, with no MP4 and the worker READY again."""
    job = post_job(api.base)
    running = poll_until(api.base, job["id"], lambda j: j["stage"] == "denoise" and j["step"] >= 1, interval_s=0.01)
    reply = requests.post(f"{api.base}/jobs/{job['id']}/cancel", timeout=60)
    assert reply.status_code == 202 and reply.json()["status"] in ("in_progress", "cancelled")
    done = poll_until(api.base, job["id"], finished, interval_s=0.02)
    assert done["status"] == "cancelled", done
    assert done["step"] <= running["step"] + 2  # stopped within a step of the cancel (plus one in flight)
    if running["step"] <= 5:  # a slow poll could first see step 7-8; then the stop lands before decode or mux
        assert done["cancelled_at_stage"] == "denoise"
    assert done["cancel_reason"] == "user" and done["progress"] < 1.0
    assert not (artifacts_dir / job["id"]).exists()
    content = requests.get(f"{api.base}/jobs/{job['id']}/content", timeout=60)
    assert content.status_code == 409 and content.json()["error"]["code"] == "job_not_completed"
    deadline = time.monotonic() + 10
    while json.loads(r.get(f"h3b:worker:{worker.name}"))["state"] != "READY":
        assert time.monotonic() < deadline, "worker did not return to READY after the cancel"
        time.sleep(0.05)


def test_cancel_queued_job_never_starts(api, worker, r):
    """A job cancelled while another renders stays cancelled with no start time after the worker drains its
    message."""
    running = post_job(api.base)
    queued = post_job(api.base)
    poll_until(api.base, running["id"], lambda j: j["status"] == "in_progress", interval_s=0.01)
    reply = requests.post(f"{api.base}/jobs/{queued['id']}/cancel", timeout=60)
    assert reply.status_code == 202 and reply.json()["status"] == "cancelled"
    assert poll_until(api.base, running["id"], finished)["status"] == "completed"
    deadline = time.monotonic() + 20
    while broker.render_depth(r) or r.hlen("unacked"):  # the cancelled job's message has been consumed and acked
        assert time.monotonic() < deadline
        time.sleep(0.05)
    after = requests.get(f"{api.base}/jobs/{queued['id']}", timeout=60).json()
    assert after["status"] == "cancelled" and after["started_at"] is None
    assert after["attempt"] == 0 and after["worker"] is None and after["cancelled_at_stage"] == "queued"


def test_delete_running_job_aborts_it_and_removes_files(api, worker, artifacts_dir, r):
    """DELETE of a rendering job answers 204; the worker stops at its next step and leaves no files; GET is 404."""
    job = post_job(api.base)
    poll_until(api.base, job["id"], lambda j: j["stage"] == "denoise", interval_s=0.01)
    assert requests.delete(f"{api.base}/jobs/{job['id']}", timeout=60).status_code == 204
    assert requests.get(f"{api.base}/jobs/{job['id']}", timeout=60).status_code == 404
    deadline = time.monotonic() + 20
    while json.loads(r.get(f"h3b:worker:{worker.name}"))["state"] != "READY":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not (artifacts_dir / job["id"]).exists()
    assert r.exists(f"h3b:job:{job['id']}") == 0


def test_job_asking_for_another_release_fails_with_release_mismatch(api, worker):
    """A worker serves only its own release: a job naming another fails with code release_mismatch."""
    job = post_job(api.base, release="some-other-release")
    done = poll_until(api.base, job["id"], finished)
    assert done["status"] == "failed"
    assert done["error"]["code"] == "release_mismatch" and "some-other-release" in done["error"]["message"]
    assert done["error"]["retryable"] is False


def test_readyz_counts_the_worker(api, worker):
    """/readyz is 200 with Redis ok and the worker's heartbeat counted, naming its release."""
    ready = requests.get(f"{api.base}/readyz", timeout=60)
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["checks"]["redis"]["ok"] and body["checks"]["workers"]["count"] >= 1
    assert body["checks"]["workers"]["releases"] and all(body["checks"]["workers"]["releases"])


def test_heartbeat_advertises_the_contracts_largest_request_by_default(api, worker, r):
    """Without H3BATCH_MAX_ROWS or a memory plan the tiny CPU worker advertises the rows of the largest request
    the contract allows (15 s at 1344x768, longest prompt), so the API refuses nothing the contract accepts."""
    from h3batch.core.geometry import CONTRACT_MAX_ROWS

    advertised = json.loads(r.get(f"h3b:worker:{worker.name}"))["max_rows"]
    # A CPU worker advertises its host-memory plan (capped at the contract's largest request), the same everywhere.
    assert 0 < advertised <= CONTRACT_MAX_ROWS
    assert json.loads(r.hget("h3b:capacity", worker.name))["max_rows"] == advertised
    assert requests.get(f"{api.base}/readyz", timeout=60).json()["checks"]["workers"]["max_rows"] == advertised


def test_job_survives_an_api_restart(redis_url, artifacts_dir, worker, tmp_path):
    """Kill -9 of the API mid-render loses nothing: a new API process on the same Redis shows the job continuing
    (progress not going back) to completed, and serves its MP4."""
    server = ApiProcess(service_env(redis_url, artifacts_dir), tmp_path / "api.log")
    server.start()
    try:
        job = post_job(server.base)
        before = poll_until(server.base, job["id"], lambda j: j["status"] == "in_progress", interval_s=0.01)
        server.kill()
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.base}/jobs/{job['id']}", timeout=2)
        server.start()
        after = requests.get(f"{server.base}/jobs/{job['id']}", timeout=60).json()
        assert after["progress"] >= before["progress"] and after["created_at"] == before["created_at"]
        done = poll_until(server.base, job["id"], finished)
        assert done["status"] == "completed" and done["attempt"] == 1
        assert requests.get(f"{server.base}/jobs/{job['id']}/content", timeout=30).status_code == 200
    finally:
        server.stop()


def test_pickled_message_is_refused_and_nothing_runs(redis_url, worker, r):
    """A pickle-serialized render message is refused by the JSON-only worker (ContentDisallowed): the job it names
    stays queued and never starts."""
    from h3batch.core import defaults, jobs, routing
    from h3batch.core.celery_app import make_celery

    job = jobs.create_job(r, jobs.JobSpec(prompt="pickle", seconds=4.0, width=256, height=128, seed=1))
    queue = routing.queue_of(job)  # the worker consumes it
    make_celery(redis_url).send_task(defaults.RENDER_TASK, args=[job["id"]], queue=queue, serializer="pickle")
    deadline = time.monotonic() + 20
    while "untrusted content of type pickle" not in worker.log_text():
        assert time.monotonic() < deadline, "the worker never refused the pickled message"
        time.sleep(0.1)
    while r.llen(queue) or r.hlen("unacked"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    after = jobs.load_job(r, job["id"])
    assert after["status"] == "queued" and after["attempt"] == 0 and after.get("started_at") is None
    jobs.request_cancel(r, job["id"], record_ttl_s=60)


def read_events(response: requests.Response) -> list[dict]:
    """Parse a text/event-stream body into [{id, event, data}] until the server closes it (comments skipped)."""
    events, current = [], {}
    for line in response.iter_lines(decode_unicode=True):
        if line == "":
            if current:
                events.append(current)
            current = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            current[name] = json.loads(value) if name == "data" else value
    return events


def stream_id(event: dict) -> tuple[int, int]:
    ms, seq = event["id"].split("-")
    return int(ms), int(seq)


def test_event_stream_follows_a_job_live_and_replays_after_last_event_id(api, worker):
    """GET /events streams status → stage/progress (steps 0..8 in order) → completed, then closes; ids increase;
    reconnecting with Last-Event-ID replays exactly the later events."""
    job = post_job(api.base, seed=11)
    with requests.get(f"{api.base}/jobs/{job['id']}/events", stream=True, timeout=120) as live:
        assert live.status_code == 200 and live.headers["Content-Type"].startswith("text/event-stream")
        events = read_events(live)
    names = [e["event"] for e in events]
    assert names[0] == "status" and events[0]["data"]["status"] == "queued"
    assert names[-1] == "completed" and names.count("completed") == 1
    started = [e for e in events if e["event"] == "status" and e["data"]["status"] == "in_progress"]
    assert len(started) == 1 and started[0]["data"]["attempt"] == 1
    steps = [e["data"]["step"] for e in events if e["event"] == "progress" and e["data"]["stage"] == "denoise"]
    assert steps == list(range(0, 9))  # step 0: the stage begins, before its first forward
    progress = [e["data"]["progress"] for e in events if e["event"] == "progress"]
    assert progress == sorted(progress)
    assert [e["data"]["stage"] for e in events if e["event"] == "stage"] == ["denoise", "decode", "mux", "finalize"]
    ids = [stream_id(e) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    with requests.get(f"{api.base}/jobs/{job['id']}/events", headers={"Last-Event-ID": events[4]["id"]},
                      stream=True, timeout=30) as replay:
        assert read_events(replay) == events[5:]
    bad = requests.get(f"{api.base}/jobs/{job['id']}/events", headers={"Last-Event-ID": "yesterday"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
