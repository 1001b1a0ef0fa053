"""api/job_service.py without Flask: ownership and lazy expiry, idempotent create and a refused enqueue, paging
cursors, and where a finished job's MP4 may be read, over a real Redis database."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from h3batch.api import job_service
from h3batch.api.errors import ApiError
from h3batch.api.jobs import JOBS
from h3batch.api.openai_protocol import VIDEOS
from h3batch.api.schemas import CreateJob
from h3batch.core import broker, celery_app, keys, routing
from h3batch.core.celery_app import make_celery
from h3batch.core.jobs import JobStatus, load_job, transition
from tests.conftest import SCRATCH_DB


@pytest.fixture
def r(scratch_redis):
    return scratch_redis


def make_caller(r: redis.Redis, tmp_path: Path, owner: str = "owner-a", send=None) -> job_service.Caller:
    url = f"redis://127.0.0.1:{r.connection_pool.connection_kwargs['port']}/{SCRATCH_DB}"
    sender = make_celery(url, max_run_s=60)

    def send_render(job_id: str) -> None:
        celery_app.send_render(sender, r, job_id)

    return job_service.Caller(r=r, owner=owner, artifacts_dir=tmp_path, max_queued=10, result_ttl_s=600,
                              send_render=send or send_render, vet_webhook_url=lambda url: url)


def complete(r: redis.Redis, root: Path, job_id: str, *, expires_at: float, artifact: str | None = None) -> None:
    """Drive a queued job to completed with an MP4 under root/<id>/ (what a worker would leave)."""
    (root / job_id).mkdir()
    (root / job_id / "video.mp4").write_bytes(b"mp4")
    transition(r, job_id, JobStatus.IN_PROGRESS, expect={JobStatus.QUEUED})
    transition(r, job_id, JobStatus.COMPLETED, fields={"artifact": artifact or f"{job_id}/video.mp4",
                                                       "expires_at": expires_at})


def test_another_owners_job_is_404_in_each_apis_words(r, tmp_path):
    """A job is invisible to another owner: /jobs' vocabulary answers job_not_found, /v1/videos' video_not_found."""
    record, _ = job_service.create_job(make_caller(r, tmp_path), CreateJob(prompt="a"), JOBS, None, "")
    stranger = make_caller(r, tmp_path, owner="owner-b")
    for words, code in ((JOBS, "job_not_found"), (VIDEOS, "video_not_found")):
        with pytest.raises(ApiError) as caught:
            job_service.get_owned_job(stranger, record["id"], words)
        assert (caught.value.status, caught.value.code) == (404, code)
        assert caught.value.message == f"no {words.noun} with id {record['id']!r}"


def test_create_sends_one_message_and_an_idempotent_retry_replays_the_job(r, tmp_path):
    """A create writes a queued record and one render message; the same key and fingerprint replays that job."""
    caller = make_caller(r, tmp_path)
    first, replayed = job_service.create_job(caller, CreateJob(prompt="a", seed=3), VIDEOS, "k1", "fp")
    again, replayed_again = job_service.create_job(caller, CreateJob(prompt="a", seed=3), VIDEOS, "k1", "fp")
    assert (replayed, replayed_again) == (False, True) and again["id"] == first["id"]
    assert first["status"] == "queued" and first["api"] == "openai" and first["owner"] == "owner-a"
    assert broker.ready_depth(r, routing.queue_of(first)) == 1 and routing.queue_of(first) == "render.t2va.bf16.2436"
    with pytest.raises(ApiError) as caught:
        job_service.create_job(caller, CreateJob(prompt="b"), VIDEOS, "k1", "other-fp")
    assert (caught.value.status, caught.value.code) == (422, "idempotency_key_reused")


def test_a_refused_message_fails_the_job_and_frees_the_key(r, tmp_path):
    """When the broker refuses the render message the job is failed (enqueue_failed), the caller gets 503
    storage_unavailable, and the Idempotency-Key can be used again."""
    def refuse(job_id: str) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ApiError) as caught:
        job_service.create_job(make_caller(r, tmp_path, send=refuse), CreateJob(prompt="a"), JOBS, "k2", "fp")
    assert (caught.value.status, caught.value.code, caught.value.retryable) == (503, "storage_unavailable", True)
    [failed_id] = r.zrange(keys.JOBS_INDEX, 0, -1)
    assert load_job(r, failed_id)["error"]["code"] == "enqueue_failed"
    record, replayed = job_service.create_job(make_caller(r, tmp_path), CreateJob(prompt="a"), JOBS, "k2", "fp")
    assert not replayed and record["id"] != failed_id


def test_a_completed_job_past_expiry_expires_on_read_and_loses_its_files(r, tmp_path):
    """Reading a completed job whose expires_at passed turns it expired, deletes its directory, and its content
    is then 410 artifact_expired."""
    caller = make_caller(r, tmp_path)
    record, _ = job_service.create_job(caller, CreateJob(prompt="a"), JOBS, None, "")
    complete(r, tmp_path, record["id"], expires_at=time.time() - 1)
    assert job_service.get_owned_job(caller, record["id"], JOBS)["status"] == "expired"
    assert not (tmp_path / record["id"]).exists()
    with pytest.raises(ApiError) as caught:
        job_service.content_path(caller, record["id"], JOBS)
    assert (caught.value.status, caught.value.code) == (410, "artifact_expired")


def test_content_path_refuses_unfinished_jobs_and_paths_outside_the_artifact_root(r, tmp_path):
    """An unfinished job's content is 409 (retryable for /jobs, final for /v1/videos); an artifact path that
    leaves the artifact root is 410; a completed job inside it gives its MP4."""
    caller = make_caller(r, tmp_path)
    queued, _ = job_service.create_job(caller, CreateJob(prompt="a"), JOBS, None, "")
    for words, code, retryable in ((JOBS, "job_not_completed", True), (VIDEOS, "video_not_completed", False)):
        with pytest.raises(ApiError) as caught:
            job_service.content_path(caller, queued["id"], words)
        assert (caught.value.status, caught.value.code, caught.value.retryable) == (409, code, retryable)
        assert caught.value.headers == {"x-should-retry": "false"}
    escaping, _ = job_service.create_job(caller, CreateJob(prompt="b"), JOBS, None, "")
    complete(r, tmp_path, escaping["id"], expires_at=time.time() + 60, artifact="../outside.mp4")
    with pytest.raises(ApiError) as caught:
        job_service.content_path(caller, escaping["id"], VIDEOS)
    assert (caught.value.status, caught.value.code) == (410, "artifact_expired")
    complete(r, tmp_path, queued["id"], expires_at=time.time() + 60)
    _, path = job_service.content_path(caller, queued["id"], JOBS)
    assert path == (tmp_path / queued["id"] / "video.mp4").resolve()


def test_list_page_refuses_another_owners_cursor_and_pages_without_overlap(r, tmp_path):
    """Pages of two follow on from last_id without overlap; a cursor that is not the caller's is 400
    invalid_cursor, and a bad order or status is 400 invalid_request."""
    mine = make_caller(r, tmp_path)
    made = [job_service.create_job(mine, CreateJob(prompt=str(i)), JOBS, None, "")[0]["id"] for i in range(3)]
    theirs, _ = job_service.create_job(make_caller(r, tmp_path, owner="owner-b"), CreateJob(prompt="x"), JOBS,
                                       None, "")

    def render(record, position):
        return {"id": record["id"], "position": position}

    first = job_service.list_page(mine, JOBS, render, limit=2, after=None, order="asc")
    second = job_service.list_page(mine, JOBS, render, limit=2, after=first["last_id"], order="asc")
    assert [d["id"] for d in first["data"] + second["data"]] == made
    assert first["has_more"] and not second["has_more"] and [d["position"] for d in first["data"]] == [1, 2]
    for kwargs, code in (({"after": theirs["id"]}, "invalid_cursor"), ({"order": "up"}, "invalid_request"),
                         ({"status": "done"}, "invalid_request")):
        with pytest.raises(ApiError) as caught:
            job_service.list_page(mine, JOBS, render, **{"limit": 2, "after": None, "order": "asc", **kwargs})
        assert (caught.value.status, caught.value.code) == (400, code)


@pytest.mark.parametrize(("text", "digits_only", "expected"), [("5", True, 5), (" 5", False, 5), (" 5", True, None),
                                                               ("0", False, None), ("101", True, None),
                                                               ("²", True, None), ("x", False, None)])
def test_page_limit_reads_1_to_100(text, digits_only, expected):
    """`limit` is 1..100; /v1/videos (digits_only) refuses what only int() would read; anything else is 400."""
    if expected is not None:
        assert job_service.page_limit(text, digits_only=digits_only) == expected
        return
    with pytest.raises(ApiError) as caught:
        job_service.page_limit(text, digits_only=digits_only)
    assert (caught.value.status, caught.value.code) == (400, "invalid_request")
    assert caught.value.message == f"limit: expected an integer 1..100, found {text!r}"


def test_a_request_over_the_fleets_capacity_is_422_and_writes_nothing(r, tmp_path):
    """With a live worker advertising 3000 rows (2896 through the routing ladder), a 256x128 15 s request (5654
    rows) is 422 exceeds_worker_capacity naming both figures, and nothing is written (no record, index entry or Idempotency-Key claim left); a 4 s one
    (2404 rows) is queued. With no worker advertising anything, the large one is accepted."""
    from h3batch.core import capacity

    caller = make_caller(r, tmp_path)
    large = CreateJob(prompt="rain", width=256, height=128, seconds=15)
    record, _ = job_service.create_job(caller, large, JOBS, None, "")  # nothing advertised: accepted
    assert record["status"] == "queued"
    capacity.record(r, "w1", 3000)
    with pytest.raises(ApiError) as caught:
        job_service.create_job(caller, large, JOBS, "key-1", "fp")
    error = caught.value
    assert (error.status, error.code, error.retryable) == (422, "exceeds_worker_capacity", False)
    assert "5654 rows" in error.message and "2896 rows" in error.message and "live worker" in error.message
    assert r.zcard(keys.JOBS_INDEX) == 1 and r.zcard(keys.QUEUE) == 1
    assert not list(r.scan_iter(match="h3b:idem:*"))
    small, _ = job_service.create_job(caller, CreateJob(prompt="rain", width=256, height=128, seconds=4), VIDEOS,
                                      "key-1", "fp2")
    assert small["status"] == "queued" and r.zcard(keys.QUEUE) == 2


def test_unknown_field_message_lists_every_accepted_field():
    """An unknown /jobs field is 400 unsupported_parameter naming it and listing every field the model accepts,
    aspect_ratio among them (the list is read from CreateJob, so a new field can never be left out)."""
    from h3batch.api.job_service import FieldError, validate_create
    from h3batch.api.schemas import CreateJob

    with pytest.raises(FieldError) as refused:
        validate_create({"prompt": "rain", "bogus": 1}, max_prompt_chars=100, canvas=None)
    assert refused.value.code == "unsupported_parameter" and refused.value.field == "bogus"
    listed = refused.value.message.split("(accepted: ", 1)[1].rstrip(")").split(", ")
    assert listed == [*CreateJob.model_fields, "first_frame", "last_frame", "references"] and "aspect_ratio" in listed
