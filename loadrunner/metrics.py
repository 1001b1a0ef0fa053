"""Client-side load metrics (spec §9.3-§9.6); pure functions over receive times, packet sizes and send records.

Times are client monotonic seconds. Every function here takes plain lists, so the conformance vectors of §14 can
drive them directly and the async driver only has to collect timestamps. Percentiles are written out rather than
taken from numpy because the spec fixes the linear rule and the empty-input shape (nulls, not zeros).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from h3batch.loadrunner.audio import FRAME_PERIOD_S, FRAME_SAMPLES, SAMPLE_RATE_HZ
from h3batch.loadrunner.packets import TEXT_DELTA_TYPES, check_packet, is_audio_event

PCM16_BYTES_PER_S = SAMPLE_RATE_HZ * 2
CONTINUITY_THRESHOLD_S = 0.100
PLAYOUT_START_DELAY_S = 0.120
PACING_WARNING_MS = 80.0


@dataclass(frozen=True)
class Send:
    """One completed input-frame send: planned grid time, start and completion (monotonic seconds)."""

    planned: float
    started: float
    completed: float


@dataclass(frozen=True)
class Packet:
    """One valid nonempty audio packet: receive time, sample count, response id."""

    received_at: float
    samples: int
    response_id: str


def distribution(values: Sequence[float]) -> dict:
    """{count, median, p99 (linear), max, argmax_index (first maximum, original order)}; nulls when empty."""
    n = len(values)
    if n == 0:
        return {"count": 0, "median": None, "p99": None, "max": None, "argmax_index": None}
    ordered = sorted(values)
    middle = n // 2
    median = ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    h = 0.99 * (n - 1)
    low = math.floor(h)
    p99 = ordered[low] if low + 1 >= n else ordered[low] + (h - low) * (ordered[low + 1] - ordered[low])
    peak = max(values)
    return {"count": n, "median": median, "p99": p99, "max": peak, "argmax_index": list(values).index(peak)}


def packet_intervals_ms(times: Sequence[float]) -> list[float]:
    """Interval i = (t_{i+1} - t_i) * 1000 between consecutive valid nonempty packets."""
    return [(b - a) * 1000.0 for a, b in zip(times, times[1:])]


def send_lateness_ms(sends: Sequence[Send]) -> list[float]:
    """L_k = max(0, started_k - planned_k) * 1000."""
    return [max(0.0, s.started - s.planned) * 1000.0 for s in sends]


def first_audio_ms(packets: Sequence[Packet], sends: Sequence[Send]) -> float | None:
    """(t_first - S_0) * 1000; null without audio or sends."""
    if not packets or not sends:
        return None
    return (packets[0].received_at - sends[0].started) * 1000.0


def first_text_ms(events: Sequence[dict], times: Sequence[float], sends: Sequence[Send]) -> float | None:
    """First text/transcript delta with non-whitespace content, relative to S_0 in ms (may be negative)."""
    if not sends:
        return None
    for event, t in zip(events, times):
        delta = event.get("delta")
        if event.get("type") in TEXT_DELTA_TYPES and isinstance(delta, str) and delta.strip():
            return (t - sends[0].started) * 1000.0
    return None


def client_stream_rtf(packets: Sequence[Packet], sends: Sequence[Send]) -> float | None:
    """(t_last - S_0) / (output_samples / 24000); null without sends or output."""
    audio_s = sum(p.samples for p in packets) / SAMPLE_RATE_HZ
    if not sends or audio_s == 0:
        return None
    return (packets[-1].received_at - sends[0].started) / audio_s


def continuity(times: Sequence[float], byte_sizes: Sequence[int], bytes_per_s: float = PCM16_BYTES_PER_S,
               threshold_s: float = CONTINUITY_THRESHOLD_S) -> tuple[float, int, bool]:
    """(max_underrun_s, underrun_event_count, continuity_ok) for a player starting at t_0 with no pre-roll.

    Degenerate inputs (no packets, mismatched lengths, non-positive rate) give (0.0, 0, True).
    """
    if not times or len(times) != len(byte_sizes) or bytes_per_s <= 0:
        return 0.0, 0, True
    worst, events, played = 0.0, 0, 0
    for i in range(1, len(times)):
        played += byte_sizes[i - 1]
        deficit = (times[i] - times[0]) * bytes_per_s - played
        if deficit > 0:
            events += 1
            worst = max(worst, deficit / bytes_per_s)
    return worst, events, worst <= threshold_s


def playout_stall_ms(packets: Sequence[Packet], start_packet: int) -> float | None:
    """Total stall of a player that starts 120 ms after packet `start_packet` (clamped to the last one)."""
    if not packets:
        return None
    start = packets[min(start_packet, len(packets) - 1)].received_at + PLAYOUT_START_DELAY_S
    stalled, queued = 0.0, 0
    for p in packets:
        stalled += max(0.0, p.received_at - (start + stalled + queued / SAMPLE_RATE_HZ))
        queued += p.samples
    return stalled * 1000.0


def stream_timing(packets: Sequence[Packet], sends: Sequence[Send]) -> dict:
    """§9.6: per-output-frame lag against input send completion + 80 ms, a 10-90 % least-squares stream RTF, drift
    and playout stalls (strict player starts after packet 0, steady player after packet 1)."""
    total, completed_frames, edges = 0, [], []
    for p in packets:
        total += p.samples
        frames_done = min(total // FRAME_SAMPLES, len(sends))
        if frames_done > len(completed_frames):
            completed_frames.extend([p.received_at] * (frames_done - len(completed_frames)))
            edges.append(frames_done - 1)
    n = len(completed_frames)
    reference = [sends[k].completed + FRAME_PERIOD_S for k in range(n)]
    lags = [(completed_frames[k] - reference[k]) * 1000.0 for k in range(n)]
    lo, hi = math.floor(0.1 * n), math.ceil(0.9 * n)
    window = [e for e in edges if lo <= e < hi]
    rtf = drift = None
    if len(window) >= 2:
        xs = [reference[e] - reference[window[0]] for e in window]
        ys = [completed_frames[e] - completed_frames[window[0]] for e in window]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        if sxx > 0:
            rtf = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
            drift = (rtf - 1.0) * xs[-1] * 1000.0
    strict, steady = playout_stall_ms(packets, 0), playout_stall_ms(packets, 1)
    return {
        "server_stream_rtf": rtf,
        "stream_lag_drift_ms": drift,
        "stream_lag_ms": distribution(lags),
        "playout_stall_ms": strict,
        "playout_stalled": None if strict is None else strict > 0,
        "steady_playout_stall_ms": steady,
        "steady_playout_stalled": None if steady is None else steady > 0,
    }


def collect_packets(events: Sequence[dict], times: Sequence[float]) -> tuple[list[Packet], list[dict]]:
    """Split audio events into valid nonempty packets and invalid-packet records {event_index, received_at_s, code}."""
    valid, invalid = [], []
    for index, (event, t) in enumerate(zip(events, times)):
        if not is_audio_event(event):
            continue
        result = check_packet(event)
        if result.code is not None:
            invalid.append({"event_index": index, "received_at_s": t, "code": result.code.value})
        elif result.payload:
            valid.append(Packet(t, len(result.payload) // 2, event["response_id"]))
    return valid, invalid


def session_metrics(events: Sequence[dict], times: Sequence[float], sends: Sequence[Send]) -> dict:
    """The row metrics snapshot of §9.2, in row order, from events, their receive times and completed sends."""
    packets, invalid = collect_packets(events, times)
    lateness = distribution(send_lateness_ms(sends))
    if packets:
        underrun_s, underrun_events, continuity_ok = continuity(
            [p.received_at for p in packets], [p.samples * 2 for p in packets])
    else:
        underrun_s = underrun_events = continuity_ok = None
    return {
        "input_frames": len(sends),
        "output_samples": sum(p.samples for p in packets),
        "frame_deficit": None,
        "response_ids": sorted({p.response_id for p in packets}),
        "client_first_audio_after_stream_start_ms": first_audio_ms(packets, sends),
        "client_first_text_after_stream_start_ms": first_text_ms(events, times, sends),
        "client_stream_rtf": client_stream_rtf(packets, sends),
        "client_audio_packet_interval_ms": distribution(packet_intervals_ms([p.received_at for p in packets])),
        "client_send_lateness_ms": lateness,
        "client_pacing_warning": lateness["p99"] is not None and lateness["p99"] > PACING_WARNING_MS,
        "audio_underrun_s": underrun_s,
        "audio_underrun_event_count": underrun_events,
        "audio_continuity_ok": continuity_ok,
        **stream_timing(packets, sends),
        "input_timeline": [{"frame_index": i, "planned_at_s": s.planned, "send_started_at_s": s.started,
                            "send_completed_at_s": s.completed} for i, s in enumerate(sends)],
        "audio_packet_timeline": [{"received_at_s": p.received_at, "samples": p.samples,
                                   "response_id": p.response_id} for p in packets],
        "invalid_audio_packets": invalid,
    }


def ceiling_error(metrics: dict, max_client_rtf: float | None, max_stream_rtf: float | None,
                  max_lag_drift_ms: float | None) -> str | None:
    """§8.5 items 6-7: the first exceeded ceiling as a row error; null metrics never fail."""
    def exceeds(value, limit):
        return limit is not None and isinstance(value, float) and value > limit

    if exceeds(metrics.get("client_stream_rtf"), max_client_rtf):
        return f"client_stream_rtf exceeds {max_client_rtf!r}"
    if exceeds(metrics.get("server_stream_rtf"), max_stream_rtf):
        return f"server_stream_rtf exceeds {max_stream_rtf!r}"
    if exceeds(metrics.get("stream_lag_drift_ms"), max_lag_drift_ms):
        return f"stream_lag_drift_ms exceeds {max_lag_drift_ms!r}"
    return None
