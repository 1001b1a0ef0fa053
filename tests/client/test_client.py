"""h3batch.client against the live stack: create / wait (events, long polls) / download (also resumed) / list
pages / cancel / delete, batches from an iterable and a file, one exception per code, and the retries: a create whose
answer was lost makes one job, a 429's Retry-After is waited out. The async client does the same calls."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
import zipfile
from datetime import datetime, timedelta, timezone

import pytest
import requests

from h3batch.client import (APIError, AsyncClient, BadRequest, BatchFileError, Client, InvalidBatch, Job,
                            JobCancelled, JobNotFound, NotFound, RetryPolicy, Unauthorized, UnsupportedSize, Usage)
from h3batch.client.protocol import etag_path, partial_path
from h3batch.worker.h3.mp4 import probe_mp4
from tests.api.conftest import KEY_A, KEY_B, auth

CANVAS = {"seconds": 4, "width": 256, "height": 128}
FAST_RETRY = RetryPolicy(attempts=4, backoff_s=0.05)


def _unique(text: str) -> str:
    return f"{text} {uuid.uuid4().hex[:8]}"


def test_create_wait_on_events_and_download(stack, tmp_path):
    """wait() follows the event stream to `completed` (stages and non-decreasing progress on the way), returns the
    typed job, and download() saves a decodable MP4 of the asked size."""
    events = []
    with Client(stack.base, KEY_A) as client:
        job = client.create("a cello note", seed=77, **CANVAS)
        assert isinstance(job, Job) and job.status.value in ("queued", "in_progress")
        done = client.wait(job, on_event=events.append)
        size = client.download(done, tmp_path / "x.mp4")
    assert done.status.value == "completed" and done.seed == 77 and done.progress == 1.0
    names = [e.event for e in events]
    assert names[-1] == "completed" and "stage" in names and all(e.id for e in events)
    assert {"denoise", "decode"} <= {e.data.get("stage") for e in events}
    progress = [e.data["progress"] for e in events if "progress" in e.data]
    assert progress == sorted(progress)
    info = probe_mp4(tmp_path / "x.mp4")
    assert (info["width"], info["height"], info["frames"]) == (256, 128, 107)
    assert size == (tmp_path / "x.mp4").stat().st_size and not partial_path(tmp_path / "x.mp4").exists()


def test_wait_by_long_polls(stack):
    """With the event stream off, wait() long-polls GET /jobs/{id}?wait= until the job completes."""
    seen = []
    with Client(stack.base, KEY_A) as client:
        done = client.wait(client.create("a bell", **CANVAS).id, use_events=False, on_event=seen.append)
    assert done.status.value == "completed"
    assert seen and {e.event for e in seen} == {"poll"} and seen[-1].data["status"] == "completed"


def test_download_continues_a_partial_file(stack, tmp_path):
    """A partial file with its ETag is continued with a Range request: the server resumes at its size and the
    finished file equals a whole download."""
    with Client(stack.base, KEY_A) as client:
        job = client.wait(client.create("a drum", **CANVAS))
        whole = tmp_path / "whole.mp4"
        client.download(job, whole)
        data = whole.read_bytes()
        out = tmp_path / "resumed.mp4"
        partial_path(out).write_bytes(data[: len(data) // 2])
        etag = requests.head(f"{stack.base}/jobs/{job.id}/content", headers=auth(), timeout=30).headers["ETag"]
        etag_path(out).write_text(etag)
        size, resumed_from = client.fetch_file(f"/jobs/{job.id}/content", out)
    assert resumed_from == len(data) // 2 and size == len(data)
    assert out.read_bytes() == data and not partial_path(out).exists() and not etag_path(out).exists()


def test_list_pages_cancel_and_delete(stack):
    """list() pages with `after`; iter_jobs() walks every page once; a queued job cancels at once (and wait raises
    JobCancelled); a deleted job is JobNotFound, a NotFound."""
    with Client(stack.base, KEY_A) as client:
        blocker = client.create("a long hum", **CANVAS)
        victim = client.create("never rendered", **CANVAS)
        cancelled = client.cancel(victim)
        assert cancelled.status.value == "cancelled"
        with pytest.raises(JobCancelled) as failed:
            client.wait(victim)
        assert failed.value.job.id == victim.id and failed.value.code == "cancelled"
        first = client.list(limit=1)
        assert len(first.data) == 1 and first.has_more and first.last_id == first.data[0].id
        second = client.list(limit=1, after=first.last_id)
        assert second.data[0].id != first.data[0].id
        every = [job.id for job in client.iter_jobs(page_size=2)]
        assert len(every) == len(set(every)) and {blocker.id, victim.id} <= set(every)
        assert every.index(victim.id) < every.index(blocker.id)  # newest first
        client.wait(blocker)
        client.delete(victim)
        with pytest.raises(JobNotFound) as gone:
            client.get(victim)
    assert isinstance(gone.value, NotFound) and gone.value.status == 404


def test_each_error_code_is_its_own_exception(stack):
    """A refusal raises the class of its code, under its status class, with message, retryable and request id."""
    with Client(stack.base, KEY_A) as client:
        with pytest.raises(UnsupportedSize) as bad:
            client.create("x", width=100, height=128)
        assert isinstance(bad.value, BadRequest) and bad.value.status == 400 and not bad.value.retryable
        assert "width" in bad.value.message
    with Client(stack.base, "not-a-key") as stranger, pytest.raises(Unauthorized) as denied:
        stranger.list()
    assert isinstance(denied.value, APIError) and denied.value.code == "unauthorized"
    with Client(stack.base, KEY_B) as other, pytest.raises(JobNotFound):
        other.get(Client(stack.base, KEY_A).create("mine", **CANVAS).id)  # another key's job is not yours


def test_a_create_whose_answer_was_lost_makes_one_job(stack, front):
    """The first POST reaches the API and its answer is lost; the retry carries the same Idempotency-Key and the
    server replays the first job: exactly one job with this prompt exists."""
    prompt = _unique("a lost answer")
    front.script = ["drop"]
    with Client(front.base, KEY_A, retry=FAST_RETRY) as client:
        job = client.create(prompt, **CANVAS)
    posts = [s for s in front.seen if s[1] == "POST"]
    assert len(posts) == 2 and posts[0][3] == posts[1][3] and posts[0][3].startswith("h3batch-client-")
    listed = requests.get(f"{stack.base}/jobs?limit=100", headers=auth(), timeout=30).json()["data"]
    assert [j["id"] for j in listed if j["prompt"] == prompt] == [job.id]


def test_retry_after_is_waited_out(stack, front):
    """A 429 with `Retry-After: 1` is retried, and not before a second has passed."""
    front.script = ["429"]
    with Client(front.base, KEY_A, retry=FAST_RETRY) as client:
        job = client.create(_unique("a patient create"), **CANVAS)
    (t0, *_), (t1, *_) = [s for s in front.seen if s[1] == "POST"]
    assert t1 - t0 >= 1.0 and job.id


def test_no_retry_past_the_policy(stack, front):
    """Answers that stay 429 are raised as RateLimited once the attempts are spent (retryable, Retry-After kept)."""
    front.script = ["429", "429"]
    with Client(front.base, KEY_A, retry=RetryPolicy(attempts=2)) as client, pytest.raises(APIError) as limited:
        client.create("x", **CANVAS)
    assert limited.value.code == "rate_limited" and limited.value.retry_after == 1.0 and limited.value.retryable


def test_batch_from_an_iterable_with_progress_and_archive(stack, tmp_path):
    """create_batch() takes any iterable of requests; wait_batch() hands each look to the callback until the batch
    is finished; the results are typed and the archive holds one MP4 per custom_id."""
    looks = []
    items = ({"prompt": f"a chime {n}", "custom_id": f"chime-{n}", **CANVAS} for n in range(2))
    with Client(stack.base, KEY_A) as client:
        batch = client.create_batch(items, metadata={"project": "tests"})
        assert batch.counts.total == 2
        done = client.wait_batch(batch, on_progress=looks.append, poll_s=0.2)
        results = client.batch_results(done)
        size, resumed = client.download_archive(done, tmp_path / "b.zip")
    assert done.status == "completed" and looks[-1].finished and looks[-1].counts.completed == 2
    assert [r.custom_id for r in results] == ["chime-0", "chime-1"] and {r.status for r in results} == {"completed"}
    assert resumed == 0 and size > 0
    with zipfile.ZipFile(tmp_path / "b.zip") as zf:
        assert {"chime-0.mp4", "chime-1.mp4"} <= set(zf.namelist())


def test_batch_from_a_file_and_a_refused_line(stack, tmp_path):
    """A JSONL file is read by the server's line rule; a refused line raises InvalidBatch naming it; a line that is
    no JSON is refused before anything is sent."""
    good = tmp_path / "ok.jsonl"
    good.write_text("\n".join(json.dumps({"prompt": f"a tap {n}", **CANVAS}) for n in range(3)) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "fine", **CANVAS}) + "\n" + json.dumps({"prompt": "x", "width": 100}) + "\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "fine"}\n{half\n')
    with Client(stack.base, KEY_A) as client:
        assert client.create_batch(good).counts.total == 3
        with pytest.raises(InvalidBatch) as refused:
            client.create_batch(bad)
        with pytest.raises(BatchFileError, match="broken.jsonl line 2"):
            client.create_batch(broken)
    assert [d["line"] for d in refused.value.details] == [2]


def test_async_client_does_the_same(stack, tmp_path):
    """AsyncClient: two jobs created and awaited together, one downloaded; a missing job is JobNotFound."""
    async def main():
        async with AsyncClient(stack.base, KEY_A) as client:
            jobs = [await client.create(f"a duet {n}", **CANVAS) for n in range(2)]
            done = await asyncio.gather(*(client.wait(job) for job in jobs))
            size = await client.download(done[0], tmp_path / "a.mp4")
            page = await client.list(limit=2)
            with pytest.raises(JobNotFound):
                await client.get("job_does_not_exist")
            return done, size, page

    done, size, page = asyncio.run(main())
    assert [j.status.value for j in done] == ["completed", "completed"]
    assert size == (tmp_path / "a.mp4").stat().st_size and probe_mp4(tmp_path / "a.mp4")["frames"] == 107
    assert {j.id for j in page.data} == {j.id for j in done}


def test_usage_and_webhook_events_through_both_clients(stack):
    """create() passes webhook_events (the job shows it; a completion it did not choose queues no delivery, so the
    unreachable URL is never called); usage() of Client and AsyncClient then reads the key's usage one completed job
    and its 4 s of video higher, and both clients agree."""
    with Client(stack.base, KEY_B) as client:
        deadline = time.monotonic() + 600  # hang guard: an earlier test's job of this key finishing would count
        while any(client.list(status=s, limit=1).data for s in ("queued", "in_progress")):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        before = client.usage()
        job = client.create(_unique("a gong"), webhook_url="http://127.0.0.1:9/never", webhook_events=["failed"],
                            **CANVAS)
        assert job.webhook_events == ["failed"] and job.webhook_url == "http://127.0.0.1:9/never"
        done = client.wait(job)
        today = datetime.now(timezone.utc).date()
        after = client.usage(today - timedelta(days=30), datetime.now(timezone.utc) + timedelta(minutes=10))

    async def read():
        async with AsyncClient(stack.base, KEY_B) as aclient:
            return await aclient.usage(int(time.time()) - 30 * 86_400)

    assert isinstance(after, Usage) and after.jobs.completed - before.jobs.completed == 1
    assert after.jobs.total - before.jobs.total == 1
    assert after.video_seconds - before.video_seconds == pytest.approx(4.0)
    assert after.gpu_seconds - before.gpu_seconds == pytest.approx(sum(done.model_extra["timings"].values()),
                                                                   abs=1e-5)
    assert after.days[-1].date in (today.isoformat(), (today + timedelta(days=1)).isoformat())
    assert asyncio.run(read()).jobs == after.jobs
    assert done.webhook_events == ["failed"] and not done.model_extra.get("webhook_deliveries")
