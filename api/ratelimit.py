"""Per-API-key rate limits: a token bucket in Redis per key and bucket (creates, reads) → 429 `rate_limited`.

Two buckets per key (spec §1 row 15): `creates` (POST /jobs, POST /v1/videos[/sync]; a batch's items, one token
each, when the batch is admitted) and `reads` (every other authenticated request). A bucket holds up to one minute's quota and refills continuously; a request takes one token
or is answered 429 with `Retry-After` (whole seconds until a token is back) and, on every limited route, the
`RateLimit-Policy` / `RateLimit` headers of draft-ietf-httpapi-ratelimit-headers-10
(`"creates";q=60;w=60` and `"creates";r=<tokens left>;t=<seconds until full>`).

The bucket update is one Lua script (read, refill, take, write, expire; the function in core/rate_bucket.py), so concurrent API threads and processes
never over-admit, and it reads Redis's own clock (TIME), so API hosts with skewed clocks agree. Written here rather
than taken from a library: the Flask limiters on the package index count fixed or moving windows per client
address, not per-key token buckets shared through h3batch's own Redis with the draft-10 headers.

Limits apply per API key. With no keys configured (the open local demo) there is nothing to key on and no limit;
create_app already logs that the API is open.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from flask import Flask, current_app, g, request

from h3batch.api.auth import OPEN_PATHS
from h3batch.api.errors import ApiError
from h3batch.api.redis_client import get_redis
from h3batch.core import keys, rate_bucket

log = logging.getLogger("h3batch.api")

CREATE_PATHS = frozenset({"/jobs", "/v1/videos", "/v1/videos/sync"})
"""POSTs to these paths spend one token of the `creates` bucket here. Everything else spends `reads`, POST /batches
included: a batch of N items spends N `creates` tokens in the script that admits it (core/batches.py), so it costs
what N single jobs do, and a batch refused by any limit (or by validation) spends none of them: concurrent batches of
one key cannot starve each other by each taking a token at the door."""

_EXTENSION_KEY = "h3batch.rate_limits"

# KEYS[1] bucket hash; ARGV[1] capacity (tokens), ARGV[2] refill (tokens per ms). One token (core/rate_bucket.py).
# Returns {allowed 0/1, tokens left (string: Lua numbers become integers in replies), ms until 1 token, ms until full}.
_TAKE = rate_bucket.TAKE_FUNCTION + """
local allowed, tokens, wait_ms, full_ms = bucket_take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), 1, 1)
return {allowed, tostring(tokens), wait_ms, full_ms}
"""


@dataclass(frozen=True)
class RateLimits:
    """Requests per minute per API key; 0 turns a bucket off."""

    creates_per_min: int = 60
    reads_per_min: int = 600

    def quota(self, bucket: str) -> int:
        return self.creates_per_min if bucket == "creates" else self.reads_per_min


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: int
    retry_after_s: int
    reset_s: int


def take(r, owner: str, bucket: str, per_min: int) -> Decision:
    """Spend one token of `owner`'s `bucket` (capacity `per_min`, refilled `per_min` per 60 s)."""
    allowed, tokens, wait_ms, full_ms = r.eval(_TAKE, 1, keys.rate_bucket(owner, bucket), per_min, per_min / 60_000)
    return Decision(bool(allowed), max(0, int(float(tokens))), max(1, math.ceil(int(wait_ms) / 1000)) if not allowed else 0,
                    math.ceil(int(full_ms) / 1000))


def rate_limits() -> RateLimits:
    """This app's limits (the batch admission spends a batch's item tokens by them)."""
    return current_app.extensions[_EXTENSION_KEY]


def init_rate_limit(app: Flask) -> None:
    """Read the limits (H3BATCH_RATE_*; `app.config["RATE_LIMITS"]` overrides) and install the checks."""
    limits = app.config.get("RATE_LIMITS") or RateLimits()
    app.extensions[_EXTENSION_KEY] = limits
    app.before_request(_check)
    app.after_request(_headers)
    if app.config.get("API_KEYS"):
        log.info("rate limits per key creates_per_min=%d reads_per_min=%d", limits.creates_per_min,
                 limits.reads_per_min)


def _bucket() -> str:
    return "creates" if request.method == "POST" and request.path.rstrip("/") in CREATE_PATHS else "reads"


def _check() -> None:
    owner = g.get("owner") or ""
    if not owner or request.path in OPEN_PATHS:
        return  # open API (no keys) or an open route
    limits: RateLimits = current_app.extensions[_EXTENSION_KEY]
    bucket = _bucket()
    quota = limits.quota(bucket)
    if quota == 0:
        return
    decision = take(get_redis(), owner, bucket, quota)
    g.rate_limit = (bucket, quota, decision)
    if not decision.allowed:
        log.info("rate limited bucket=%s retry_after_s=%d", bucket, decision.retry_after_s)
        raise ApiError(429, "rate_limited", f"over {quota} {bucket} per minute for this API key; retry in "
                                            f"{decision.retry_after_s} s", True,
                       {"Retry-After": str(decision.retry_after_s), **_draft_headers(bucket, quota, decision)})


def _draft_headers(bucket: str, quota: int, decision: Decision) -> dict[str, str]:
    return {"RateLimit-Policy": f'"{bucket}";q={quota};w=60',
            "RateLimit": f'"{bucket}";r={decision.remaining};t={decision.reset_s}'}


def _headers(response):
    limited = g.get("rate_limit")
    if limited is not None:
        for name, value in _draft_headers(*limited).items():
            response.headers.setdefault(name, value)
    return response
