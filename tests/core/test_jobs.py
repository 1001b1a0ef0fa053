"""core/jobs.py against real Redis: the transition table, claims and leases, progress guards, and cancel races."""
from __future__ import annotations

import threading

import pytest

from h3batch.core import jobs, keys
from h3batch.core.jobs import JobSpec, JobStatus

SPEC = JobSpec(prompt="rain", seconds=4.0, width=256, height=128, seed=1)
TTL = 3600


@pytest.fixture
def r(scratch_redis):
    return scratch_redis


def test_create_writes_record_queue_and_index_together(r):
    """create_job writes the queued record, its queue zset entry and index entry; positions follow creation order."""
    a, b = jobs.create_job(r, SPEC), jobs.create_job(r, SPEC)
    assert a["status"] == "queued" and a["seed"] == 1 and a["attempt"] == 0
    assert r.exists(keys.job(a["id"])) and r.zscore(keys.JOBS_INDEX, a["id"]) is not None
    assert [jobs.queue_position(r, a["id"]), jobs.queue_position(r, b["id"])] == [1, 2]


@pytest.mark.parametrize("start, to, allowed", [
    (JobStatus.QUEUED, JobStatus.COMPLETED, False),
    (JobStatus.QUEUED, JobStatus.EXPIRED, False),
    (JobStatus.CANCELLED, JobStatus.IN_PROGRESS, False),
    (JobStatus.FAILED, JobStatus.COMPLETED, False),
    (JobStatus.COMPLETED, JobStatus.CANCELLED, False),
    (JobStatus.COMPLETED, JobStatus.EXPIRED, True),
    (JobStatus.IN_PROGRESS, JobStatus.COMPLETED, True),
    (JobStatus.QUEUED, JobStatus.CANCELLED, True),
])
def test_transition_obeys_the_table(r, start, to, allowed):
    """transition refuses (returns None, writes nothing) every move the lifecycle table forbids."""
    job = jobs.create_job(r, SPEC)
    r.hset(keys.job(job["id"]), "status", start.value)  # place the record in `start` directly
    result = jobs.transition(r, job["id"], to, record_ttl_s=TTL)
    assert (result is not None) is allowed
    assert r.hget(keys.job(job["id"]), "status") == (to.value if allowed else start.value)


def test_finishing_sets_ttl_removes_from_queue_and_publishes(r):
    """A finished status expires the record after the TTL, leaves the queue and publishes on the done channel."""
    job = jobs.create_job(r, SPEC)
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.done_channel(job["id"]))
    pubsub.get_message(timeout=1)
    done = jobs.transition(r, job["id"], JobStatus.CANCELLED, record_ttl_s=TTL)
    assert done["status"] == "cancelled" and done["finished_at"] is not None
    assert 0 < r.ttl(keys.job(job["id"])) <= TTL
    assert r.zscore(keys.QUEUE, job["id"]) is None
    message = pubsub.get_message(timeout=2)
    assert message and message["data"] == "cancelled"
    pubsub.close()


def test_claim_takes_the_lease_and_a_second_claim_is_refused(r):
    """The first claim moves the job to in_progress with attempt 1 under a lease; a duplicate delivery is refused
    and counted as lease contention."""
    job = jobs.create_job(r, SPEC)
    claimed = jobs.claim_job(r, job["id"], "w1", release_id="rel", record_ttl_s=TTL)
    assert claimed is not None
    record, holder = claimed
    assert record["status"] == "in_progress" and record["attempt"] == 1 and holder == "w1:1"
    assert r.get(keys.lease(job["id"])) == "w1:1" and 0 < r.pttl(keys.lease(job["id"])) <= 30_000
    assert jobs.claim_job(r, job["id"], "w2", release_id="rel", record_ttl_s=TTL) is None
    assert r.hget(keys.STATS, "lease_contention") == "1"


def test_lapsed_lease_allows_reclaim_until_attempts_run_out(r):
    """With the lease gone (worker died), a redelivery re-claims with attempt+1; past 3 attempts it fails
    worker_lost."""
    job = jobs.create_job(r, SPEC)
    for attempt in (1, 2, 3):
        record, holder = jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
        assert record["attempt"] == attempt
        r.delete(keys.lease(job["id"]))  # the worker died: its lease lapses
    assert jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL) is None
    failed = jobs.load_job(r, job["id"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "worker_lost"


def test_stale_attempt_cannot_write_progress_or_finish(r):
    """After a re-claim, the earlier attempt's progress writes and completion are refused."""
    job = jobs.create_job(r, SPEC)
    jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
    r.delete(keys.lease(job["id"]))
    jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
    assert jobs.update_progress(r, job["id"], 1, {"progress": 0.5}) is False
    assert jobs.transition(r, job["id"], JobStatus.COMPLETED, expect_attempt=1, record_ttl_s=TTL) is None
    assert jobs.update_progress(r, job["id"], 2, {"progress": 0.5}) is True
    assert jobs.transition(r, job["id"], JobStatus.COMPLETED, expect_attempt=2, record_ttl_s=TTL) is not None


def test_cancel_of_running_job_sets_the_flag_the_worker_polls(r):
    """Cancelling an in_progress job leaves its status to the worker but makes cancel_requested() true."""
    job = jobs.create_job(r, SPEC)
    jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
    assert jobs.cancel_requested(r, job["id"]) is False
    after = jobs.request_cancel(r, job["id"], record_ttl_s=TTL)
    assert after["status"] == "in_progress" and after["cancel_requested"] == "1"
    assert jobs.cancel_requested(r, job["id"]) is True


def test_deleted_record_reads_as_cancel_requested(r):
    """A deleted job makes the worker's should_cancel() true, so DELETE aborts a running render."""
    job = jobs.create_job(r, SPEC)
    jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
    assert jobs.delete_job(r, job["id"]) is True
    assert jobs.cancel_requested(r, job["id"]) is True


def test_concurrent_cancel_and_claim_have_exactly_one_winner(r):
    """Racing claim and cancel on the same queued job end in a consistent state: either cancelled and unclaimed,
    or claimed with the cancel flag set."""
    for _ in range(30):
        job = jobs.create_job(r, SPEC)
        barrier = threading.Barrier(2)
        out: dict[str, object] = {}

        def claim():
            barrier.wait()
            out["claim"] = jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)

        def cancel():
            barrier.wait()
            out["cancel"] = jobs.request_cancel(r, job["id"], record_ttl_s=TTL)

        threads = [threading.Thread(target=claim), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = jobs.load_job(r, job["id"])
        if out["claim"] is None:
            assert final["status"] == "cancelled" and final["attempt"] == 0
            assert not r.exists(keys.lease(job["id"]))
        else:
            assert final["status"] == "in_progress" and final["cancel_requested"] == "1"


def test_orphaned_running_lists_only_lease_less_in_progress_jobs(r):
    """The reconciler's query returns running jobs without a lease, and forgets jobs once they finish."""
    job = jobs.create_job(r, SPEC)
    _, holder = jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
    assert jobs.orphaned_running(r) == []
    r.delete(keys.lease(job["id"]))
    assert jobs.orphaned_running(r) == [job["id"]]
    record, _ = jobs.claim_job(r, job["id"], "w", release_id="rel", record_ttl_s=TTL)
    assert jobs.orphaned_running(r) == []
    jobs.transition(r, job["id"], JobStatus.COMPLETED, expect_attempt=record["attempt"], record_ttl_s=TTL)
    assert r.zscore(keys.RUNNING, job["id"]) is None


@pytest.mark.parametrize("chosen, to, scheduled", [
    ((), JobStatus.COMPLETED, True),
    ((), JobStatus.FAILED, True),
    (("completed",), JobStatus.COMPLETED, True),
    (("completed",), JobStatus.FAILED, False),
    (("failed", "cancelled"), JobStatus.COMPLETED, False),
    (("failed", "cancelled"), JobStatus.CANCELLED, True),
])
def test_the_finishing_transition_schedules_only_the_chosen_webhook_events(r, chosen, to, scheduled):
    """A job's `webhook_events` decides, in the transition that finishes it, whether its event is queued for
    delivery in h3b:webhooks:due; without the field every terminal event is."""
    job = jobs.create_job(r, JobSpec(prompt="rain", seconds=4.0, width=256, height=128, seed=1,
                                     webhook_url="http://127.0.0.1:9/hook", webhook_events=chosen))
    assert job.get("webhook_events") == (list(chosen) or None)
    if to is not JobStatus.CANCELLED:
        jobs.claim_job(r, job["id"], "w1", release_id="tiny", record_ttl_s=TTL)
    assert jobs.transition(r, job["id"], to, fields={"error": {"code": "x"}} if to is JobStatus.FAILED else None,
                           record_ttl_s=TTL) is not None
    assert (r.zscore(keys.WEBHOOKS_DUE, f"{job['id']}:{to.value}") is not None) is scheduled
