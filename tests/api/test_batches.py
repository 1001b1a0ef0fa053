"""POST /batches and its reads against the real stack (gunicorn API, Redis, one Celery worker on the tiny release):
JSON and JSONL submission, refusals by line and field with nothing queued, skip mode, Idempotency-Key, ownership,
results in input order, cancel, delete, the batch.completed webhook, /openapi.json, a 20-item batch run to its
archive (unzipped, every MP4 decoded with PyAV, reassembled from Ranges), and fairness by timestamps: a single job
submitted while a batch waits starts after at most the one job already running on the (single) worker."""
from __future__ import annotations

import io
import json
import os
import time
import zipfile
from pathlib import Path

import av
import requests

from tests.api.conftest import KEY_A, KEY_B, auth, key_id, wait_job
from tests.api.test_webhooks import verify
from tests.service_stack import wait_batch

SMALL = {"width": 128, "height": 32, "seconds": 4}
ITEMS = int(os.environ.get("BATCH_TEST_ITEMS", "20"))
"""Items of the run-to-archive batch: the issue's 20 (about 30 s alone on 2 cores). A smaller number only for a
quick look on a machine other jobs are loading (renders then take many times longer)."""


def _batch(base: str, key_headers: dict | None = None, **body) -> requests.Response:
    return requests.post(f"{base}/batches", json=body, headers=key_headers or auth(), timeout=30)


def _jsonl(base: str, text: str, headers: dict | None = None, **fields) -> requests.Response:
    return requests.post(f"{base}/batches", files={"file": ("prompts.jsonl", text.encode(), "application/jsonl")},
                         data=fields, headers=headers or auth(), timeout=30)


def _results(base: str, batch_id: str) -> list[dict]:
    reply = requests.get(f"{base}/batches/{batch_id}/results", headers=auth(), timeout=60)
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in reply.text.splitlines()]


def _idle(rc) -> None:
    """Nothing queued or running (earlier tests' jobs done), so what the test counts below is its own. A hang guard,
    not a time bound: it fails loudly instead of going on with an earlier test's job still in the queue (it used to
    give up after 120 s and let the test go on)."""
    deadline = time.monotonic() + 600
    while rc.zcard("h3b:queue") + rc.zcard("h3b:running"):
        assert time.monotonic() < deadline, (rc.zrange("h3b:queue", 0, -1), rc.zrange("h3b:running", 0, -1))
        time.sleep(0.2)


def _job_count(rc, owner: str) -> int:
    return int(rc.zcard(f"h3b:owner:{owner}:jobs"))


def test_refused_lines_are_reported_by_line_and_field_and_nothing_is_queued(stack, rc):
    owner = key_id(KEY_A)
    before, batches_before = _job_count(rc, owner), rc.zcard(f"h3b:owner:{owner}:batches")
    reply = _batch(stack.base, requests=[{"prompt": "ok", **SMALL}, {"prompt": "x", "width": 129, "height": 32},
                                         {"prompt": ""}, {"prompt": "y", "colour": "red"}, "not an object",
                                         {"prompt": "z", "webhook_url": "http://10.0.0.1/x"}])
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_batch" and "nothing was queued" in error["message"]
    assert [(d["line"], d["field"]) for d in error["details"]] == [
        (2, "width"), (3, "prompt"), (4, "colour"), (5, "body"), (6, "webhook_url")]
    # JSONL: file line numbers (a blank line keeps the count), bad JSON, duplicate and malformed custom_id
    text = ('{"prompt": "a", "custom_id": "c1", "width": 128, "height": 32}\n\n'
            '{"prompt": "b", "custom_id": "c1"}\n{not json\n{"prompt": "d", "custom_id": "../x"}\n'
            '{"prompt": "e", "seconds": 99}\n')
    reply = _jsonl(stack.base, text)
    assert reply.status_code == 422, reply.text
    assert [(d["line"], d["field"]) for d in reply.json()["error"]["details"]] == [
        (3, "custom_id"), (4, "body"), (5, "custom_id"), (6, "seconds")]
    assert _job_count(rc, owner) == before and rc.zcard(f"h3b:owner:{owner}:batches") == batches_before
    too_many = _batch(stack.base, requests=[{"prompt": "p"}] * 1001)
    assert too_many.status_code == 400 and too_many.json()["error"]["code"] == "batch_too_large"
    for body, code in [({"requests": []}, "invalid_request"), ({"requests": [{"prompt": "p"}], "on_invalid": "x"},
                       "invalid_request"), ({"requests": [{"prompt": "p"}], "extra": 1}, "unsupported_parameter"),
                       ({"requests": [{"prompt": "p"}], "metadata": {"k": 1}}, "invalid_request")]:
        reply = _batch(stack.base, **body)
        assert (reply.status_code, reply.json()["error"]["code"]) == (400, code), (body, reply.text)


def test_skip_mode_idempotency_ownership_and_listing(stack, rc):
    body = {"requests": [{"prompt": "a bell", **SMALL, "custom_id": "bell"}, {"prompt": "x", "width": 129},
                         {"prompt": "a drum", **SMALL}], "on_invalid": "skip", "metadata": {"set": "skip"}}
    headers = {**auth(), "Idempotency-Key": f"skip-{time.time()}"}
    earlier = _batch(stack.base, requests=[{"prompt": "an earlier batch", **SMALL}])
    assert earlier.status_code == 202, earlier.text
    first = _batch(stack.base, headers, **body)
    assert first.status_code == 202, first.text
    batch = first.json()
    assert first.headers["Location"] == f"/batches/{batch['id']}"
    assert batch["object"] == "batch" and batch["counts"]["total"] == 2 and batch["metadata"] == {"set": "skip"}
    assert [(s["line"], s["field"]) for s in batch["skipped"]] == [(2, "width")]
    again = _batch(stack.base, headers, **body)
    assert again.status_code == 202 and again.json()["id"] == batch["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    reused = _batch(stack.base, headers, **{**body, "metadata": {"set": "other"}})
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"
    # results keep input positions: index 0 and 2 (line 2 was skipped)
    lines = _results(stack.base, batch["id"])
    assert [(x["index"], x["custom_id"]) for x in lines] == [(0, "bell"), (2, None)]
    # another key sees nothing of it
    for method, path in [("get", ""), ("get", "/results"), ("get", "/archive"), ("post", "/cancel"), ("delete", "")]:
        reply = requests.request(method, f"{stack.base}/batches/{batch['id']}{path}", headers=auth(KEY_B), timeout=60)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "batch_not_found", (method, path)
    assert batch["id"] not in [b["id"] for b in requests.get(f"{stack.base}/batches", headers=auth(KEY_B),
                                                            timeout=60).json()["data"]]
    page = requests.get(f"{stack.base}/batches?limit=1", headers=auth(), timeout=60).json()
    assert page["data"][0]["id"] == batch["id"] and page["has_more"] is True
    older = requests.get(f"{stack.base}/batches?limit=1&after={batch['id']}", headers=auth(), timeout=60)
    assert older.status_code == 200 and older.json()["data"][0]["id"] == earlier.json()["id"]
    foreign = requests.get(f"{stack.base}/batches?after={batch['id']}", headers=auth(KEY_B), timeout=60)
    assert foreign.status_code == 400 and foreign.json()["error"]["code"] == "invalid_cursor"
    done = wait_batch(stack.base, batch["id"], auth())
    assert done["status"] == "completed" and done["counts"]["completed"] == 2 and done["progress"] == 1.0

    # delete: the batch, its jobs and their files go
    job_ids = [x["job_id"] for x in _results(stack.base, batch["id"])]
    dirs = [stack_artifacts(stack) / job_id for job_id in job_ids]
    assert all((d / "video.mp4").is_file() for d in dirs)
    gone = requests.delete(f"{stack.base}/batches/{batch['id']}", headers=auth(), timeout=60)
    assert gone.status_code == 200 and gone.json() == {"id": batch["id"], "object": "batch.deleted", "deleted": True}
    assert requests.get(f"{stack.base}/batches/{batch['id']}", headers=auth(), timeout=60).status_code == 404
    assert all(requests.get(f"{stack.base}/jobs/{j}", headers=auth(), timeout=60).status_code == 404 for j in job_ids)
    assert not any(d.exists() for d in dirs)
    assert not rc.exists(f"h3b:batch:{batch['id']}", f"h3b:batch:{batch['id']}:items")


def stack_artifacts(stack) -> Path:
    return Path(stack.env["H3BATCH_ARTIFACTS_DIR"])


def test_twenty_item_batch_runs_to_its_archive_and_webhook(stack, rc, receiver):  # ~30 s: the batch
    """20 items from a JSONL upload (custom_id on every other line) run to completion; results come in input order;
    the archive unzips to 20 MP4s that PyAV decodes plus manifest.jsonl, byte-identical when reassembled from
    Ranges; the batch.completed webhook arrives signed like a job's."""
    _idle(rc)
    lines = [json.dumps({"prompt": f"clip {i}: wind over a field", **SMALL, "seed": i,
                         **({"custom_id": f"clip-{i}"} if i % 2 == 0 else {})}) for i in range(ITEMS)]
    reply = _jsonl(stack.base, "\n".join(lines) + "\n", metadata=json.dumps({"run": "twenty"}),
                   webhook_url=receiver.url + "/batch-hook")
    assert reply.status_code == 202, reply.text
    batch_id = reply.json()["id"]
    # The ETA by state, never by its size (how large it is depends on how busy this machine is; the arithmetic is
    # tests/core/test_batches.py::test_eta_comes_from_measured_job_times): unknown before any item completed, a
    # number once one has while items remain, 0.0 when none is left.
    etas_while_measured = []
    deadline = time.monotonic() + 60 * ITEMS
    while True:
        batch = requests.get(f"{stack.base}/batches/{batch_id}", headers=auth(), timeout=60).json()
        assert 0.0 <= batch["progress"] <= 1.0
        assert sum(v for k, v in batch["counts"].items() if k != "total") == batch["counts"]["total"] == ITEMS
        active = batch["counts"]["queued"] + batch["counts"]["in_progress"]
        if batch["counts"]["completed"] == 0:
            assert batch["eta_s"] is None, batch
        elif active:
            etas_while_measured.append(batch["eta_s"])
        if batch["finished_at"] is not None:
            break
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    assert batch["status"] == "completed" and batch["counts"]["completed"] == ITEMS and batch["eta_s"] == 0.0
    assert all(isinstance(eta, float) and eta >= 0.0 for eta in etas_while_measured), etas_while_measured
    results = _results(stack.base, batch_id)
    assert [x["index"] for x in results] == list(range(ITEMS))
    assert [x["custom_id"] for x in results] == [f"clip-{i}" if i % 2 == 0 else None for i in range(ITEMS)]
    assert all(x["status"] == "completed" and x["content_url"] == f"/jobs/{x['job_id']}/content" for x in results)

    archive = requests.get(f"{stack.base}/batches/{batch_id}/archive", headers=auth(), timeout=60)
    assert archive.status_code == 200 and archive.headers["Content-Type"] == "application/zip"
    data = archive.content
    assert len(data) == int(archive.headers["Content-Length"])
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
        assert names[0] == "manifest.jsonl"
        manifest = [json.loads(x) for x in zf.read("manifest.jsonl").splitlines()]
        expected = [f"clip-{i}.mp4" if i % 2 == 0 else f"{i:04d}.mp4" for i in range(ITEMS)]
        assert [line.pop("file") for line in manifest] == expected and manifest == results
        assert names[1:] == expected
        for name, line in zip(expected, results):
            mp4 = zf.read(name)
            job_mp4 = requests.get(f"{stack.base}{line['content_url']}", headers=auth(), timeout=60).content
            assert mp4 == job_mp4
            with av.open(io.BytesIO(mp4)) as container:
                frames = sum(1 for _ in container.decode(video=0))
            with av.open(io.BytesIO(mp4)) as container:
                audio = sum(f.samples for f in container.decode(audio=0))
            assert frames > 0 and audio > 0, name

    # Range: pieces reassemble to the same bytes; If-Range with a stale tag sends the whole; past the end is 416
    etag, pieces, start, step = archive.headers["ETag"], [], 0, len(data) // 7 + 1
    while start < len(data):
        part = requests.get(f"{stack.base}/batches/{batch_id}/archive", timeout=30,
                            headers={**auth(), "Range": f"bytes={start}-{start + step - 1}", "If-Range": etag})
        assert part.status_code == 206, part.text
        assert part.headers["Content-Range"] == f"bytes {start}-{min(start + step, len(data)) - 1}/{len(data)}"
        pieces.append(part.content)
        start += step
    assert b"".join(pieces) == data
    tail = requests.get(f"{stack.base}/batches/{batch_id}/archive", headers={**auth(), "Range": "bytes=-100"},
                        timeout=30)
    assert tail.status_code == 206 and tail.content == data[-100:]
    stale = requests.get(f"{stack.base}/batches/{batch_id}/archive", timeout=30,
                         headers={**auth(), "Range": "bytes=0-9", "If-Range": '"stale"'})
    assert stale.status_code == 200 and stale.content == data
    past = requests.get(f"{stack.base}/batches/{batch_id}/archive", timeout=30,
                        headers={**auth(), "Range": f"bytes={len(data)}-"})
    assert past.status_code == 416 and past.headers["Content-Range"] == f"bytes */{len(data)}"
    assert requests.get(f"{stack.base}/batches/{batch_id}/archive", headers={**auth(), "If-None-Match": etag},
                        timeout=30).status_code == 304

    call = [c for c in receiver.wait_calls(1) if c["path"] == "/batch-hook"][0]
    body = verify(call)
    assert body["type"] == "batch.completed" and call["headers"]["webhook-id"] == f"msg_{batch_id}_batch.completed"
    assert body["data"]["id"] == batch_id and body["data"]["counts"]["completed"] == ITEMS
    assert body["data"]["metadata"] == {"run": "twenty"} and "owner" not in body["data"]


def test_single_job_is_not_starved_by_a_queued_batch_and_cancel_stops_the_rest(stack, rc):
    """Fairness by timestamps: with a 30-item batch waiting on one worker, a single job submitted mid-render starts
    as soon as the item then running finishes: no batch item starts between its submission and its start. Then
    cancel: every item not finished is cancelled and the batch ends `cancelled`."""
    _idle(rc)
    assert int(rc.eval("return #redis.call('keys', 'h3b:worker:*')", 0)) == 1  # the bound is per worker
    reply = _batch(stack.base, requests=[{"prompt": f"batch item {i}", **SMALL} for i in range(30)])
    assert reply.status_code == 202, reply.text
    batch_id = reply.json()["id"]
    # At most one item released per worker. Both sets read in one MULTI: two separate reads can count the same item
    # twice, queued at the first and running at the second (make test-latest saw 1 + 1 on 2026-12-06).
    with rc.pipeline(transaction=True) as pipe:
        queued, running = pipe.zcard("h3b:queue").zcard("h3b:running").execute()
    assert queued + running <= 1, (queued, running)
    deadline = time.monotonic() + 120
    while requests.get(f"{stack.base}/batches/{batch_id}", headers=auth(),
                       timeout=60).json()["counts"]["in_progress"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    single = requests.post(f"{stack.base}/jobs", json={"prompt": "an interactive job", **SMALL}, headers=auth(),
                           timeout=60).json()
    single = wait_job(stack.base, single["id"], timeout_s=300)
    assert single["status"] == "completed"
    cancelled = requests.post(f"{stack.base}/batches/{batch_id}/cancel", headers=auth(), timeout=30)
    assert cancelled.status_code == 200 and cancelled.json()["object"] == "batch"

    items = [requests.get(f"{stack.base}/jobs/{x['job_id']}", headers=auth(), timeout=60).json()
             for x in _results(stack.base, batch_id)]
    submitted, started = single["created_at"], single["started_at"]
    running_at_submit = [j for j in items if j["started_at"] and j["started_at"] <= submitted
                         and (j["finished_at"] or float("inf")) > submitted]
    started_while_waiting = [j for j in items if j["started_at"] and submitted < j["started_at"] < started]
    assert len(running_at_submit) <= 1 and not started_while_waiting, (running_at_submit, started_while_waiting)
    # With the check above: it was the next job the worker took once the item running at its submission finished
    # (an order of events, not a time bound: a loaded machine may take any time between the two).
    freed = max((j["finished_at"] for j in running_at_submit), default=submitted)
    assert started >= freed
    print(f"\nFAIRNESS single job waited {started - submitted:.2f} s; the item running at its submission finished "
          f"{freed - submitted:.2f} s after it; batch items started in between: {len(started_while_waiting)}")

    done = wait_batch(stack.base, batch_id, auth(), timeout_s=300)
    assert done["status"] == "cancelled" and done["counts"]["cancelled"] >= 25
    assert done["counts"]["queued"] == done["counts"]["in_progress"] == 0
    again = requests.post(f"{stack.base}/batches/{batch_id}/cancel", headers=auth(), timeout=60)
    assert again.status_code == 409 and again.json()["error"]["code"] == "batch_already_finished"
    assert not rc.exists(f"h3b:batch:{batch_id}:pending") and rc.zscore("h3b:batches:open", batch_id) is None
    # the archive of a cancelled batch holds what did complete
    archive = requests.get(f"{stack.base}/batches/{batch_id}/archive", headers=auth(), timeout=30)
    with zipfile.ZipFile(io.BytesIO(archive.content)) as zf:
        assert len(zf.namelist()) == 1 + done["counts"]["completed"]


def test_openapi_lists_the_batch_routes(stack):
    doc = requests.get(f"{stack.base}/openapi.json", timeout=60).json()
    for path, methods in {"/batches": {"post", "get"}, "/batches/{batch_id}": {"get", "delete"},
                          "/batches/{batch_id}/cancel": {"post"}, "/batches/{batch_id}/results": {"get"},
                          "/batches/{batch_id}/archive": {"get"}}.items():
        assert methods <= set(doc["paths"][path]), path
    assert "multipart/form-data" in doc["paths"]["/batches"]["post"]["requestBody"]["content"]
