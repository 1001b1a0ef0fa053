"""A job's `eta_s` (core/jobs.eta_s), the web page's "about … left": from its own progress while it runs, from its
place in line, the live workers and the mean completed job while it waits, and null where there is nothing to go on.
The rule is checked on records; the door's figures against a real Redis whose job records, stage histogram and
capability hash were written by the job core's own functions, with no worker running."""
from __future__ import annotations

import pytest
import redis

from h3batch.api import create_app
from h3batch.core import capacity, jobs
from h3batch.core.jobs import JobStatus


def test_a_running_job_scales_its_elapsed_time_by_the_progress_left():
    record = {"status": "in_progress", "progress": 0.25, "started_at": 100.0}
    assert jobs.eta_s(record, None, typical_s=None, workers=0, now=110.0) == 30.0
    assert jobs.eta_s({**record, "progress": 0.0}, None, typical_s=50.0, workers=1, now=110.0) is None


@pytest.mark.parametrize(("position", "workers", "expected"), [(1, 1, 12.0), (3, 1, 36.0), (3, 2, 24.0),
                                                               (4, 2, 24.0), (2, 0, None)])
def test_a_queued_job_waits_rounds_of_the_live_workers(position, workers, expected):
    record = {"status": "queued", "progress": 0.0}
    assert jobs.eta_s(record, position, typical_s=12.0, workers=workers, now=0.0) == expected
    assert jobs.eta_s(record, position, typical_s=None, workers=workers, now=0.0) is None


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled", "expired"])
def test_a_finished_job_has_no_eta(status):
    assert jobs.eta_s({"status": status, "progress": 1.0, "started_at": 1.0}, None, typical_s=9.0, workers=1,
                      now=5.0) is None


@pytest.fixture
def client(app_redis, tmp_path):
    app = create_app({"REDIS_URL": app_redis, "ARTIFACTS_DIR": str(tmp_path), "API_KEYS": []})
    r = redis.Redis.from_url(app_redis, decode_responses=True)
    r.flushdb()
    yield app.test_client(), r
    r.flushdb()


def test_the_door_shows_the_estimate_on_get_and_list(client):
    """No job done yet: a queued job's eta_s is null. One completed job (10 s over its stages) and two live workers:
    the third in line waits two rounds, 20 s; GET /jobs/{id} and GET /jobs agree. The completed job shows null."""
    http, r = client
    ids = [http.post("/jobs", json={"prompt": f"rain {n}"}).get_json()["id"] for n in range(4)]
    assert http.get(f"/jobs/{ids[1]}").get_json()["eta_s"] is None  # nothing measured yet
    jobs.transition(r, ids[0], JobStatus.IN_PROGRESS, fields={"attempt": 1})
    jobs.transition(r, ids[0], JobStatus.COMPLETED, fields={"timings": {"text_encode": 1.0, "denoise": 7.0,
                                                                        "decode": 1.5, "mux": 0.5}})
    assert jobs.typical_render_s(r) == pytest.approx(10.0)
    assert http.get(f"/jobs/{ids[1]}").get_json()["eta_s"] is None  # no live worker: no rounds to count
    for name in ("w1", "w2"):
        capacity.record(r, name, 100_000)
    shown = http.get(f"/jobs/{ids[3]}").get_json()
    assert (shown["status"], shown["queue_position"], shown["eta_s"]) == ("queued", 3, 20.0)
    listed = {job["id"]: job["eta_s"] for job in http.get("/jobs").get_json()["data"]}
    assert listed == {ids[0]: None, ids[1]: 10.0, ids[2]: 10.0, ids[3]: 20.0}
