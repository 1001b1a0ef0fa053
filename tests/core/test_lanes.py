"""core/lanes.py on a real Redis: a batch-lane single job is held and fed like a batch item, the claim counts the
interactive streak only while batch work is held, the feeder promotes one held job once the streak is reached, and
the promoted job's message lands in kombu's first priority list while every other one goes to the next."""
from __future__ import annotations

import json
import time

from h3batch.core import batches, broker, jobs, keys, lanes, routing
from h3batch.core.celery_app import make_celery, send_render
from h3batch.core.jobs import JobSpec
from tests.conftest import SCRATCH_DB


def _spec(prompt: str, priority: str = "interactive") -> JobSpec:
    return JobSpec(prompt=prompt, seconds=4.0, width=128, height=32, seed=1, owner="o1", priority=priority)


def _items(n: int) -> list[batches.Item]:
    return [batches.Item(_spec(f"item {i}"), index=i) for i in range(n)]


def _beat(r, name: str) -> None:
    r.set(keys.worker(name), json.dumps({"name": name, "state": "READY", "ts": time.time()}), ex=15)


def _claim(r, job_id: str) -> None:
    assert jobs.claim_job(r, job_id, "w1", release_id="x", record_ttl_s=60) is not None


def test_a_batch_lane_single_job_is_held_and_fed_round_robin_with_the_batches(scratch_redis):
    r = scratch_redis
    batch_id = batches.create_batch(r, "o1", _items(2))
    held = jobs.create_job(r, _spec("single, batch lane", "batch"))
    interactive = jobs.create_job(r, _spec("single, interactive"))
    assert held["priority"] == "batch" and interactive["priority"] == "interactive"
    assert jobs.load_job(r, batches.items(r, batch_id)[0][0])["priority"] == "batch"
    assert r.zscore(keys.QUEUE, held["id"]) is None and r.zscore(keys.LANE_BATCH, held["id"]) is not None
    assert r.zscore(keys.BACKLOG, held["id"]) is not None  # it counts against the queue cap like a held item
    assert r.lrange(keys.BATCHES_ACTIVE, 0, -1) == [batch_id, lanes.LANE_MEMBER]
    jobs.create_job(r, _spec("another held one", "batch"))
    assert r.lrange(keys.BATCHES_ACTIVE, 0, -1) == [batch_id, lanes.LANE_MEMBER]  # one entry for the lane
    _claim(r, interactive["id"])
    released = batches.feed(r, lambda _: None, capacity=3)
    assert [jobs.load_job(r, j).get("batch_id") for j in released] == [batch_id, None]  # one from each entry
    assert released[1] == held["id"]


def test_the_streak_counts_interactive_starts_while_batch_work_is_held_and_the_feeder_promotes_one(scratch_redis):
    r = scratch_redis
    first = jobs.create_job(r, _spec("nothing held yet"))
    _claim(r, first["id"])
    assert r.get(keys.LANE_STREAK) == "0"  # no batch work held: no streak
    batch_id = batches.create_batch(r, "o1", _items(3))
    singles = [jobs.create_job(r, _spec(f"interactive {i}")) for i in range(3)]
    _claim(r, singles[0]["id"])
    _claim(r, singles[1]["id"])
    assert r.get(keys.LANE_STREAK) == "2"
    # every worker busy and interactive work queued: no idle capacity, so only the rule releases batch work
    assert batches.feed(r, lambda _: None, capacity=1, interactive_streak=3) == []
    _claim(r, singles[2]["id"])
    sent: list[str] = []
    promoted = batches.feed(r, sent.append, capacity=1, interactive_streak=3)
    assert promoted == sent and len(promoted) == 1
    assert jobs.load_job(r, promoted[0])["batch_id"] == batch_id and r.hget(keys.job(promoted[0]), "promoted_at")
    assert r.get(keys.LANE_STREAK) == "0"
    assert batches.feed(r, sent.append, capacity=1, interactive_streak=3) == []  # one per streak
    _claim(r, promoted[0])
    assert r.get(keys.LANE_STREAK) == "0"  # a batch start ends any streak


def test_a_promoted_job_is_sent_at_the_first_broker_priority_and_the_rest_at_the_next(scratch_redis, redis_url):
    r = scratch_redis
    sender = make_celery(f"{redis_url.rsplit('/', 1)[0]}/{SCRATCH_DB}")
    plain = jobs.create_job(r, _spec("interactive"))
    batch_id = batches.create_batch(r, "o1", _items(1))
    (item, _, _), = batches.items(r, batch_id)
    r.set(keys.LANE_STREAK, 5)
    assert batches.feed(r, lambda _: None, capacity=1, interactive_streak=5) == [item]
    queue = routing.queue_of(jobs.load_job(r, plain["id"]))
    assert send_render(sender, r, plain["id"]) == queue and send_render(sender, r, item) == queue
    first, *rest = broker.ready_lists(queue)
    steps = dict(zip(broker.KOMBU_PRIORITY_STEPS, rest))
    assert r.llen(first) == 1 and r.llen(steps[lanes.MESSAGE_PRIORITY]) == 1
    assert item in r.lindex(first, 0) and plain["id"] in r.lindex(steps[lanes.MESSAGE_PRIORITY], 0)
    assert broker.ready_depth(r, queue) == 2
