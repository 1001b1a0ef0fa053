"""core/batches.py on a real Redis: the feeder fills idle capacity only, round-robin across batches, skips items
cancelled while held; held items stay out of the queue cap and out of the reaper's re-sends; completion is stamped
once, with its webhook due-entry."""
from __future__ import annotations

import json
import time

from h3batch.core import batches, jobs, keys
from h3batch.core.jobs import JobSpec, JobStatus
from h3batch.worker import reaper


def _items(n: int, owner: str = "o1") -> list[batches.Item]:
    return [batches.Item(JobSpec(prompt=f"p{i}", seconds=4.0, width=128, height=32, seed=i, owner=owner), index=i)
            for i in range(n)]


def _beat(r, name: str, state: str = "READY") -> None:
    r.set(keys.worker(name), json.dumps({"name": name, "state": state, "ts": time.time()}), ex=15)


def test_feeder_fills_idle_workers_only_round_robin_across_batches(scratch_redis):
    r = scratch_redis
    first = batches.create_batch(r, "o1", _items(5))
    second = batches.create_batch(r, "o2", _items(5, "o2"))
    assert r.zcard(keys.QUEUE) == 0  # held: nothing in the render queue, nothing sent
    sent: list[str] = []
    assert batches.feed(r, sent.append) == []  # no live worker: no capacity
    _beat(r, "w1")
    _beat(r, "w2")
    _beat(r, "w3", "STARTING")  # not consuming yet: not counted
    released = batches.feed(r, sent.append)
    assert released == sent and len(released) == 2
    owners = {jobs.load_job(r, job_id)["batch_id"] for job_id in released}
    assert owners == {first, second}  # one from each batch, not two from the first
    assert batches.feed(r, sent.append) == []  # both workers have work waiting
    # a single job queued ahead of capacity holds batches back
    jobs.claim_job(r, released[0], "w1", release_id="x", record_ttl_s=60)
    jobs.create_job(r, JobSpec(prompt="single", seconds=4.0, width=128, height=32, seed=1, owner="o3"))
    assert batches.feed(r, sent.append) == []


def test_held_items_skip_the_queue_cap_and_the_reaper_and_cancelled_ones_are_never_released(scratch_redis):
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(30), now=time.time() - 3600)
    job_ids = [job_id for job_id, _, _ in batches.items(r, batch_id)]
    # the single-job cap (5 here) is not used up by 30 held items
    jobs.create_job(r, JobSpec(prompt="single", seconds=4.0, width=128, height=32, seed=1), max_queued=5)
    resent: list[str] = []
    reaper.reap(r, resent.append, grace_s=1.0, record_ttl_s=60)
    assert not set(resent) & set(job_ids)  # an hour old and without messages, but held: not the reaper's
    jobs.request_cancel(r, job_ids[0], record_ttl_s=60)
    jobs.delete_job(r, job_ids[1])
    assert batches.feed(r, lambda _: None, capacity=3) == job_ids[2:4]  # 3 minus the queued single job = 2


def test_completion_is_stamped_once_with_its_webhook_and_cancel_cancels_the_rest(scratch_redis):
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(3), webhook_url="http://127.0.0.1:9/hook")
    job_ids = [job_id for job_id, _, _ in batches.items(r, batch_id)]
    jobs.transition(r, job_ids[0], JobStatus.IN_PROGRESS)
    jobs.transition(r, job_ids[0], JobStatus.COMPLETED, fields={"started_at": 1.0, "finished_at": 3.0})
    assert batches.check_finished(r, batch_id, record_ttl_s=60) is False
    batches.cancel(r, batch_id, record_ttl_s=60)
    assert [jobs.load_job(r, j)["status"] for j in job_ids] == ["completed", "cancelled", "cancelled"]
    batch = batches.load_batch(r, batch_id)
    assert batch["finished_at"] is not None and batch["status"] == "cancelled"
    assert r.zscore(keys.WEBHOOKS_DUE, f"{batch_id}:batch.completed") is not None
    assert 0 < r.ttl(keys.batch(batch_id)) <= 60 and r.zscore(keys.BATCHES_OPEN, batch_id) is None
    assert batches.check_finished(r, batch_id, record_ttl_s=60) is False  # once
    shown = batches.summary(batch, batches.item_records(r, job_ids), workers=1)
    assert shown["counts"] == {"total": 3, "queued": 0, "in_progress": 0, "completed": 1, "failed": 0,
                               "cancelled": 2}
    assert shown["progress"] == 1.0 and shown["eta_s"] == 0.0


def test_eta_comes_from_measured_job_times(scratch_redis):
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(4))
    job_ids = [job_id for job_id, _, _ in batches.items(r, batch_id)]
    batch = batches.load_batch(r, batch_id)
    assert batches.summary(batch, batches.item_records(r, job_ids), workers=2)["eta_s"] is None
    jobs.transition(r, job_ids[0], JobStatus.IN_PROGRESS)
    jobs.transition(r, job_ids[0], JobStatus.COMPLETED, fields={"started_at": 10.0, "finished_at": 16.0})
    shown = batches.summary(batch, batches.item_records(r, job_ids), workers=2)
    assert shown["status"] == "in_progress" and shown["progress"] == 0.25
    assert shown["eta_s"] == 9.0  # 6 s per job x 3 left / 2 workers
