"""Bad input at scale: Schemathesis generates requests from /openapi.json (examples, coverage, fuzzing and stateful
phases, positive and negative data) against the real API behind gunicorn, with a valid Bearer key; and a
property-based test (Hypothesis) feeding numeric text, Unicode digits and huge numbers to every numeric field, query
value and header of both job APIs, in process on a real Redis.

Checks: every Schemathesis check except `positive_data_acceptance` (a schema-valid body can still be refused by rules
JSON Schema cannot state: an unknown `after` cursor, the aspect-ratio rule, an Idempotency-Key reused with another
body; spec §4 lists the checks to pass). Left out of the run: /jobs/{id}/events (an endless stream for jobs that never
finish here, as this stack has no worker) and /readyz (503 by design without a worker; tested in tests/worker).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.system.conftest import KEY_A, REPO

ST = Path(sys.executable).with_name("st")
MAX_EXAMPLES = int(os.environ.get("H3BATCH_FUZZ_EXAMPLES", "250"))
"""Test cases per operation and phase (Schemathesis `--max-examples`); 200 gives well over 1,000 requests."""
SEED = os.environ.get("H3BATCH_FUZZ_SEED", "7")
"""Schemathesis `--seed`: fixed so a run repeats; set another to explore (each seed is a different ~1,500 requests)."""


@pytest.mark.skipif(not ST.exists(), reason="schemathesis is not installed (pip install 'schemathesis==4.32.5')")
def test_schemathesis_finds_no_server_error_or_schema_violation(keyed_stack, tmp_path):
    """≥ 1,000 generated requests: Schemathesis reports no failure (no 5xx, every status, header, content type and
    body as documented, negative data rejected, auth enforced, deleted jobs gone) and the API log shows no 5xx and no
    traceback."""
    api = keyed_stack.api
    log_start = api.log_path.stat().st_size
    report = tmp_path / "report.json"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.system.fuzz_hooks"}  # tests.* via conftest.TESTS_PATH
    done = subprocess.run(
        [str(ST), "run", f"{api.base}/openapi.json", "-H", f"Authorization: Bearer {KEY_A}",
         "--checks", "all", "--exclude-checks", "positive_data_acceptance",
         "--exclude-operation-id", "getJobEvents", "--exclude-operation-id", "readyz",
         "--max-examples", str(MAX_EXAMPLES), "--seed", SEED, "--workers", "2", "--request-timeout", "20",
         "--report", "json", "--report-json-path", str(report), "--no-color"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)  # its cache stays out of the repo
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    summary = json.loads(report.read_text())
    assert summary["complete"] and summary["test_cases"]["with_failures"] == 0 and not summary["failures"]
    assert summary["operations"]["errored"] == 0 and not summary["errors"]

    log = api.log_path.read_bytes()[log_start:].decode(errors="replace")
    statuses = [int(s) for s in re.findall(r'msg="request method=\S+ path=\S* status=(\d+)', log)]
    server_errors = [line for line in log.splitlines() if re.search(r"status=5\d\d ", line)]
    print("\nRELIABILITY fuzz " + json.dumps({
        "schemathesis": summary["schemathesis_version"], "test_cases": summary["test_cases"]["generated"],
        "requests": len(statuses), "5xx": len(server_errors), "failures": len(summary["failures"]),
        "by_status": {str(s): statuses.count(s) for s in sorted(set(statuses))}}))
    assert len(statuses) >= 1000, f"only {len(statuses)} requests reached the API"
    assert not server_errors, server_errors[:5]
    assert "Traceback" not in log


# --- property-based: every numeric field of both APIs, in-process (P5 round two, item 4) ---

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import start_redis  # noqa: E402

_UNICODE_DIGITS = st.characters(categories=["Nd", "No", "Nl"])
"""Every Unicode digit, superscript, fraction and numeral letter: "²", "٣", "½", "Ⅻ", full-width "５", ..."""

NUMERIC_TEXT = st.one_of(
    st.from_regex(r"\A[ +-]{0,3}[0-9]{1,25}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,4})?[ ]{0,2}\Z"),
    st.text(_UNICODE_DIGITS, min_size=1, max_size=6),
    st.builds(lambda a, b: a + b, st.text(_UNICODE_DIGITS | st.sampled_from("0123456789+-x. _"), max_size=4),
              st.text(_UNICODE_DIGITS | st.sampled_from("0123456789"), min_size=1, max_size=4)),
    st.integers(min_value=19, max_value=5000).map(lambda n: "9" * n),  # up to and past Python's 4300-digit limit
    st.sampled_from(["++5", "--5", "1e308", "-1e308", "1e400", "nan", "NaN", "inf", "-Infinity", "0x10", "1_000",
                     "²", "²x128", "128x²", "", " ", "0", "-0", "true", "null"]),
)
NUMERIC_JSON = st.one_of(
    st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 5e-324, 32 * 10**399, 10**400, -(10**400), 2**63, 2**64,
                     32 * 2**1100]),  # the extremes by name: random draws rarely land on a multiple of 32 > 1e308
    st.integers(min_value=-(10**400), max_value=10**400),
    st.integers(min_value=1, max_value=10**400).map(lambda n: 32 * n),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    NUMERIC_TEXT,
)
JOBS_FIELDS = ("seconds", "width", "height", "seed")
V1_FIELDS = ("seconds", "width", "height", "seed", "num_frames", "fps", "size", "num_inference_steps",
             "guidance_scale", "flow_shift", "audio_flow_shift", "guidance_scale_2", "true_cfg_scale")
PROPERTY_SETTINGS = settings(max_examples=int(os.environ.get("H3BATCH_PROPERTY_EXAMPLES", "150")), deadline=None,
                             suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def property_client(tmp_path_factory):
    """The real app on a private real Redis, in process (Flask's test client): fast enough for thousands of
    requests. No queue cap or rate limit gets in the way of the property."""
    from h3batch.api import create_app  # noqa: PLC0415
    from h3batch.api.ratelimit import RateLimits  # noqa: PLC0415

    root = tmp_path_factory.mktemp("property")
    proc, url = start_redis(root / "redis")
    app = create_app({"REDIS_URL": url, "ARTIFACTS_DIR": str(root / "artifacts"), "API_KEYS": [],
                      "MAX_QUEUED": 10**9, "RATE_LIMITS": RateLimits(0, 0)})
    client = app.test_client()
    job = client.post("/jobs", json={"prompt": "property", "width": 128, "height": 32}).get_json()
    client.job_id = job["id"]
    yield client
    proc.terminate()
    proc.wait(timeout=10)


def _assert_no_server_error(reply, what) -> None:
    assert reply.status_code < 500, (what, reply.status_code, reply.get_data(as_text=True)[:300])
    assert reply.headers["Content-Type"].startswith("application/json"), what
    if reply.status_code >= 400:
        error = reply.get_json()["error"]
        assert error["retryable"] is False and error["code"] and error["message"], (what, error)


@PROPERTY_SETTINGS
@given(field=st.sampled_from(JOBS_FIELDS), value=NUMERIC_JSON)
def test_jobs_numeric_fields_never_5xx(property_client, field, value):
    """POST /jobs with any number, numeric text, Unicode digit or huge value in any numeric field: 2xx, or a 4xx
    envelope with retryable false; never a 5xx."""
    body = {"prompt": "p", "width": 128, "height": 32, field: value}
    _assert_no_server_error(property_client.post("/jobs", json=body), body)


@PROPERTY_SETTINGS
@given(field=st.sampled_from(V1_FIELDS), value=NUMERIC_JSON, as_form=st.booleans())
def test_v1_videos_numeric_fields_never_5xx(property_client, field, value, as_form):
    """POST /v1/videos, as JSON or as the SDK's multipart text parts, with any value in any numeric field."""
    if as_form:
        form = {"prompt": "p", field: value if isinstance(value, str) else json.dumps(value)}
        reply = property_client.post("/v1/videos", data=form, content_type="multipart/form-data")
        _assert_no_server_error(reply, form)
    else:
        body = {"prompt": "p", field: value}
        _assert_no_server_error(property_client.post("/v1/videos", json=body), body)


@PROPERTY_SETTINGS
@given(where=st.sampled_from(["/jobs?limit=", "/v1/videos?limit=", "/sweeps?limit=", "JOB?wait=", "PREFER",
                              "EVENTS"]),
       value=NUMERIC_TEXT)
def test_numeric_query_values_and_headers_never_5xx(property_client, where, value):
    """`limit` on the three lists, `?wait=` and `Prefer: wait=` on a job, and `Last-Event-ID` on its stream."""
    job = f"/jobs/{property_client.job_id}"
    value = value.replace("\n", " ").replace("\r", " ")
    if where == "PREFER":
        digits = "".join(ch for ch in value if ch.isascii() and ch.isdigit())[:3] or "0"
        reply = property_client.get(job, headers={"Prefer": f"wait={int(digits) % 3}"})  # keep the wait short
    elif where == "EVENTS":
        reply = property_client.get(f"{job}/events", headers={"Last-Event-ID": f"{value}-0"}, buffered=False)
        reply.close()  # an accepted id starts a stream: only its status matters here
        if reply.status_code == 200:
            assert reply.mimetype == "text/event-stream"
            return
    elif where == "JOB?wait=":
        try:
            seconds = float(value)  # what the server reads
        except ValueError:
            seconds = None
        short = "0" if seconds is not None and 0 < seconds <= 60 else value  # a valid wait would only block
        reply = property_client.get(f"{job}?wait={quote(short)}")
    else:
        reply = property_client.get(where + quote(value))
    _assert_no_server_error(reply, (where, value))
