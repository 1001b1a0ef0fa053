"""GET /usage: the calling key's jobs by final status, seconds of video and GPU-seconds over a window of UTC days.

The figures are counted once per job when it reaches its terminal status (core/usage.py); this view only parses the
window and sums the day buckets. A key sees its own usage only; with no API keys, everyone shares one bucket.
"""
from __future__ import annotations

import math
import re
import time
from datetime import datetime, timedelta, timezone

from flask import Blueprint, g, jsonify, request

from h3batch.api.errors import ApiError
from h3batch.api.redis_client import get_redis
from h3batch.api.schemas import Usage
from h3batch.core import defaults, usage

bp = Blueprint("usage", __name__)

_UNIX = re.compile(r"^\d{1,12}(\.\d{0,9})?$")


def parse_instant(name: str, raw: str) -> datetime:
    """`raw` as an aware UTC datetime: Unix seconds (`1764547200`, `1764547200.5`) or ISO-8601 (`2026-12-01`,
    `2026-12-01T08:00:00Z`, `2026-12-01T09:00:00+01:00`; without an offset, UTC). 400 invalid_request naming
    `name` otherwise."""
    text = raw.strip()
    try:
        if _UNIX.match(text):
            seconds = float(text)
            if not math.isfinite(seconds):
                raise ValueError(text)
            return datetime.fromtimestamp(seconds, timezone.utc)
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.astimezone(timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise ApiError(400, "invalid_request", f"{name}: expected an ISO-8601 date or time (2026-12-01, "
                                               f"2026-12-01T08:00:00Z) or Unix seconds, found {raw[:40]!r}") from None


@bp.get("/usage")
def get_usage():
    """The caller's usage over `from`..`to` (defaults: the USAGE_DEFAULT_DAYS days before now, to now), summed over
    the UTC days they fall on. 400 invalid_request for an unreadable time, `from` after `to`, or a window over
    USAGE_MAX_DAYS days."""
    end = parse_instant("to", request.args["to"]) if "to" in request.args else datetime.fromtimestamp(
        time.time(), timezone.utc)
    start = parse_instant("from", request.args["from"]) if "from" in request.args else \
        end - timedelta(days=defaults.USAGE_DEFAULT_DAYS)
    first, last = start.date(), end.date()
    if first > last:
        raise ApiError(400, "invalid_request", f"from: expected a time at or before to ({last.isoformat()}), found "
                                               f"{first.isoformat()}")
    if (last - first).days > defaults.USAGE_MAX_DAYS:
        raise ApiError(400, "invalid_request", f"from: expected a window of at most {defaults.USAGE_MAX_DAYS} days, "
                                               f"found {(last - first).days} ({first.isoformat()} to "
                                               f"{last.isoformat()})")
    figures = usage.read(get_redis(), g.get("owner") or "", first, last)
    view = Usage.model_validate({"from": first.isoformat(), "to": last.isoformat(), **figures})
    return jsonify(view.model_dump(mode="json", by_alias=True))
