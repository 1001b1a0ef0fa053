"""h3batch/settings.py: the one table of variables, env parsing with expected-vs-found errors, and the structured log line format."""
from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest

from h3batch.core.exceptions import ConfigError
from h3batch.core.startup_checks import redacted_url
from h3batch.logs import StructuredFormatter, configure_logging
from h3batch.settings import VARS, Settings, env_value, markdown_table


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
    ({"H3BATCH_LOG_FORMAT": "xml"}, "H3BATCH_LOG_FORMAT: expected one of kv, json, found 'xml'"),
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


REPO = Path(__file__).resolve().parents[2]
PRODUCT_ROOMS = ("h3batch", "core", "api", "worker", "kernels", "loadrunner", "bench", "docker")


def test_every_variable_the_code_reads_is_declared():
    """Any `H3BATCH_*` name in the product's source is declared in VARS (prefix mentions like H3BATCH_RATE_* aside)."""
    declared = {var.name for var in VARS}
    found: dict[str, str] = {}
    for room in PRODUCT_ROOMS:
        for path in (REPO / room).rglob("*.py"):
            for name in re.findall(r"\bH3BATCH_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
                found.setdefault(name, str(path.relative_to(REPO)))
    prefixes = {name for name in found if any(other.startswith(name + "_") for other in declared)}
    missing = {name: where for name, where in found.items() if name not in declared and name not in prefixes}
    assert not missing, f"read by the code but not declared in h3batch/settings.py VARS: {missing}"


def test_service_doc_table_is_generated_from_the_declarations():
    """docs/service.md's configuration table is exactly `markdown_table()` (regenerate: python -m h3batch.settings)."""
    text = (REPO / "docs" / "service.md").read_text()
    table = text.split("<!-- settings-table:begin -->\n", 1)[1].split("\n<!-- settings-table:end -->", 1)[0]
    assert table == markdown_table()


def test_every_declared_variable_parses_its_documented_default():
    """Each variable set to its documented default (where it is a literal) parses to the dataclass default."""
    default = Settings.from_env({})
    for var in VARS:
        if var.default.startswith(("(", "<")):
            continue
        parsed = Settings.from_env({var.name: var.default})
        assert getattr(parsed, var.field) == getattr(default, var.field), var.name


@pytest.mark.parametrize("name, raw, needle", [
    ("H3BATCH_RANKS", "²", "expected a positive integer or 'auto'"),
    ("H3BATCH_WEBHOOK_ALLOW_LOOPBACK", "maybe", "expected 1/0"),
    ("H3BATCH_STALL_S", "nan", "expected a number >= 0"),
    ("H3BATCH_BEAT_LOCK_TTL_S", "2", "expected at least 3 seconds"),
    ("H3BATCH_KERNEL_BACKEND", "cuda", "expected one of triton, torch"),
    ("H3BATCH_ARTIFACT_STORE", "/var/artifacts", "expected s3://BUCKET/PREFIX"),
    ("H3BATCH_ARTIFACT_STORE", "s3://Bad_Bucket/x", "expected an S3 bucket name"),
    ("H3BATCH_ARTIFACT_STORE", "s3://", "expected an S3 bucket name"),
    ("H3BATCH_S3_ENDPOINT_URL", "127.0.0.1:9000", "expected an http:// or https:// URL"),
])
def test_each_parser_refuses_with_the_variable_name(name, raw, needle):
    """Bad values of every kind of variable raise ConfigError naming the variable."""
    with pytest.raises(ConfigError, match=re.escape(f"{name}: {needle}")):
        Settings.from_env({name: raw})


def test_artifact_store_url_is_normalised():
    """`s3://bucket`, `s3://bucket/`, `s3://bucket//a/b/` → bucket plus a prefix that is empty or ends in one /."""
    assert Settings.from_env({"H3BATCH_ARTIFACT_STORE": "s3://my-bucket"}).artifact_store == "s3://my-bucket/"
    assert Settings.from_env({"H3BATCH_ARTIFACT_STORE": "s3://my.bucket//a/b/"}).artifact_store == \
        "s3://my.bucket/a/b/"
    assert Settings.from_env({}).artifact_store == ""


def test_env_value_reads_declared_names_only():
    """env_value parses one declared variable at call time and refuses names nobody declared."""
    assert env_value("H3BATCH_KERNEL_BACKEND", {"H3BATCH_KERNEL_BACKEND": "torch"}) == "torch"
    assert env_value("H3BATCH_KERNEL_BACKEND", {}) is None
    with pytest.raises(KeyError, match="H3BATCH_NOT_A_THING"):
        env_value("H3BATCH_NOT_A_THING", {})


def test_from_env_is_the_one_reader(monkeypatch):
    """A bare `Settings()` is the defaults whatever the environment holds; `from_env()` reads os.environ."""
    monkeypatch.setenv("H3BATCH_MAX_RUN_S", "5")
    assert Settings().max_run_s == 600 and Settings(max_run_s=7).max_run_s == 7
    assert Settings.from_env().max_run_s == 5


def test_only_declared_names_as_written_are_read():
    """pydantic-settings' own lookup is case-insensitive; h3batch reads `H3BATCH_MAX_RUN_S`, not `h3batch_max_run_s`."""
    assert Settings.from_env({"h3batch_max_run_s": "5", "H3BATCH_MAX_RUNS": "5"}).max_run_s == 600
    assert Settings.from_env({"H3BATCH_MAX_RUN_S": " 5 "}).max_run_s == 5
    assert Settings.from_env({"H3BATCH_MAX_RUN_S": "   "}).max_run_s == 600


def test_settings_are_frozen():
    """A `Settings` cannot be changed after it is read."""
    settings = Settings.from_env({})
    with pytest.raises(ValueError, match="frozen"):
        settings.max_run_s = 1


def test_errors_are_one_line_and_never_quote_a_secret():
    """A ConfigError is one line without pydantic's report, and a bad webhook secret's value is never in it."""
    secret = "whsec_" + "c2VjcmV0LXRleHQ="
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"H3BATCH_WEBHOOK_SECRET": secret})
    assert str(caught.value) == "H3BATCH_WEBHOOK_SECRET: expected a key of 24 to 64 bytes after whsec_, found 11 bytes"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"H3BATCH_MAX_QUEUED": "many", "H3BATCH_LOG_FORMAT": "xml"})
    assert "\n" not in str(caught.value) and "pydantic" not in str(caught.value)


def test_interactive_streak_is_declared_with_its_default():
    """H3BATCH_INTERACTIVE_STREAK (the priority lanes' anti-starvation rule) defaults to 4 and must be positive."""
    assert Settings.from_env({}).interactive_streak == 4
    assert Settings.from_env({"H3BATCH_INTERACTIVE_STREAK": "2"}).interactive_streak == 2
    with pytest.raises(ConfigError, match="H3BATCH_INTERACTIVE_STREAK: expected a positive integer, found 0"):
        Settings.from_env({"H3BATCH_INTERACTIVE_STREAK": "0"})
