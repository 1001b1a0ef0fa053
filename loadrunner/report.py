"""`load-result.json` (spec §9.1): building the top-level object and writing it exclusively and atomically."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from h3batch.loadrunner.audio import FRAME_PERIOD_S, InputIdentity
from h3batch.loadrunner.config import DriverConfig
from h3batch.loadrunner.metrics import PACING_WARNING_MS

RESULT_NAME = "load-result.json"
MEASUREMENT_ORIGIN = "client monotonic clock; admission excluded; streaming and drain retained"
INTERVAL_DEFINITION = "nonempty audio packet arrivals, not server ticks or per-frame inference latency"
STREAM_TIMING_DEFINITION = (
    "Output frames are counted 1-based over valid nonempty packets in arrival order: output frame k completes when "
    "the cumulative sample count reaches k*1920, at that packet's client receive time. Its reference time is the "
    "send completion of input frame k-1 plus 80 ms; stream_lag_ms is completion minus reference. server_stream_rtf "
    "is the least-squares slope of completion against reference over packet edges in the 10-90% frame window, and "
    "stream_lag_drift_ms is (slope - 1) times the window span. Playout stalls replay packets into a strict player "
    "starting 120 ms after the first packet and a steady player starting 120 ms after the second.")


def shared_response_ids(rows: list[dict]) -> list[str]:
    """Response ids that appear in more than one row's `response_ids`."""
    seen: dict[str, int] = {}
    for row in rows:
        for rid in set(row.get("response_ids") or []):
            seen[rid] = seen.get(rid, 0) + 1
    return sorted(rid for rid, n in seen.items() if n > 1)


def build_report(config: DriverConfig, identity: InputIdentity, rows: list[dict]) -> dict:
    """Apply the shared-response pass to `rows` and wrap them in the §9.1 top level."""
    shared = shared_response_ids(rows)
    for row in rows:
        if shared and set(row.get("response_ids") or []) & set(shared):
            row["ok"] = False
            row["error"] = "concurrent sessions shared a response id"
    passed = sum(1 for row in rows if row.get("ok") is True)
    return {
        "schema_version": 1,
        "mode": "paced_multi_session",
        "model": config.model,
        "requested_sessions": config.sessions,
        "passed_sessions": passed,
        "ok": passed == len(rows) and len(rows) == config.sessions,
        "input": {"path": identity.path, "sha256": identity.sha256, "tail_s": config.tail_s,
                  "load_frames": config.load_frames},
        "frame_period_s": FRAME_PERIOD_S,
        "drain_s": config.drain_s,
        "cleanup_timeout_s": config.cleanup_timeout_s,
        "client_pacing_warning_threshold_ms": PACING_WARNING_MS,
        "client_pacing_warning_sessions": [row["index"] for row in rows if row.get("client_pacing_warning")],
        "max_client_rtf": config.max_client_rtf,
        "max_stream_rtf": config.max_stream_rtf,
        "max_lag_drift_ms": config.max_lag_drift_ms,
        "acceptance": {"max_frame_deficit": config.max_frame_deficit,
                       "min_voiced_frames": config.min_voiced_frames,
                       "minimum_audio_chunks": config.minimum_audio_chunks,
                       "voiced_frame_rms_threshold": config.voiced_frame_rms_threshold},
        "shared_response_ids": shared,
        "sessions": rows,
        "reported_server": {"revision": config.server_revision, "hardware": config.server_hardware},
        "measurement_origin": MEASUREMENT_ORIGIN,
        "interval_definition": INTERVAL_DEFINITION,
        "stream_timing_definition": STREAM_TIMING_DEFINITION,
    }


def dumps_report(report: dict) -> str:
    """Indent 2, non-ASCII kept, NaN/Infinity refused (ValueError)."""
    return json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False)


def write_exclusive(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, never replacing an existing file (FileExistsError, file untouched).

    The text goes to a temporary sibling first and is hard-linked into place: link() fails if the name exists, and
    readers never see a partial file.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
