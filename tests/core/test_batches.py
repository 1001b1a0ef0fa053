"""core/batches.py on a real Redis: the feeder fills idle capacity only, round-robin across batches, skips items
cancelled while held; held items stay out of the queue cap and out of the reaper's re-sends; completion is stamped
once, with its webhook due-entry."""
from __future__ import annotations

import json
import time

import pytest

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


def test_held_items_count_against_the_queue_cap_but_not_the_reaper_and_cancelled_ones_are_never_released(
        scratch_redis):
    """30 held items fill a queue cap of 30 (issue 26 item 1: they used to count as nothing); the reaper leaves them
    alone; a cancelled or deleted item leaves the backlog and is never released."""
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(30), now=time.time() - 3600)
    job_ids = [job_id for job_id, _, _ in batches.items(r, batch_id)]
    single = JobSpec(prompt="single", seconds=4.0, width=128, height=32, seed=1)
    with pytest.raises(jobs.QueueFull):
        jobs.create_job(r, single, max_queued=30)
    jobs.create_job(r, single, max_queued=31)
    assert r.zcard(keys.BACKLOG) == 31
    resent: list[str] = []
    reaper.reap(r, resent.append, grace_s=1.0, record_ttl_s=60)
    assert not set(resent) & set(job_ids)  # an hour old and without messages, but held: not the reaper's
    jobs.request_cancel(r, job_ids[0], record_ttl_s=60)
    jobs.delete_job(r, job_ids[1])
    assert r.zcard(keys.BACKLOG) == 29
    assert batches.feed(r, lambda _: None, capacity=3) == job_ids[2:4]  # 3 minus the queued single job = 2
    assert r.zcard(keys.BACKLOG) == 29  # released items are still queued


def test_a_batch_is_admitted_whole_or_not_at_all(scratch_redis):
    """Over the queue cap, over the owner's active cap, or short of create tokens: Refused names the limit and
    nothing is written (no batch, no job, no counts, no token spent); another owner is not held back by the first
    one's active cap."""
    r = scratch_redis
    limits = batches.Admission(max_queued=10, max_active_per_key=6, creates_per_min=60)
    batches.create_batch(r, "o1", _items(5), limits=limits)
    rated = batches.Admission(creates_per_min=2)
    batches.create_batch(r, "o3", _items(3, "o3"), limits=rated)  # a full bucket of 2 admits 3, leaving 1 in debt
    written = sorted(k for k in r.keys("*") if not k.startswith("h3b:rate:"))
    counts = r.hgetall(keys.METRICS_JOBS), r.hgetall(keys.METRICS_BATCHES)
    tokens = r.hget(keys.rate_bucket("o1", "creates"), "tokens")
    with pytest.raises(batches.Refused) as refused:
        batches.create_batch(r, "o1", _items(2), limits=limits)
    assert refused.value.limit == "too_many_active_jobs" and refused.value.count == 5
    with pytest.raises(batches.Refused) as refused:
        batches.create_batch(r, "o2", _items(6, "o2"), limits=limits)
    assert refused.value.limit == "queue_full" and refused.value.count == 8
    with pytest.raises(batches.Refused) as refused:
        batches.create_batch(r, "o3", _items(1, "o3"), limits=rated)
    assert refused.value.limit == "rate_limited" and refused.value.retry_after_s >= 50  # 2 tokens short, 1 per 30 s
    with pytest.raises(jobs.TooManyActive):
        jobs.create_job(r, JobSpec(prompt="s", seconds=4.0, width=128, height=32, seed=1, owner="o1"),
                        max_active_per_key=5)
    assert sorted(k for k in r.keys("*") if not k.startswith("h3b:rate:")) == written
    assert (r.hgetall(keys.METRICS_JOBS), r.hgetall(keys.METRICS_BATCHES)) == counts
    assert r.hget(keys.rate_bucket("o1", "creates"), "tokens") == tokens
    assert float(r.hget(keys.rate_bucket("o3", "creates"), "tokens")) < 0
    batches.create_batch(r, "o2", _items(2, "o2"), limits=limits)
    assert r.zcard(keys.BACKLOG) == 10


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


def _batch_keys(r, batch_id: str) -> list[str]:
    return sorted(r.scan_iter(match=f"h3b:batch:{batch_id}*"))


def test_cancel_and_finish_after_a_delete_leave_nothing_behind(scratch_redis):
    """The interleaving of the issue's race (the cancel's ownership read passed, then DELETE ran): the cancel finds
    no batch and writes nothing; no stub hash, no finished count, no CRC hash; a second DELETE finds nothing."""
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(3))
    job_ids = [job_id for job_id, _, _ in batches.items(r, batch_id)]
    assert batches.delete(r, batch_id, "o1") == job_ids
    counted = r.hgetall(keys.METRICS_BATCHES)
    assert batches.cancel(r, batch_id, record_ttl_s=60) is batches.CancelOutcome.GONE
    assert batches.check_finished(r, batch_id, record_ttl_s=60) is False
    batches.remember_crc(r, batch_id, job_ids[0], 1234, 10)
    assert _batch_keys(r, batch_id) == [] and r.hgetall(keys.METRICS_BATCHES) == counted
    assert batches.load_batch(r, batch_id) is None and batches.delete(r, batch_id, "o1") is None
    assert not any(r.exists(keys.job(job_id)) for job_id in job_ids)
    assert r.zscore(keys.owner_batches("o1"), batch_id) is None and r.zscore(keys.BATCHES_OPEN, batch_id) is None


def test_a_stub_left_by_an_older_cancel_reads_as_no_batch(scratch_redis):
    """A hash without the batch's `id` (what the racing cancel used to leave for 24 h) is no batch: not loaded, not
    stamped, not cancelled, and the owner's list skips it."""
    r = scratch_redis
    batch_id = batches.new_batch_id()
    r.hset(keys.batch(batch_id), mapping={"cancel_requested": "1"})
    r.zadd(keys.owner_batches("o1"), {batch_id: 1})
    assert batches.load_batch(r, batch_id) is None
    assert batches.check_finished(r, batch_id, record_ttl_s=60) is False
    assert batches.cancel(r, batch_id, record_ttl_s=60) is batches.CancelOutcome.GONE
    assert batches.list_batches(r, "o1", limit=10) == ([], False)
    assert r.hgetall(keys.batch(batch_id)) == {"cancel_requested": "1"} and r.ttl(keys.batch(batch_id)) == -1


def test_cancel_of_a_finished_batch_is_refused_and_delete_checks_the_owner(scratch_redis):
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(1))
    assert batches.cancel(r, batch_id, record_ttl_s=60) is batches.CancelOutcome.REQUESTED
    assert batches.load_batch(r, batch_id)["status"] == "cancelled"
    assert batches.cancel(r, batch_id, record_ttl_s=60) is batches.CancelOutcome.FINISHED
    assert batches.delete(r, batch_id, "o2") is None and batches.load_batch(r, batch_id) is not None
