"""core/capacity.py over a real Redis: which figure the API refuses requests by (live workers, the last known one,
none), and the contract's capacity measure it compares with."""
from __future__ import annotations

import time

import pytest

from h3batch.core import capacity, defaults, keys
from h3batch.core.geometry import CONTRACT_MAX_ROWS, MAX_CANVAS_PIXELS, MAX_TEXT_ROWS, RequestGeometry


@pytest.fixture
def r(scratch_redis):
    return scratch_redis


def test_capacity_rows_are_video_audio_and_the_longest_prompt():
    """128x32 at 4 s (107 frames): T=32 latent frames x 1x4 patches = 128 video rows, 2 x 178 audio rows, 1024 text
    rows."""
    geo = RequestGeometry(128, 32, 4.0)
    assert (geo.video_rows, geo.audio_rows) == (128, 356)
    assert geo.capacity_rows == geo.sequence_rows(MAX_TEXT_ROWS) == 128 + 356 + 1024 == 1508


def test_contract_max_rows_is_the_largest_request_the_contract_allows():
    """No canvas within the area cap and aspect window, at any allowed duration, needs more rows than the constant;
    15 s at 1344x768 needs exactly that many."""
    assert CONTRACT_MAX_ROWS == RequestGeometry(1344, 768, 15.0).capacity_rows == 110_086
    largest = max(RequestGeometry(w, h, 15.0).capacity_rows
                  for w in range(32, 4097, 32) for h in range(32, 4097, 32)
                  if w * h <= MAX_CANVAS_PIXELS and 0.25 <= w / h <= 4)
    assert largest == CONTRACT_MAX_ROWS
    assert max(RequestGeometry(1344, 768, s / 24).capacity_rows for s in range(96, 361)) == CONTRACT_MAX_ROWS


def test_the_largest_live_worker_sets_the_limit(r):
    """Two live workers: the larger figure; a stale bigger one (heartbeat older than the TTL) does not count."""
    now = time.time()
    capacity.record(r, "small", 4000, now - 1)
    capacity.record(r, "large", 9000, now - 2)
    capacity.record(r, "gone", 50_000, now - defaults.HEARTBEAT_TTL_S - 1)
    limit = capacity.fleet_limit(r, now)
    assert (limit.max_rows, limit.live) == (9000, True)
    assert "live worker" in limit.describe() and "9000" in limit.describe()
    assert 0 < r.ttl(keys.CAPACITY) <= defaults.CAPACITY_MEMORY_S


def test_with_no_live_worker_the_last_known_capacity_holds_then_lapses(r):
    """No fresh entry: the largest figure of the last hour, said to be from no live worker; older ones are removed,
    and with none left nothing limits (None: accept)."""
    now = time.time()
    capacity.record(r, "restarting", 7000, now - 120)
    capacity.record(r, "retired", 80_000, now - defaults.CAPACITY_MEMORY_S - 5)
    r.hset(keys.CAPACITY, "garbled", "not json")
    limit = capacity.fleet_limit(r, now)
    assert (limit.max_rows, limit.live) == (7000, False)
    assert "no worker is live" in limit.describe() and "120 s ago" in limit.describe()
    assert set(r.hkeys(keys.CAPACITY)) == {"restarting"}
    assert capacity.fleet_limit(r, now + defaults.CAPACITY_MEMORY_S) is None
    assert r.hkeys(keys.CAPACITY) == []


def test_nothing_advertised_means_no_limit(r):
    assert capacity.fleet_limit(r) is None
