"""Conformance vectors (§14) and invariants of the pure metric functions in h3batch.loadrunner.metrics."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from h3batch.loadrunner.metrics import (
    Packet,
    Send,
    ceiling_error,
    continuity,
    distribution,
    session_metrics,
    stream_timing,
)
from tests.loadrunner.vectors import pkt, sends, slow_sends

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_vector_1_clock_vs_packets():
    """Vector 14.1: receive times (not server timestamps) drive intervals, latency, RTF, continuity and lag."""
    events = [{"type": "session.created", "session": {"resume_token": "secret"}},
              {"type": "response.output_audio_transcript.delta", "delta": " "},
              {**pkt(5), "_client_received_at_s": -999.0},
              {"type": "response.output_audio_transcript.delta", "delta": " Hi"},
              {**pkt(5), "_client_received_at_s": -999.0},
              {**pkt(5), "_client_received_at_s": -999.0}]
    times = [7.0, 10.2, 10.4, 10.6, 10.8, 11.6]
    m = session_metrics(events, times, sends((10, 10, 10.01)))
    interval = m["client_audio_packet_interval_ms"]
    assert interval["count"] == 2 and interval["median"] == pytest.approx(600)
    assert interval["p99"] == pytest.approx(796) and interval["max"] == pytest.approx(800)
    assert interval["argmax_index"] == 1
    assert m["client_first_audio_after_stream_start_ms"] == pytest.approx(400)
    assert m["client_first_text_after_stream_start_ms"] == pytest.approx(600)
    assert m["output_samples"] == 28_800
    assert m["audio_underrun_s"] == pytest.approx(0.4) and m["audio_continuity_ok"] is False
    assert m["audio_underrun_event_count"] >= 1
    assert m["client_pacing_warning"] is False
    assert m["client_stream_rtf"] == pytest.approx(1.6 / 1.2)
    assert m["server_stream_rtf"] is None
    assert m["stream_lag_ms"]["count"] == 1 and m["stream_lag_ms"]["max"] == pytest.approx(310)
    assert m["playout_stall_ms"] == pytest.approx(280) and m["steady_playout_stall_ms"] == pytest.approx(0)
    text = json.dumps(m)
    assert "secret" not in text and "-999" not in text


def test_vector_2_empty():
    """Vector 14.2: no events or sends gives nulls, never zeros."""
    m = session_metrics([], [], [])
    assert m["client_stream_rtf"] is None and m["audio_continuity_ok"] is None
    assert m["audio_underrun_s"] is None and m["client_audio_packet_interval_ms"]["p99"] is None
    assert m["client_first_audio_after_stream_start_ms"] is None and m["playout_stall_ms"] is None


def test_vector_3_slow_chunks():
    """Vector 14.3: 0.44 s chunk spacing for 0.4 s chunks gives stream RTF 1.1, drift 280 ms, stall 240 ms."""
    s = slow_sends(50)
    first = s[4].completed + 0.08 + 0.2
    packets = [Packet(first + 0.44 * j, 9600, "r") for j in range(10)]
    t = stream_timing(packets, s)
    assert t["server_stream_rtf"] == pytest.approx(1.1)
    assert t["stream_lag_drift_ms"] == pytest.approx(280)
    assert t["stream_lag_ms"]["count"] == 50 and t["stream_lag_ms"]["max"] == pytest.approx(880)
    assert t["playout_stall_ms"] == pytest.approx(240) and t["playout_stalled"] is True
    assert t["steady_playout_stall_ms"] == pytest.approx(0.0) and t["steady_playout_stalled"] is False


def test_vector_4_shipped_shape():
    """Vector 14.4: a 1-frame first packet stalls the strict player 230 ms but not the steady one."""
    s = slow_sends(46)
    first = s[0].completed + 0.08 + 0.2
    packets = [Packet(first, 1920, "r")] + [Packet(first + 0.12 + 0.08 + 0.23 + 0.4 * j, 9600, "r")
                                            for j in range(9)]
    t = stream_timing(packets, s)
    assert t["playout_stall_ms"] == pytest.approx(230) and t["playout_stalled"] is True
    assert t["steady_playout_stall_ms"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("metrics,flags,expected", [
    ({"server_stream_rtf": 1.2, "stream_lag_drift_ms": 150.0}, (None, None, None), None),
    ({"server_stream_rtf": 1.2, "stream_lag_drift_ms": 150.0}, (None, 1.1, None), "server_stream_rtf exceeds 1.1"),
    ({"server_stream_rtf": 1.2, "stream_lag_drift_ms": 150.0}, (None, None, 100.0),
     "stream_lag_drift_ms exceeds 100.0"),
    ({"server_stream_rtf": 1.2, "stream_lag_drift_ms": 150.0}, (None, 1.3, 200.0), None),
    ({"server_stream_rtf": None, "stream_lag_drift_ms": None}, (None, 1.1, 100.0), None),
    ({"client_stream_rtf": 1.5}, (0.001, None, None), "client_stream_rtf exceeds 0.001"),
])
def test_vector_7_ceilings(metrics, flags, expected):
    """Vector 14.7: ceilings fail only on float metrics above them, naming the parsed limit."""
    assert ceiling_error(metrics, *flags) == expected


def test_vector_9_legacy_metrics():
    """Vector 14.9: a legacy `response.audio.delta` packet counts like the current name."""
    m = session_metrics([pkt(5, "response.audio.delta")], [10.4], sends((10.0, 10.0, 10.01)))
    assert m["output_samples"] == 9600 and m["response_ids"] == ["r"] and m["invalid_audio_packets"] == []


def test_vector_10_empty_then_multiframe():
    """Vector 14.10: an empty delta is valid and contributes nothing."""
    empty = {**pkt(1), "delta": ""}
    m = session_metrics([empty, pkt(5)], [1.0, 1.4], sends((1.0, 1.0, 1.001)))
    assert m["invalid_audio_packets"] == [] and m["output_samples"] == 9600
    assert len(m["audio_packet_timeline"]) == 1


def test_vector_11_payload_privacy():
    """Vector 14.11: an invalid packet is reported by index, time and code only, never its payload."""
    m = session_metrics([{**pkt(1), "delta": "private-remote-payload!"}], [1.4], [])
    assert m["output_samples"] == 0
    assert m["invalid_audio_packets"] == [{"event_index": 0, "received_at_s": 1.4, "code": "invalid_audio_base64"}]
    assert "private-remote-payload" not in json.dumps(m)


def test_vector_13_distribution():
    """Vector 14.13: linear p99, not nearest rank."""
    assert distribution([400, 800]) == {"count": 2, "median": 600, "p99": pytest.approx(796), "max": 800,
                                        "argmax_index": 1}
    assert distribution([]) == {"count": 0, "median": None, "p99": None, "max": None, "argmax_index": None}
    assert distribution([3.0])["p99"] == 3.0


def test_continuity_degenerate_inputs():
    """The shared continuity function returns (0.0, 0, True) for no packets, mismatched lengths, bad rate."""
    assert continuity([], []) == (0.0, 0, True)
    assert continuity([1.0, 2.0], [10]) == (0.0, 0, True)
    assert continuity([1.0], [10], bytes_per_s=0) == (0.0, 0, True)


def test_continuity_threshold_is_100_ms():
    """A 100 ms underrun is still continuous; 101 ms is not."""
    assert continuity([0.0, 0.18], [3840, 3840])[2] is True   # 80 ms played, next at 180 ms: 100 ms gap
    assert continuity([0.0, 0.181], [3840, 3840])[2] is False


@given(st.lists(finite, min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_distribution_invariants(values):
    """median and p99 lie between min and max, p99 >= median, argmax points at the first maximum."""
    d = distribution(values)
    lo, hi = min(values), max(values)
    tol = 1e-9 * max(1.0, abs(lo), abs(hi))
    assert lo - tol <= d["median"] <= hi + tol and lo - tol <= d["p99"] <= hi + tol
    assert d["p99"] >= d["median"] - tol
    assert d["max"] == hi and values[d["argmax_index"]] == hi and hi not in values[: d["argmax_index"]]


@given(st.lists(finite, min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_distribution_order_free(values):
    """Shuffling changes only argmax_index."""
    a, b = distribution(values), distribution(list(reversed(values)))
    assert (a["median"], a["p99"], a["max"], a["count"]) == pytest.approx((b["median"], b["p99"], b["max"],
                                                                         b["count"]))


@given(st.lists(st.tuples(st.floats(0.0, 0.5), st.integers(1, 10)), min_size=1, max_size=30))
@settings(max_examples=150, deadline=None)
def test_continuity_invariants(gaps_frames):
    """Underrun is non-negative, counted per gap, and zero when every packet arrives before playout catches up."""
    times, sizes, t = [], [], 0.0
    for gap, frames in gaps_frames:
        t += gap
        times.append(t)
        sizes.append(frames * 3840)
    worst, events, ok = continuity(times, sizes)
    assert worst >= 0 and 0 <= events <= len(times) - 1
    assert ok == (worst <= 0.1) and (events == 0) == (worst == 0.0)


@given(st.lists(st.integers(1, 12), min_size=1, max_size=20), st.floats(0.0, 0.3))
@settings(max_examples=100, deadline=None)
def test_stream_timing_invariants(chunk_frames, delay):
    """Lags are counted once per completed output frame and stalls are non-negative; an on-time echo has RTF ~1."""
    total = sum(chunk_frames)
    s = [Send(0.08 * k, 0.08 * k, 0.08 * k) for k in range(total)]
    packets, done = [], 0
    for frames in chunk_frames:
        done += frames
        packets.append(Packet(0.08 * (done - 1) + 0.08 + delay, frames * 1920, "r"))
    t = stream_timing(packets, s)
    assert t["stream_lag_ms"]["count"] == total
    assert t["playout_stall_ms"] >= 0 and t["steady_playout_stall_ms"] >= 0
    if t["server_stream_rtf"] is not None:
        assert t["server_stream_rtf"] == pytest.approx(1.0)
        assert math.isfinite(t["stream_lag_drift_ms"])
