"""Pacing on the fixed 80 ms grid without catch-up bursts (§8.4), on a virtual clock (vectors 14.5, 14.6)."""
from __future__ import annotations

import asyncio

import pytest

from h3batch.loadrunner.pacing import pace_frames


class VirtualClock:
    """Time advances only through the injected sleep and send: deterministic pacing tests."""

    def __init__(self, start: float, overshoot: float = 0.0, send_costs: dict[int, float] | None = None,
                 default_cost: float = 0.0):
        self.now, self.overshoot = start, overshoot
        self.send_costs, self.default_cost = send_costs or {}, default_cost

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds + self.overshoot

    async def send(self, seq: int) -> None:
        self.now += self.send_costs.get(seq, self.default_cost)


def run(count: int, clock: VirtualClock, epoch: float = 10.0):
    sends = []
    asyncio.run(pace_frames(count, epoch, clock=clock.clock, sleep=clock.sleep, send=clock.send,
                            check=lambda: None, sends=sends))
    return sends


def test_vector_5_grid_without_drift():
    """Vector 14.5: 2 ms oversleep and 1 ms sends never accumulate over 375 frames."""
    sends = run(375, VirtualClock(10.0, overshoot=0.002, default_cost=0.001))
    for i, s in enumerate(sends):
        assert s.planned == pytest.approx(10 + 0.08 * i, abs=1e-9)
        assert s.started - s.planned == pytest.approx(0.002, abs=1e-9)


def test_vector_6a_stall_without_burst():
    """Vector 14.6a: a short overrun keeps the grid; a long stall restarts it one period after the stalled send."""
    sends = run(6, VirtualClock(10.0, send_costs={1: 0.10, 3: 0.25}))
    assert [s.started for s in sends] == pytest.approx([10.0, 10.08, 10.18, 10.24, 10.57, 10.65])
    lateness = [max(0.0, s.started - s.planned) for s in sends]
    assert lateness == pytest.approx([0, 0, 0.02, 0, 0.25, 0.25])


def test_vector_6b_first_frame_stall():
    """Vector 14.6b: after a 250 ms first send each start is at least the previous completion + 80 ms."""
    sends = run(3, VirtualClock(10.0, send_costs={0: 0.25}))
    for prev, cur in zip(sends, sends[1:]):
        assert cur.started >= prev.completed + 0.08 - 1e-9
    assert sends[1].started - sends[1].planned == pytest.approx(0.25)
    from h3batch.loadrunner.metrics import session_metrics
    assert session_metrics([], [], sends)["client_pacing_warning"] is True


def test_vector_6a_metrics():
    """Vector 14.6a through the metrics: lateness max 250 ms at index 4 and the pacing warning set."""
    from h3batch.loadrunner.metrics import session_metrics
    m = session_metrics([], [], run(6, VirtualClock(10.0, send_costs={1: 0.10, 3: 0.25})))
    assert m["client_send_lateness_ms"]["max"] == pytest.approx(250)
    assert m["client_send_lateness_ms"]["p99"] == pytest.approx(250)
    assert m["client_send_lateness_ms"]["argmax_index"] == 4
    assert m["client_pacing_warning"] is True


def test_check_stops_the_stream():
    """A failing connection check before a send stops pacing with that exception and no further sends."""
    sends, calls = [], []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("connection closed before session completion")

    clock = VirtualClock(0.0)
    with pytest.raises(RuntimeError):
        asyncio.run(pace_frames(5, 0.0, clock=clock.clock, sleep=clock.sleep, send=clock.send, check=check,
                                sends=sends))
    assert len(sends) == 2
