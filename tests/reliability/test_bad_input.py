"""Bad input, case by case, through gunicorn: every refusal is a 4xx with the error envelope, never a 5xx, HTML or
a traceback; odd but valid text (emoji, astral-plane characters) is accepted and stored unchanged."""
from __future__ import annotations

import pytest
import requests

from .conftest import KEY_A, SMALL, bearer

JSON = "application/json"


def _post_raw(base: str, data, content_type: str = JSON) -> requests.Response:
    return requests.post(f"{base}/jobs", data=data, headers={**bearer(KEY_A), "Content-Type": content_type},
                         timeout=30)


def _assert_envelope(reply: requests.Response, status: int, code: str | None = None) -> dict:
    assert reply.status_code == status, reply.text[:500]
    assert reply.headers["Content-Type"].startswith(JSON) and reply.headers.get("X-Request-ID")
    error = reply.json()["error"]
    assert set(error) >= {"code", "message", "retryable", "request_id"} and error["message"]
    assert "Traceback" not in reply.text and "/work/" not in reply.text and "site-packages" not in reply.text
    if code is not None:
        assert error["code"] == code, error
    return error


@pytest.mark.parametrize("data, content_type, status, code", [
    (b'{"prompt": "' + b"x" * 70_000 + b'"}', JSON, 413, "request_too_large"),  # over the 64 KiB body limit
    (b"prompt=a+cat", "application/x-www-form-urlencoded", 400, "invalid_json"),
    (b"<job><prompt>a cat</prompt></job>", "application/xml", 400, "invalid_json"),
    (b"--zz\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na cat\r\n--zz--\r\n",
     "multipart/form-data; boundary=zz", 400, "invalid_json"),
    (b"\xff\xfe\x00\x01 not utf-8", JSON, 400, "invalid_json"),
    (b"[1, 2, 3]", JSON, 400, "invalid_json"),
    (b"null", JSON, 400, "invalid_json"),
    (b"", JSON, 400, "invalid_json"),
    (b"[" * 30_000 + b"]" * 30_000, JSON, 400, "invalid_json"),  # nesting that blows the parser's recursion
    (b'{"prompt": "a\\u0000b", "width": 128, "height": 32}', JSON, 400, "invalid_request"),  # NUL in the prompt
    (b'{"prompt": "bell \\u0007", "width": 128, "height": 32}', JSON, 400, "invalid_request"),
    (b'{"prompt": "\\ud800 lone surrogate"}', JSON, 400, "invalid_request"),
    (b'{"prompt": "   "}', JSON, 400, "invalid_request"),
    (b'{"prompt": "x", "seed": 9223372036854775808}', JSON, 400, "invalid_request"),  # 2**63
    (b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", JSON, 400, "invalid_json"),  # over Python's int digits
    (b'{"prompt": "x", "seed": -1}', JSON, 400, "invalid_request"),
    (b'{"prompt": "x", "seed": 1.5}', JSON, 400, "invalid_request"),
    (b'{"prompt": "x", "width": -128, "height": 32}', JSON, 400, "unsupported_size"),
    (b'{"prompt": "x", "width": 0, "height": 0}', JSON, 400, "unsupported_size"),
    (b'{"prompt": "x", "width": 1e400}', JSON, 400, "invalid_request"),
    (b'{"prompt": "x", "width": 100000032, "height": 100000032}', JSON, 400, "unsupported_size"),
    (b'{"prompt": "x", "seconds": NaN}', JSON, 400, "unsupported_duration"),
    (b'{"prompt": "x", "seconds": -Infinity}', JSON, 400, "unsupported_duration"),
    (b'{"prompt": "x", "seconds": "four"}', JSON, 400, "invalid_request"),
    (b'{"prompt": "x", "priority": 9}', JSON, 400, "unsupported_parameter"),
    (b'{"prompt": ["x"]}', JSON, 400, "invalid_request"),
])
def test_bad_create_bodies_get_a_4xx_envelope(keyed_stack, data, content_type, status, code):
    """Oversized, non-JSON, mistyped, out-of-range and control-character bodies are refused with the documented
    status and error code, and no job is created."""
    before = keyed_stack.redis.client().zcard("h3b:jobs")
    _assert_envelope(_post_raw(keyed_stack.api.base, data, content_type), status, code)
    assert keyed_stack.redis.client().zcard("h3b:jobs") == before


def test_prompt_too_long_is_400(keyed_stack):
    """A prompt over H3BATCH_MAX_PROMPT_CHARS (4,000) but under the body limit is 400 naming both lengths."""
    reply = requests.post(f"{keyed_stack.api.base}/jobs", json={"prompt": "y" * 4001}, headers=bearer(KEY_A),
                          timeout=30)
    error = _assert_envelope(reply, 400, "invalid_request")
    assert "4000" in error["message"] and "4001" in error["message"]


@pytest.mark.parametrize("prompt", ["🎺🥁 brass band at dawn", "über straße, 𝄞 clef, 漢字, العربية", "tab\tand\nnewline"])
def test_unicode_and_emoji_prompts_round_trip(keyed_stack, prompt):
    """Emoji, astral-plane and right-to-left text (and tab/newline) are valid prompts: 202, stored unchanged."""
    reply = requests.post(f"{keyed_stack.api.base}/jobs", json={"prompt": prompt, **SMALL}, headers=bearer(KEY_A),
                          timeout=30)
    assert reply.status_code == 202, reply.text
    again = requests.get(f"{keyed_stack.api.base}/jobs/{reply.json()['id']}", headers=bearer(KEY_A), timeout=30)
    assert again.json()["prompt"] == prompt


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/jobs?limit=0", 400), ("GET", "/jobs?limit=101", 400), ("GET", "/jobs?limit=abc", 400),
    ("GET", "/jobs?order=sideways", 400), ("GET", "/jobs?limit=5&limit=abc", 400),
    ("GET", "/jobs?order=asc&order=desc", 400), ("GET", "/jobs?status=running", 400), ("GET", "/jobs?after=nope", 400),
    ("GET", "/jobs/job_000000000000000000000000?wait=61", 404), ("GET", "/jobs/%00", 404),
    ("GET", "/jobs/" + "a" * 3000, 404), ("PUT", "/jobs", 405), ("PATCH", "/jobs/job_x", 405),
    ("GET", "/no/such/route", 404),
])
def test_bad_paths_and_queries_get_a_4xx_envelope(keyed_stack, method, path, status):
    """Bad or repeated query values, unknown ids, unknown routes and wrong methods answer 4xx with the error
    envelope."""
    reply = requests.request(method, keyed_stack.api.base + path, headers=bearer(KEY_A), timeout=30)
    _assert_envelope(reply, status)


def test_bad_wait_and_event_id_on_an_existing_job_are_400(keyed_stack):
    """On a real job, `wait` outside 0..60 and a malformed Last-Event-ID are 400 invalid_request."""
    job = requests.post(f"{keyed_stack.api.base}/jobs", json={"prompt": "owl", **SMALL}, headers=bearer(KEY_A),
                        timeout=30).json()
    base = f"{keyed_stack.api.base}/jobs/{job['id']}"
    for params in ({"wait": "61"}, {"wait": "-1"}, {"wait": "soon"}):
        _assert_envelope(requests.get(base, params=params, headers=bearer(KEY_A), timeout=30), 400, "invalid_request")
    events = requests.get(f"{base}/events", headers={**bearer(KEY_A), "Last-Event-ID": "../../etc"}, timeout=30)
    _assert_envelope(events, 400, "invalid_request")
