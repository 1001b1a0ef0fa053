"""GET /jobs/{id}/events over real HTTP while a real worker renders: live events, replay, keep-alives, stream caps."""
from __future__ import annotations

import time

import requests

from h3batch.core.jobs import JobSpec, create_job, delete_job
from tests.api.conftest import KEY_A, auth, key_id, parse_sse


def _stream(base: str, job_id: str, last_id: str | None = None, timeout=(5, 30)) -> requests.Response:
    headers = {**auth(), **({"Last-Event-ID": last_id} if last_id else {})}
    return requests.get(f"{base}/jobs/{job_id}/events", headers=headers, stream=True, timeout=timeout)


def test_events_arrive_live_and_end_after_terminal(stack):
    """Stage, per-step progress and the completed event stream in as the worker renders; the stream then closes."""
    job = requests.post(f"{stack.base}/jobs", json={"prompt": "drums in a cave"}, headers=auth(), timeout=60).json()
    seen, arrival, status_mid_stream = [], [], None
    with _stream(stack.base, job["id"]) as response:
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        lines = []
        for line in response.iter_lines(decode_unicode=True):
            lines.append(line)
            if line == "":
                events = [e for e in parse_sse(lines) if "event" in e]
                if len(events) > len(seen):
                    seen = events
                    arrival.append(time.monotonic())
                    if seen[-1]["event"] == "progress" and seen[-1]["data"].get("step") == 2:
                        status_mid_stream = requests.get(f"{stack.base}/jobs/{job['id']}", headers=auth(),
                                                         timeout=60).json()["status"]
        # iter_lines ended: the server closed the stream after the terminal event
    names = [e["event"] for e in seen]
    assert names[0] == "status" and names[-1] == "completed" and names.count("completed") == 1
    stages = [e["data"]["stage"] for e in seen if e["event"] == "stage"]
    # text_encode is announced by the in_progress status event (the claim sets it); later stages by stage events
    assert [e["data"].get("stage") for e in seen if e["event"] == "status"][-1] == "text_encode"
    assert stages == ["denoise", "decode", "mux", "finalize"], stages
    steps = [e["data"]["step"] for e in seen if e["event"] == "progress" and e["data"]["stage"] == "denoise"]
    assert steps == list(range(0, 9))  # step 0: the stage begins, before its first forward
    progress = [e["data"]["progress"] for e in seen if e["event"] == "progress"]
    assert progress == sorted(progress) and 0 < progress[0] and progress[-1] < 1
    ids = [tuple(map(int, e["id"].split("-"))) for e in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert status_mid_stream == "in_progress"  # events were live: the job was still rendering at step 2
    assert arrival[-1] - arrival[0] > 0.3


def test_last_event_id_replays_the_rest(stack):
    """Reconnecting with Last-Event-ID replays exactly the events after it, then ends."""
    job = requests.post(f"{stack.base}/jobs", json={"prompt": "birdsong"}, headers=auth(), timeout=60).json()
    with _stream(stack.base, job["id"]) as response:
        full = [e for e in parse_sse(response.iter_lines(decode_unicode=True)) if "event" in e]
    cut = full[4]["id"]
    with _stream(stack.base, job["id"], last_id=cut) as response:
        rest = [e for e in parse_sse(response.iter_lines(decode_unicode=True)) if "event" in e]
    assert [e["id"] for e in rest] == [e["id"] for e in full[5:]]
    assert rest[-1]["event"] == "completed"
    bad = requests.get(f"{stack.base}/jobs/{job['id']}/events", headers={**auth(), "Last-Event-ID": "x"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def test_keepalives_and_stream_cap_leave_threads_free(compat_api, rc):
    """An idle stream gets ':' keep-alive comments; past SSE_MAX_STREAMS a stream is refused (503) while other
    requests stay fast, and closing a stream frees its slot."""
    owner = key_id(KEY_A)
    # Records with no Celery message: they stay queued, so their streams stay open and idle.
    idle = [create_job(rc, JobSpec(prompt="idle", seconds=4.0, width=256, height=128, seed=1, owner=owner))["id"]
            for _ in range(3)]
    streams = []
    try:
        for job_id in idle:
            streams.append(_stream(compat_api.base, job_id))
            assert streams[-1].status_code == 200
        lines = streams[0].iter_lines(decode_unicode=True)
        got = [next(lines) for _ in range(6)]  # status event (3 lines) then keep-alives within ~2 s each
        assert any(line.startswith(": keep-alive") for line in got), got

        refused = requests.get(f"{compat_api.base}/jobs/{idle[0]}/events", headers=auth(), timeout=60)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_streams"
        assert int(refused.headers["Retry-After"]) >= 1
        for path in ("/healthz", "/v1/videos?limit=1", f"/jobs/{idle[1]}"):
            # Answered while every stream slot is held open (a route queued behind them would never answer).
            assert requests.get(compat_api.base + path, headers=auth(), timeout=30).status_code == 200, path

        streams.pop().close()
        deadline = time.monotonic() + 60
        while True:  # the slot comes back once the server notices the closed connection (next keep-alive write)
            again = _stream(compat_api.base, idle[2])
            if again.status_code == 200:
                streams.append(again)
                break
            again.close()
            assert time.monotonic() < deadline, "slot never released after the client closed its stream"
            time.sleep(0.3)
    finally:
        for response in streams:
            response.close()
        for job_id in idle:
            delete_job(rc, job_id)


def test_stream_time_limit_ends_with_retry_hint_and_frees_the_slot(compat_redis_url, compat_artifacts, rc,
                                                                   monkeypatch):
    """A stream older than SSE_MAX_S ends with a `retry:` hint (the client resumes with Last-Event-ID) and gives its
    slot back."""
    from h3batch.api import create_app


    app = create_app({"REDIS_URL": compat_redis_url, "ARTIFACTS_DIR": str(compat_artifacts), "API_KEYS": [],
                      "SSE_MAX_S": 1.0, "SSE_MAX_STREAMS": 1,
                      "SSE_KEEPALIVE_S": 0.2})  # keep-alives are what let the guard look at the clock
    job_id = create_job(rc, JobSpec(prompt="idle", seconds=4.0, width=256, height=128, seed=1))["id"]
    try:
        client = app.test_client()
        started = time.monotonic()
        response = client.get(f"/jobs/{job_id}/events", buffered=False)
        assert client.get(f"/jobs/{job_id}/events").status_code == 503  # the one slot is taken
        body = b"".join(response.response).decode()
        response.close()
        elapsed = time.monotonic() - started
        assert "event: status" in body and ": keep-alive" in body and "retry: 1000" in body
        assert elapsed >= 1.0  # the stream lived its SSE_MAX_S (a lower bound; load only lengthens it)
        again = client.get(f"/jobs/{job_id}/events", buffered=False)  # the slot came back
        assert again.status_code == 200
        again.close()
    finally:
        delete_job(rc, job_id)
