"""h3batch/settings.py: env parsing with expected-vs-found errors, and the structured log line format."""
from __future__ import annotations

import io
import json
import logging

import pytest

from h3batch.core.exceptions import ConfigError
from h3batch.settings import Settings, StructuredFormatter, configure_logging, redacted_url


def test_defaults_and_overrides_from_env():
    """Unset variables give the documented defaults; set ones override; keys are split, stripped and not repr'd."""
    default = Settings.from_env({})
    assert default.redis_url == "redis://127.0.0.1:6379/0" and default.max_run_s == 600
    assert default.visibility_timeout_s == 1200 and default.api_keys == ()
    custom = Settings.from_env({"H3BATCH_API_KEYS": " a-secret , b-secret ,", "H3BATCH_MAX_RUN_S": "30",
                                "H3BATCH_LEASE_TTL_S": "3", "H3BATCH_RELEASE": "/models/r"})
    assert custom.api_keys == ("a-secret", "b-secret") and custom.visibility_timeout_s == 60
    assert custom.heartbeat_interval_s == 1.0 and str(custom.hf_cache_dir) == "/models/hf-cache"
    assert "a-secret" not in repr(custom)


@pytest.mark.parametrize("env, needle", [
    ({"H3BATCH_MAX_QUEUED": "many"}, "H3BATCH_MAX_QUEUED: expected an integer, found 'many'"),
    ({"H3BATCH_RESULT_TTL_S": "0"}, "H3BATCH_RESULT_TTL_S: expected a positive integer, found 0"),
    ({"H3BATCH_LOG_FORMAT": "xml"}, "H3BATCH_LOG_FORMAT: expected 'kv' or 'json', found 'xml'"),
    ({"H3BATCH_LEASE_TTL_S": "0"}, "H3BATCH_LEASE_TTL_S: expected a number > 0"),
])
def test_bad_values_name_the_variable_expected_and_found(env, needle):
    """Each malformed variable raises ConfigError saying which variable, what was expected and what arrived."""
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_redis_password_is_redacted():
    """redacted_url hides the password and keeps host, port and db."""
    assert redacted_url("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_log_lines_are_structured_and_carry_the_job_id(fmt):
    """Every record is one line with ts, level, logger, msg and extra fields such as job_id (kv or JSON)."""
    stream = io.StringIO()
    configure_logging(Settings.from_env({"H3BATCH_LOG_FORMAT": fmt}), stream=stream)
    try:
        logging.getLogger("h3batch.test").info("render started attempt=%d", 1, extra={"job_id": "job_abc"})
    finally:
        logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "h3batch"]
    line = stream.getvalue().strip()
    assert "\n" not in line
    if fmt == "json":
        fields = json.loads(line)
        assert fields["msg"] == "render started attempt=1" and fields["job_id"] == "job_abc"
        assert fields["level"] == "INFO" and fields["logger"] == "h3batch.test"
    else:
        assert line.startswith("ts=") and 'msg="render started attempt=1"' in line and "job_id=job_abc" in line
    assert isinstance(StructuredFormatter("kv").format(logging.makeLogRecord({"msg": "x"})), str)
