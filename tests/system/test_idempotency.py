"""Idempotent create (spec §1 row 11): `Idempotency-Key` on POST /jobs, scoped per API key, against the real API."""
from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor

import requests

from h3batch.api import idempotency
from h3batch.core import keys
from tests.system.conftest import KEY_A, KEY_B, SMALL, bearer

BODY = {"prompt": "a gong fades into birdsong", "seed": 42, **SMALL}


def _post(base: str, key: str, idem: str, body: dict | None = None) -> requests.Response:
    return requests.post(f"{base}/jobs", json=body or BODY, headers={**bearer(key), "Idempotency-Key": idem},
                         timeout=30)


def _jobs_in_index(stack) -> int:
    return stack.redis.client().zcard(keys.JOBS_INDEX)


def test_fifty_concurrent_identical_posts_create_one_job(keyed_stack):
    """50 concurrent POSTs with one key and body: exactly one job is created; every answer is that job (202, replays
    marked `Idempotent-Replayed: true`) or 409 idempotency_key_in_use with Retry-After: 1, whose retry replays it."""
    base, idem = keyed_stack.api.base, "race-" + secrets.token_hex(8)
    before = _jobs_in_index(keyed_stack)
    with ThreadPoolExecutor(max_workers=50) as pool:
        replies = list(pool.map(lambda _: _post(base, KEY_A, idem), range(50)))
    assert {r.status_code for r in replies} <= {202, 409}, [r.text for r in replies if r.status_code not in (202, 409)]
    created = [r for r in replies if r.status_code == 202 and "Idempotent-Replayed" not in r.headers]
    assert len(created) == 1
    job_id = created[0].json()["id"]
    for reply in replies:
        if reply.status_code == 202:
            assert reply.json()["id"] == job_id and reply.headers["Location"] == f"/jobs/{job_id}"
        else:
            assert reply.json()["error"]["code"] == "idempotency_key_in_use" and reply.headers["Retry-After"] == "1"
            retry = _post(base, KEY_A, idem)
            assert retry.status_code == 202 and retry.json()["id"] == job_id
    replay = _post(base, KEY_A, f'"{idem}"')  # the header is a structured-field string: quotes are stripped
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json()["id"] == job_id
    assert _jobs_in_index(keyed_stack) == before + 1


def test_same_key_with_another_body_is_422(keyed_stack):
    """Reusing a key with a different body answers 422 idempotency_key_reused (not retryable); no job is made."""
    base, idem = keyed_stack.api.base, "reuse-" + secrets.token_hex(8)
    assert _post(base, KEY_A, idem).status_code == 202
    before = _jobs_in_index(keyed_stack)
    reply = _post(base, KEY_A, idem, {**BODY, "seed": 43})
    assert reply.status_code == 422
    assert reply.json()["error"] == {**reply.json()["error"], "code": "idempotency_key_reused", "retryable": False}
    assert _jobs_in_index(keyed_stack) == before


def test_key_in_flight_is_409_and_frees_itself(keyed_stack):
    """While a first request holds the key without a job yet, a retry gets 409 idempotency_key_in_use with
    Retry-After: 1; an in-flight claim left by a crashed API expires after IN_FLIGHT_TTL_S, not 24 h."""
    base, idem = keyed_stack.api.base, "flight-" + secrets.token_hex(8)
    r = keyed_stack.redis.client()
    owner = _owner_of(KEY_A)
    held = idempotency.claim(r, owner, idem, idempotency.fingerprint(_validated(BODY)),  # a first request, mid-way
                             exists=lambda _: True)
    assert held.job_id is None
    reply = _post(base, KEY_A, idem)
    assert reply.status_code == 409 and reply.headers["Retry-After"] == "1"
    assert reply.json()["error"]["code"] == "idempotency_key_in_use" and reply.json()["error"]["retryable"] is True
    assert 0 < r.ttl(held.redis_key) <= idempotency.IN_FLIGHT_TTL_S
    r.delete(held.redis_key)  # as if the in-flight TTL ran out
    created = _post(base, KEY_A, idem)
    assert created.status_code == 202 and "Idempotent-Replayed" not in created.headers
    assert r.ttl(held.redis_key) > idempotency.IN_FLIGHT_TTL_S  # a key with its job is kept 24 h


def test_a_key_whose_job_was_deleted_creates_afresh(keyed_stack):
    """The rule after deletion (docs/api.md "Idempotency"): once the key's job is deleted, a replay creates a new job
    (202, no Idempotent-Replayed; it was 404 job_not_found on a POST for 24 h), which later replays return; a replay
    with another body is still 422; on /v1/videos alike. Concurrent replays after the delete create exactly one."""
    base, idem = keyed_stack.api.base, "gone-" + secrets.token_hex(8)
    first = _post(base, KEY_A, idem).json()["id"]
    assert requests.delete(f"{base}/jobs/{first}", headers=bearer(KEY_A), timeout=30).status_code == 204
    assert _post(base, KEY_A, idem, {**BODY, "seed": 43}).status_code == 422
    with ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(lambda _: _post(base, KEY_A, idem), range(8)))
    assert {r.status_code for r in replies} <= {202, 409}, [r.text for r in replies]
    fresh = [r for r in replies if r.status_code == 202 and "Idempotent-Replayed" not in r.headers]
    assert len(fresh) == 1 and fresh[0].json()["id"] != first
    again = _post(base, KEY_A, idem)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json()["id"] == fresh[0].json()["id"]
    video = {"prompt": "a gong", "size": "128x64", "seconds": "4"}
    headers = {**bearer(KEY_A), "Idempotency-Key": "v1-" + idem}
    made = requests.post(f"{base}/v1/videos", json=video, headers=headers, timeout=30).json()["id"]
    assert requests.delete(f"{base}/v1/videos/{made}", headers=bearer(KEY_A), timeout=30).ok
    remade = requests.post(f"{base}/v1/videos", json=video, headers=headers, timeout=30)
    assert remade.status_code == 202 and remade.json()["id"] != made and "Idempotent-Replayed" not in remade.headers


def test_keys_are_scoped_per_api_key(keyed_stack):
    """The same Idempotency-Key under two API keys makes two jobs: one client cannot replay another's job."""
    base, idem = keyed_stack.api.base, "scope-" + secrets.token_hex(8)
    first, second = _post(base, KEY_A, idem), _post(base, KEY_B, idem)
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] != second.json()["id"] and "Idempotent-Replayed" not in second.headers


def test_bad_idempotency_keys_are_400(keyed_stack):
    """An empty or over-255-character Idempotency-Key is 400 invalid_request with the error envelope."""
    for bad in ("", "x" * 256):
        reply = _post(keyed_stack.api.base, KEY_A, bad)
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_request", reply.text


def _owner_of(key: str) -> str:
    """The owner id (key id) the API records for jobs created with `key`."""
    from h3batch.api.auth import _digest, key_id  # noqa: PLC0415

    return key_id(_digest(key))


def _validated(body: dict) -> dict:
    from h3batch.api.schemas import CreateJob  # noqa: PLC0415

    return CreateJob.model_validate(body).model_dump(mode="json")
