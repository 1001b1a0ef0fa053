"""core/routing.py: the rows ladder, the queue a job needs, the queues a worker consumes, and the refusal rules."""
from __future__ import annotations

import pytest

from h3batch.core import routing
from h3batch.core.geometry import CONTRACT_MAX_ROWS, RequestGeometry
from h3batch.core.routing import Capability, Need


def test_the_ladder_covers_every_request_and_each_step_is_at_most_a_quarter_octave_above_the_last():
    """From the smallest request (32x32, 4 s) to the contract's largest, every request has a step at or above its
    rows, within 2^(1/4) of it; the top step is the contract's largest request."""
    steps = routing.ROWS_STEPS
    assert steps[-1] == CONTRACT_MAX_ROWS and steps[0] >= routing.MIN_REQUEST_ROWS
    assert list(steps) == sorted(set(steps))
    assert all(b / a <= routing.ROWS_STEP_RATIO + 1e-9 for a, b in zip(steps, steps[1:]))
    for rows in (routing.MIN_REQUEST_ROWS, 2404, 2436, 2437, 5654, CONTRACT_MAX_ROWS):
        step = routing.rows_step(rows)
        assert step >= rows and step in steps and (step == steps[0] or step / rows <= routing.ROWS_STEP_RATIO)
    with pytest.raises(ValueError, match="contract's largest request"):
        routing.rows_step(CONTRACT_MAX_ROWS + 1)


def test_every_consumer_of_a_jobs_queue_serves_it():
    """For every worker size and job size: the worker consumes the job's queue iff the job is served by it, and
    then its max_rows covers the job's rows."""
    for max_rows in (1449, 2000, 3000, 5654, 27_524, 40_000, CONTRACT_MAX_ROWS):
        cap = Capability(max_rows=max_rows)
        for size in ((128, 32, 4.0), (256, 128, 4.0), (256, 128, 15.0), (768, 448, 8.0), (1344, 768, 15.0)):
            need = Need.of(*size)
            assert (need.queue in cap.queues()) == need.served_by(cap)
            if need.served_by(cap):
                assert need.rows <= max_rows
    assert Capability(max_rows=3000).queues()[0] == "render.t2va.bf16.2896"
    assert len(Capability(max_rows=CONTRACT_MAX_ROWS).queues()) == len(routing.ROWS_STEPS)


def test_a_record_names_its_queue_and_one_from_before_routing_needs_t2va_bf16():
    record = {"width": 256, "height": 128, "seconds": 15.0}
    assert RequestGeometry(256, 128, 15.0).capacity_rows == 5654
    assert routing.queue_of(record) == "render.t2va.bf16.5788"
    assert routing.queue_of({**record, "precision": "fp8", "task": "fl2va"}) == "render.fl2va.fp8.5788"


def test_a_capability_round_trips_and_an_old_entry_means_v2_t2va_bf16():
    cap = Capability(max_rows=3000, precision="fp8", release_kind="native", tasks=("t2va", "fl2va"),
                     canvas={"default_width": 256})
    assert Capability.from_json(cap.as_json()) == cap
    assert Capability.from_json({"max_rows": 5000, "ts": 1.0}) == Capability(max_rows=5000)
    with pytest.raises(ValueError):
        Capability.from_json({"max_rows": 5000, "tasks": "t2va"})


def test_refusals_name_what_is_missing_and_what_the_fleet_serves():
    fleet = [Capability(max_rows=3000), Capability(max_rows=40_000), Capability(max_rows=9000, precision="fp8")]
    assert routing.refusal(Need.of(256, 128, 15.0), fleet, live=True) is None
    code, message, field = routing.refusal(Need.of(256, 128, 15.0, precision="fp8"), fleet[:2], live=True)
    assert code == "no_capable_worker" and message.startswith("precision 'fp8' for task 't2va': no worker renders")
    assert field == "precision"
    assert "the fleet serves: t2va bf16 up to 38923 rows (v2); t2va bf16 up to 2896 rows (v2)" in message
    code, message, field = routing.refusal(Need.of(256, 128, 4.0, task="ref2va"), fleet, live=True)
    assert code == "no_capable_worker" and message.startswith("task 'ref2va': no worker serves it") and field == "task"
    code, message, field = routing.refusal(Need.of(768, 448, 8.0, precision="fp8"), fleet, live=True)
    assert code == "exceeds_worker_capacity" and "needs 20816 rows" in message and "fp8 is 8185 rows" in message
    assert field == "body"
    code, message, _ = routing.refusal(Need.of(1344, 768, 15.0), fleet, live=False, age_s=120)
    assert code == "exceeds_worker_capacity" and "a worker seen 120 s ago (none is live now)" in message


def test_a_clip_shorter_than_the_native_release_renders_is_refused_unless_a_v2_worker_serves_it():
    """The native release renders 5-15 s: a 4.4 s job on a native-only fleet is refused at submission (it used to be
    accepted and fail on the worker), while a fleet with a V2 worker for the task serves it."""
    native = Capability(max_rows=40_000, release_kind="native", tasks=("t2va", "fl2va"))
    code, message, field = routing.refusal(Need.of(256, 128, 4.4), [native], live=True)
    assert code == "no_capable_worker" and field == "seconds"
    assert message.startswith("seconds: 4.4 s is shorter than the native MiniMax-H3 release renders (5 to 15 s)")
    assert routing.refusal(Need.of(256, 128, 5.0), [native], live=True) is None
    assert routing.refusal(Need.of(256, 128, 4.4), [native, Capability(max_rows=40_000)], live=True) is None
    code, message, _ = routing.refusal(Need.of(1344, 768, 4.4, task="fl2va"), [native], live=True)
    assert code == "no_capable_worker" and message.startswith("seconds: 4.4 s")
    small = Capability(max_rows=3000, release_kind="native")  # long enough, too large: the size is what it says
    code, message, _ = routing.refusal(Need.of(1344, 768, 8.0), [small], live=True)
    assert code == "exceeds_worker_capacity"


def test_the_shortest_clip_counts_only_the_workers_of_the_requests_precision():
    """A fleet of native bf16 workers and a V2 fp8 worker: a bf16 job without `seconds` is raised to the native
    release's 5 s; an fp8 one is not (its only worker renders from 4 s); without a precision, every worker counts."""
    fleet = [Capability(max_rows=40_000, release_kind="native"), Capability(max_rows=40_000, precision="fp8")]
    assert routing.shortest_served("t2va", fleet, "bf16") == routing.NATIVE_MIN_SECONDS
    assert routing.shortest_served("t2va", fleet, "fp8") == 0.0
    assert routing.shortest_served("t2va", fleet) == 0.0
