"""`Idempotency-Key` for POST /jobs (IETF draft-ietf-httpapi-idempotency-key-header), per API key, kept 24 h.

A retried create with the same key and the same body gets the original job back (`Idempotent-Replayed: true`)
instead of a second render; the same key with another body is 422 `idempotency_key_reused`; a retry that arrives
while the first request is still being handled is 409 `idempotency_key_in_use` with `Retry-After: 1`.

State per key is one Redis string, `h3b:idem:{owner}:{sha256(key)}` = JSON `{"fingerprint", "job_id"}`, claimed
with SET NX (so of N concurrent identical requests exactly one creates the job) and given its job id afterwards.

After the job or batch is gone (its owner deleted it, or its record expired), the key is free again: a replay is
handled as a first request and creates afresh (202, no `Idempotent-Replayed`). Why: the key guards against a second
*live* resource from one create; once the first is gone there is nothing to duplicate, and the owner who deleted it
has seen its answer. Answering 404 to a POST for the rest of the day (as before, issue 26 item 10) blocked a
deliberate re-submission, e.g. `h3batch submit --file` re-run into the same out-dir, whose key is derived from the
file. The takeover is a compare-and-set on the stored value, so of N concurrent replays exactly one creates; a replay
with another body is still 422 `idempotency_key_reused`. docs/api.md "Idempotency".
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from h3batch.api.errors import ApiError
from h3batch.core import keys

TTL_S = 86_400
"""How long a key remembers its job."""
IN_FLIGHT_TTL_S = 30
"""How long a claim without a job blocks retries (409): an API process killed between claiming the key and recording
its job must not leave the key stuck `in use` for a day. Creating a job takes milliseconds."""
MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class Claim:
    """The outcome of presenting a key: either this request owns it (`job_id` None) or it replays `job_id`."""

    redis_key: str
    fingerprint: str
    job_id: str | None


def parse_key(header: str | None) -> str | None:
    """The key from the header (a structured-field string: surrounding quotes stripped); None when absent."""
    if header is None:
        return None
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key or len(key) > MAX_KEY_CHARS:
        raise ApiError(400, "invalid_request", f"Idempotency-Key: expected 1..{MAX_KEY_CHARS} characters, "
                                               f"found {len(key)}")
    return key


def fingerprint(body: dict[str, Any]) -> str:
    """SHA-256 of the validated request in canonical JSON (key order and whitespace do not matter)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Take over a key whose value is still `ARGV[1]` (the replay read it and found its job gone). KEYS: the key.
# ARGV: value read, this request's in-flight value, in-flight TTL.
_TAKE_OVER = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('set', KEYS[1], ARGV[2], 'EX', " \
             "ARGV[3]) and 1 else return 0 end"


def claim(r: redis.Redis, owner: str, key: str, body_fingerprint: str, exists: Callable[[str], bool]) -> Claim:
    """Take the key for this request, or find the job (or batch) it already made; `exists(id)` says whether that
    one is still there (a key whose resource is gone is taken over: see the module docstring). Raises 409 in use /
    422 reused."""
    redis_key = keys.idempotency(owner, hashlib.sha256(key.encode()).hexdigest())
    mine = json.dumps({"fingerprint": body_fingerprint, "job_id": None})
    if r.set(redis_key, mine, nx=True, ex=IN_FLIGHT_TTL_S):
        return Claim(redis_key, body_fingerprint, None)
    raw = r.get(redis_key)
    if raw is None:  # expired between SET and GET: take it now
        return claim(r, owner, key, body_fingerprint, exists)
    stored = json.loads(raw)
    if stored["fingerprint"] != body_fingerprint:
        raise ApiError(422, "idempotency_key_reused", "Idempotency-Key was already used with a different body",
                       False, {"x-should-retry": "false"})
    if stored["job_id"] is None:
        raise ApiError(409, "idempotency_key_in_use", "a request with this Idempotency-Key is still being handled",
                       True, {"Retry-After": "1"})
    if not exists(stored["job_id"]):
        if r.eval(_TAKE_OVER, 1, redis_key, raw, mine, IN_FLIGHT_TTL_S):
            return Claim(redis_key, body_fingerprint, None)
        return claim(r, owner, key, body_fingerprint, exists)  # another replay took it first: read what it left
    return Claim(redis_key, body_fingerprint, stored["job_id"])


def record_job(r: redis.Redis, held: Claim, job_id: str) -> None:
    """The request that owns the key made `job_id`: later replays return it."""
    r.set(held.redis_key, json.dumps({"fingerprint": held.fingerprint, "job_id": job_id}), ex=TTL_S)


def release(r: redis.Redis, held: Claim) -> None:
    """The owning request failed before making a job: free the key so a retry can try again."""
    r.delete(held.redis_key)
