"""worker/heartbeat.py against real Redis: the payload /readyz reads, lease renewal, the reaper trigger, stop."""
from __future__ import annotations

import json

import pytest

from h3batch.core import jobs, keys
from h3batch.core.jobs import JobSpec
from h3batch.settings import Settings
from h3batch.worker.heartbeat import Heartbeat, WorkerState

SPEC = JobSpec(prompt="rain", seconds=4.0, width=256, height=128, seed=1)
TTL = 3600


@pytest.fixture
def r(scratch_redis):
    return scratch_redis


def make_heartbeat(r, sent: list[str], **settings) -> Heartbeat:
    return Heartbeat(r, "hb-test", {"release_id": "rel"}, sent.append, Settings(**settings),
                     state=WorkerState.STARTING)


def payload(r) -> dict:
    return json.loads(r.get(keys.worker("hb-test")))


def test_payload_carries_the_state_strings_readers_expect(r):
    """STARTING, BUSY (with the job id), STALLED (run deadline, lease no longer renewed), READY and DISK_FULL (with
    its reason, kept across a job) reach Redis as the plain strings /readyz compares with."""
    beat = make_heartbeat(r, [])
    beat.beat()
    assert payload(r)["state"] == "STARTING" and payload(r)["release_id"] == "rel"
    assert 0 < r.ttl(keys.worker("hb-test")) <= 15
    beat.set_busy("job_1", "hb-test:1")
    assert payload(r)["state"] == "BUSY" and payload(r)["job_id"] == "job_1"
    beat.set_stalled("job_1")
    assert payload(r)["state"] == "STALLED" and payload(r)["job_id"] == "job_1" and beat.lease_holder is None
    beat.set_ready()
    assert payload(r)["state"] == "READY" and payload(r)["job_id"] is None
    beat.set_disk("disk_low: 3.0 MB free")
    assert payload(r)["state"] == "DISK_FULL" and payload(r)["reason"] == "disk_low: 3.0 MB free"
    beat.set_busy("job_2", "hb-test:1")
    beat.set_ready()  # the disk still says no: a job ending does not make the worker READY
    assert payload(r)["state"] == "DISK_FULL"
    beat.set_disk(None)
    assert payload(r)["state"] == "READY" and "reason" not in payload(r)
    assert [s.value for s in WorkerState] == ["STARTING", "READY", "BUSY", "STALLED", "DISK_FULL"]


def test_a_busy_beat_renews_the_lease_of_the_job_in_hand(r):
    """While BUSY, every beat pushes the job's lease back out to the configured TTL."""
    job = jobs.create_job(r, SPEC)
    _, holder = jobs.claim_job(r, job["id"], "hb-test", release_id="rel", record_ttl_s=TTL, lease_ttl_ms=2000)
    assert r.pttl(keys.lease(job["id"])) <= 2000
    make_heartbeat(r, [], lease_ttl_s=60.0).set_busy(job["id"], holder)
    assert r.pttl(keys.lease(job["id"])) > 50_000


def test_resend_lost_jobs_requeues_a_lapsed_job_once_per_interval(r):
    """A running job without a lease goes back to queued with a new message; a second call within the interval is
    held off by the `h3b:reconcile` lock."""
    job = jobs.create_job(r, SPEC)
    jobs.claim_job(r, job["id"], "gone", release_id="rel", record_ttl_s=TTL)
    r.delete(keys.lease(job["id"]))
    sent: list[str] = []
    beat = make_heartbeat(r, sent, reconcile_interval_s=60.0)
    assert beat.resend_lost_jobs() == [job["id"]]
    assert sent == [job["id"]] and r.hget(keys.job(job["id"]), "status") == "queued"
    assert r.get(keys.RECONCILE_LOCK) == "hb-test"
    assert beat.resend_lost_jobs() == [] and sent == [job["id"]]


def test_stop_deletes_the_key_so_readers_stop_counting_the_worker(r):
    """`stop` ends the thread and removes `h3b:worker:{name}` at once, not after its TTL."""
    beat = make_heartbeat(r, [], lease_ttl_s=0.3)
    beat.start()
    beat.beat()
    assert r.exists(keys.worker("hb-test"))
    beat.stop()
    assert not beat.is_alive() and not r.exists(keys.worker("hb-test"))


def test_a_beat_with_max_rows_also_records_the_workers_capacity(r):
    """`max_rows` in the heartbeat's info goes into the payload and the h3b:capacity hash the API reads; a worker
    without the figure writes no capacity entry."""
    Heartbeat(r, "hb-test", {"release_id": "rel", "max_rows": 4321}, [].append, Settings()).beat()
    assert payload(r)["max_rows"] == 4321
    entry = json.loads(r.hget(keys.CAPACITY, "hb-test"))
    assert entry["max_rows"] == 4321 and entry["ts"] == payload(r)["ts"]
    make_heartbeat(r, []).beat()
    assert "max_rows" not in payload(r) and r.hkeys(keys.CAPACITY) == ["hb-test"]
