"""Per-point aggregates of a load report (spec §15.1.5-6) and the sweep summary table; pure functions."""
from __future__ import annotations

import csv
import io
import statistics
from collections import Counter

# (name in the summary, path into a session row); median and max over rows of non-null values, with counts.
AGGREGATED = (
    ("client_send_lateness_p99_ms", ("client_send_lateness_ms", "p99")),
    ("client_send_lateness_median_ms", ("client_send_lateness_ms", "median")),
    ("client_first_audio_ms", ("client_first_audio_after_stream_start_ms",)),
    ("client_first_text_ms", ("client_first_text_after_stream_start_ms",)),
    ("client_stream_rtf", ("client_stream_rtf",)),
    ("server_stream_rtf", ("server_stream_rtf",)),
    ("stream_lag_drift_ms", ("stream_lag_drift_ms",)),
    ("stream_lag_p99_ms", ("stream_lag_ms", "p99")),
    ("client_audio_packet_interval_p99_ms", ("client_audio_packet_interval_ms", "p99")),
    ("client_audio_packet_interval_max_ms", ("client_audio_packet_interval_ms", "max")),
    ("steady_playout_stall_ms", ("steady_playout_stall_ms",)),
    ("audio_underrun_s", ("audio_underrun_s",)),
    ("frame_deficit", ("frame_deficit",)),
)


def _dig(row: dict, path: tuple[str, ...]):
    value = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def aggregate(report: dict) -> dict:
    """{name: {count, median, max}} over the report's rows, non-null values only."""
    rows = report.get("sessions") or []
    out = {}
    for name, path in AGGREGATED:
        values = [v for v in (_dig(row, path) for row in rows) if v is not None]
        out[name] = {"count": len(values), "median": statistics.median(values) if values else None,
                     "max": max(values) if values else None}
    return out


def point_outcome(report: dict) -> dict:
    """Counts and histograms a point record keeps besides the aggregates."""
    rows = report.get("sessions") or []
    return {
        "ok": report.get("ok") is True,
        "requested_sessions": report.get("requested_sessions"),
        "passed_sessions": report.get("passed_sessions"),
        "pacing_warning_sessions": len(report.get("client_pacing_warning_sessions") or []),
        "shared_response_ids": len(report.get("shared_response_ids") or []),
        "server_error_codes": dict(Counter(code for row in rows for code in row.get("server_error_codes") or [])),
        "acceptance_checks": dict(Counter(row["acceptance_check"] for row in rows if row.get("acceptance_check"))),
        "aggregates": aggregate(report),
    }


SUMMARY_COLUMNS = ("point_id", "sessions", "load_frames", "repetition", "status", "ok", "passed_sessions",
                   "requested_sessions", "pacing_warning_sessions", "send_lateness_p50_ms", "send_lateness_p99_ms",
                   "first_audio_ms", "client_stream_rtf", "server_stream_rtf", "stream_lag_drift_ms")


def summary_row(point: dict) -> dict:
    """The sweep-summary line of one point: lateness p50 = median of row medians, p99 = max of row p99s."""
    agg = point.get("aggregates") or {}

    def pick(name, stat):
        return (agg.get(name) or {}).get(stat)

    return {
        "point_id": point["id"], "sessions": point.get("sessions"), "load_frames": point.get("load_frames"),
        "repetition": point.get("repetition"), "status": point.get("status"), "ok": point.get("ok"),
        "passed_sessions": point.get("passed_sessions"), "requested_sessions": point.get("requested_sessions"),
        "pacing_warning_sessions": point.get("pacing_warning_sessions"),
        "send_lateness_p50_ms": pick("client_send_lateness_median_ms", "median"),
        "send_lateness_p99_ms": pick("client_send_lateness_p99_ms", "max"),
        "first_audio_ms": pick("client_first_audio_ms", "median"),
        "client_stream_rtf": pick("client_stream_rtf", "median"),
        "server_stream_rtf": pick("server_stream_rtf", "median"),
        "stream_lag_drift_ms": pick("stream_lag_drift_ms", "median"),
    }


def capacity(rows: list[dict]) -> dict[int, int | None]:
    """Per load-frames setting: the largest session count whose repetitions all passed (None if none did)."""
    by_frames: dict[int, dict[int, list[bool]]] = {}
    for row in rows:
        by_frames.setdefault(row["load_frames"], {}).setdefault(row["sessions"], []).append(row["ok"] is True)
    return {frames: max((n for n, oks in grid.items() if all(oks)), default=None)
            for frames, grid in by_frames.items()}


def to_csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=SUMMARY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
