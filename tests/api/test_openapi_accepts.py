"""GET /openapi.json states every form the API accepts: whatever the parser takes validates against the schema, so a
schema-violating request is one the API refuses (what Schemathesis' negative phase checks). Two gaps it found: the
/v1/videos create body (api/openai_protocol.py `create_body_schema`; multipart `prompt=false`, `release=0.0`,
`seed=` got 202) and the Idempotency-Key header (a quoted 255-character key is longer than 255). POST /jobs reads
numbers from text too (pydantic's lax mode), which its schema now states."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from h3batch.api.errors import ApiError
from h3batch.api.idempotency import MAX_KEY_CHARS, parse_key
from h3batch.api.openai_protocol import (_ACCEPTED, DEFAULT_MODEL_ID, VideoObject, create_body_schema, parse_create,
                                         validated)
from h3batch.api.openapi import _IDEMPOTENCY_KEY, model_schemas
from h3batch.api.schemas import CreateJob

VALIDATOR = Draft202012Validator(create_body_schema())


def _accepted(fields: dict) -> bool:
    """What POST /v1/videos does before it queues: parse the wire format, then the job contract."""
    try:
        validated(parse_create(fields, DEFAULT_MODEL_ID), max_prompt_chars=4000)
    except ApiError:
        return False
    return True


def test_the_schema_has_one_property_per_accepted_field():
    assert set(create_body_schema()["properties"]) == set(_ACCEPTED)
    Draft202012Validator.check_schema(create_body_schema())


@pytest.mark.parametrize("fields", [
    {"prompt": "false", "release": "0.0", "seed": ""},  # the multipart body Schemathesis found
    {"prompt": "a fox", "seconds": 4, "seed": "+7", "size": "1280 X 720", "fps": "24", "num_inference_steps": 8.0},
    {"prompt": "a fox", "seconds": "6", "guidance_scale": "1", "flow_shift": 10, "audio_flow_shift": "3.0",
     "generate_sound": True, "extra_params": '{"task": "t2va"}', "model": "", "user": None, "aspect_ratio": "16:9"},
], ids=["fuzz-multipart", "json-numbers-and-text", "sampler-as-text"])
def test_accepted_bodies_validate(fields):
    assert _accepted(fields)
    assert VALIDATOR.is_valid(fields), list(VALIDATOR.iter_errors(fields))


@pytest.mark.parametrize("name", ["release", "webhook_url", "user"])
@pytest.mark.parametrize("value", [0, 0.0, False, [], {}, 5])
def test_a_text_field_given_a_non_text_value_is_refused(name, value):
    """`release: 0.0` used to be dropped as if absent (202); now 400 naming the field, as the schema says."""
    with pytest.raises(ApiError) as err:
        parse_create({"prompt": "a fox", name: value}, DEFAULT_MODEL_ID)
    assert err.value.status == 400 and err.value.message.startswith(f"{name}: expected a string")
    assert not VALIDATOR.is_valid({"prompt": "a fox", name: value})


_VALUES = st.one_of(st.none(), st.just(""), st.booleans(), st.integers(-3, 40), st.sampled_from([8, 10, 3, 1, 24, 256]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                    st.sampled_from(["4", " +8 ", "24", "1.0", "10", "3", "true", "yes", "256x128", "16:9",
                                     DEFAULT_MODEL_ID, '{"task": "t2va"}', "http://127.0.0.1:9/hook"]),
                    st.lists(st.integers(), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=1))


@settings(max_examples=1000, deadline=None)
@given(extra=st.dictionaries(st.sampled_from([name for name in _ACCEPTED if name != "prompt"]), _VALUES, max_size=4),
       prompt=st.sampled_from(["a fox", "false", "0"]) | _VALUES)
def test_whatever_the_parser_accepts_the_schema_accepts(prompt, extra):
    fields = {"prompt": prompt, **extra}
    if _accepted(fields):
        assert VALIDATOR.is_valid(fields), (fields, [e.message for e in VALIDATOR.iter_errors(fields)])


KEY_VALIDATOR = Draft202012Validator(_IDEMPOTENCY_KEY["schema"])


@settings(max_examples=500, deadline=None)
@given(key=st.one_of(st.text(min_size=0, max_size=MAX_KEY_CHARS + 3),
                     st.integers(MAX_KEY_CHARS - 2, MAX_KEY_CHARS + 3).map(lambda n: "k" * n),
                     st.integers(MAX_KEY_CHARS - 2, MAX_KEY_CHARS + 1).map(lambda n: f'"{"k" * n}"'),
                     st.integers(MAX_KEY_CHARS - 2, MAX_KEY_CHARS + 1).map(lambda n: f"  {'k' * n} ")))
def test_every_idempotency_key_the_api_takes_fits_its_schema(key):
    try:
        parse_key(key)
    except ApiError:
        return
    assert KEY_VALIDATOR.is_valid(key), (len(key), key[:20])


def test_the_idempotency_key_limit_is_still_refused_past_it():
    with pytest.raises(ApiError):
        parse_key("k" * (MAX_KEY_CHARS + 1))
    assert not KEY_VALIDATOR.is_valid("k" * (MAX_KEY_CHARS + 1))
    assert KEY_VALIDATOR.is_valid(f'"{"k" * MAX_KEY_CHARS}"') and parse_key(f'"{"k" * MAX_KEY_CHARS}"')


JOB_VALIDATOR = Draft202012Validator(model_schemas()["CreateJob"])  # as /openapi.json has it
_JOB_FIELDS = ("seconds", "width", "height", "seed", "aspect_ratio", "release", "webhook_url", "precision", "task")


@settings(max_examples=1000, deadline=None)
@given(extra=st.dictionaries(st.sampled_from(_JOB_FIELDS), _VALUES | st.sampled_from(["128", " +32 ", "2_56", "6.0"]),
                             max_size=3),
       prompt=st.sampled_from(["a fox", "false", "0"]) | _VALUES)
def test_whatever_post_jobs_accepts_its_schema_accepts(prompt, extra):
    """POST /jobs (and each /batches line): pydantic's lax mode reads numbers from text; the schema says so."""
    fields = {"prompt": prompt, **extra}
    try:
        CreateJob.model_validate(fields, context={"max_prompt_chars": 4000})
    except ValidationError:
        return
    assert JOB_VALIDATOR.is_valid(fields), (fields, [e.message for e in JOB_VALIDATOR.iter_errors(fields)])


def test_the_document_states_precision_and_task_on_both_create_routes():
    """POST /jobs' schema names `precision` (bf16, fp8) and `task` (t2va default); /v1/videos' body has `precision`;
    a job shows both."""
    job = model_schemas()["CreateJob"]["properties"]
    assert [f.get("enum") for f in job["precision"]["anyOf"] if "enum" in f] == [["bf16", "fp8"]]
    assert job["task"]["enum"] == ["t2va", "fl2va", "ref2va"] and job["task"]["default"] == "t2va"
    assert "no_capable_worker" in job["precision"]["description"] and "no_capable_worker" in job["task"]["description"]
    videos = create_body_schema()["properties"]["precision"]
    assert {"type": "string", "enum": ["bf16", "fp8"]} in videos["anyOf"]
    assert {"task", "precision"} <= set(model_schemas()["Job"]["properties"])


def test_the_document_states_priority_on_both_create_routes_and_the_job():
    """`priority` (interactive, batch) on POST /jobs and /v1/videos, and on the job and video objects."""
    job = model_schemas()["CreateJob"]["properties"]["priority"]
    assert [f.get("enum") for f in job["anyOf"] if "enum" in f] == [["interactive", "batch"]]
    assert "H3BATCH_INTERACTIVE_STREAK" in job["description"]
    videos = create_body_schema()["properties"]["priority"]
    assert {"type": "string", "enum": ["interactive", "batch"]} in videos["anyOf"]
    assert model_schemas()["Job"]["properties"]["priority"]["enum"] == ["interactive", "batch"]
    assert VideoObject.model_json_schema()["properties"]["priority"]["enum"] == ["interactive", "batch"]


def test_the_document_names_the_model_this_server_serves(tmp_path):
    """H3BATCH_OPENAI_MODEL changes the `model` the parser accepts; /openapi.json follows it."""
    from h3batch.api import create_app  # noqa: PLC0415
    from tests.conftest import start_redis  # noqa: PLC0415

    proc, url = start_redis(tmp_path / "redis")
    try:
        app = create_app({"REDIS_URL": url, "ARTIFACTS_DIR": str(tmp_path / "artifacts"), "API_KEYS": [],
                          "OPENAI_MODEL": "example-org/other-model"})
        doc = app.test_client().get("/openapi.json").get_json()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    body = doc["paths"]["/v1/videos"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    validator = Draft202012Validator(body)
    assert validator.is_valid({"prompt": "a fox", "model": "example-org/other-model"})
    assert not validator.is_valid({"prompt": "a fox", "model": DEFAULT_MODEL_ID})
    assert parse_create({"prompt": "a fox", "model": "example-org/other-model"}, "example-org/other-model")


def test_the_document_states_loras_on_both_create_routes():
    """POST /jobs' schema has `loras` as a list of {ref, scale} (no other keys) with the documented codes; /v1/videos'
    body takes it as a list or its JSON text; a job and a video show the resolved adapters."""
    schemas = model_schemas()
    job = schemas["CreateJob"]["properties"]["loras"]
    assert "lora_base_mismatch" in job["description"] and "unknown_lora" in job["description"]
    item = schemas["LoraItem"]
    assert set(item["properties"]) == {"ref", "scale"} and item["additionalProperties"] is False
    assert item["properties"]["scale"]["maximum"] == 4.0
    videos = create_body_schema()["properties"]["loras"]
    assert {"type": "array", "items": {"type": "object"}} in videos["anyOf"]
    assert "loras" in schemas["Job"]["properties"]
