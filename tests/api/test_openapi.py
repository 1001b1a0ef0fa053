"""GET /openapi.json against the app it documents: every rule of Flask's URL map is a documented operation (or left
out by name, with a reason) and every documented operation has a rule (the paths are written by hand in
api/openapi.py, and /sweeps once answered 200 without being there); the routes open without a key say so; the
/sweeps schemas match what the views take and answer, on a real Redis."""
from __future__ import annotations

import re

import pytest
from jsonschema import Draft202012Validator

from h3batch.api import auth, create_app
from h3batch.api.openapi import NOT_DOCUMENTED, sweep_request_schema
from h3batch.loadrunner.sweep_spec import SweepRequest, parse_sweep_request
from h3batch.loadrunner.sweep_store import create_sweep, update_record
from tests.conftest import SCRATCH_DB

METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture
def app(redis_url, scratch_redis, tmp_path):
    """The app on the session Redis' scratch database (flushed by `scratch_redis`), sweeps' files under tmp_path."""
    return create_app({"TESTING": True, "REDIS_URL": f"{redis_url.rsplit('/', 1)[0]}/{SCRATCH_DB}", "API_KEYS": [],
                       "SWEEP_RESULTS_DIR": str(tmp_path), "SWEEP_ALLOW_LOOPBACK": True})


def served(app) -> dict:
    reply = app.test_client().get("/openapi.json")
    assert reply.status_code == 200
    return reply.get_json()


def routes(app) -> set[tuple[str, str]]:
    """(path in OpenAPI form, method) of every rule but the static files; HEAD and OPTIONS are Flask's own."""
    found = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[^<>:]+:)?([^<>]+)>", r"{\1}", rule.rule)  # <id>, <path:name> -> {id}, {name}
        found |= {(path, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"}}
    return found


def documented(doc: dict) -> set[tuple[str, str]]:
    return {(path, method) for path, item in doc["paths"].items() for method in item if method in METHODS}


def test_every_route_is_documented_and_every_documented_operation_has_a_route(app):
    """The URL map and the served document name the same (path, method) pairs, both ways, but for the few routes
    api/openapi.py leaves out by name, each of which still exists and is absent from the document."""
    doc, mapped = served(app), routes(app)
    assert ("/sweeps", "get") in mapped  # the walk sees the blueprint that once went undocumented
    assert sorted(mapped - documented(doc) - set(NOT_DOCUMENTED)) == [], "routes missing from /openapi.json"
    assert sorted(documented(doc) - mapped) == [], "documented operations with no route"
    assert set(NOT_DOCUMENTED) <= mapped and not set(NOT_DOCUMENTED) & documented(doc)


def test_path_parameters_are_declared_and_operation_ids_unique(app):
    """Each {name} in a documented path is a declared path parameter of its operations; no operationId repeats."""
    doc = served(app)
    ids = []
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{([^}]+)}", path)), (path, method)
            ids.append(operation["operationId"])
    assert len(ids) == len(set(ids))


def test_open_routes_declare_their_own_security(app):
    """The routes served without a key (api/auth.py OPEN_PATHS) override the document's bearer scheme; every other
    operation inherits it."""
    doc = served(app)
    for path, method in documented(doc):
        operation = doc["paths"][path][method]
        assert ("security" in operation) == (path in auth.OPEN_PATHS), (path, method)


SWEEP_SCHEMA = Draft202012Validator(sweep_request_schema())


def test_sweep_request_schema_has_one_property_per_field_the_parser_reads():
    """The body's properties are SweepRequest's fields (an unknown one is refused by both)."""
    assert set(sweep_request_schema()["properties"]) == set(SweepRequest.__dataclass_fields__)
    Draft202012Validator.check_schema(sweep_request_schema())


@pytest.mark.parametrize("body", [
    {"url": "ws://127.0.0.1:9", "sessions": 2},
    {"url": "wss://example.com/duplex", "sessions": [1, 4], "load_frames": [6, 250], "repetitions": 2,
     "model": None, "input_wav": "speech.wav", "drain_s": 1, "max_client_rtf": None, "max_stream_rtf": 1.5,
     "labels": {"server_revision": "r1", "server_hardware": "h100"}},
])
def test_bodies_the_parser_accepts_validate(body):
    parse_sweep_request(body)
    assert SWEEP_SCHEMA.is_valid(body), [e.message for e in SWEEP_SCHEMA.iter_errors(body)]


@pytest.mark.parametrize("body", [
    {"url": "http://127.0.0.1:9", "sessions": 1}, {"url": "ws://127.0.0.1:9"},
    {"url": "ws://127.0.0.1:9", "sessions": 0}, {"url": "ws://127.0.0.1:9", "sessions": []},
    {"url": "ws://127.0.0.1:9", "sessions": 1, "repetitions": 17}, {"url": "ws://127.0.0.1:9", "sessions": 1, "x": 1},
    {"url": "ws://127.0.0.1:9", "sessions": 1, "drain_s": "2"}, {"url": "ws://127.0.0.1:9", "sessions": 1,
                                                                 "labels": {"a": 1}},
])
def test_bodies_the_schema_refuses_the_parser_refuses(body):
    """Schema-violating bodies (what Schemathesis' negative phase sends) are refused at the door too."""
    assert not SWEEP_SCHEMA.is_valid(body)
    with pytest.raises(ValueError):
        parse_sweep_request(body)


def answers(doc: dict, path: str, method: str, reply) -> None:
    """The reply's status and content type are documented for the operation, and a JSON body validates."""
    responses = doc["paths"][path][method]["responses"]
    assert str(reply.status_code) in responses, (path, reply.status_code, reply.get_data(as_text=True)[:200])
    content = responses[str(reply.status_code)].get("content", {})
    assert reply.mimetype in content, (path, reply.mimetype, sorted(content))
    if reply.mimetype == "application/json":
        schema = {"components": doc["components"], **content["application/json"]["schema"]}
        errors = [e.message for e in Draft202012Validator(schema).iter_errors(reply.get_json())]
        assert not errors, (path, reply.status_code, errors)


def test_sweep_routes_answer_as_documented(app, scratch_redis, tmp_path):
    """A created, listed, read and finished sweep, its files and its refusals all match the documented statuses,
    content types and schemas."""
    doc, client = served(app), app.test_client()
    made = client.post("/sweeps", json={"url": "ws://127.0.0.1:9", "sessions": [1, 2], "load_frames": [6]})
    assert made.status_code == 202
    answers(doc, "/sweeps", "post", made)
    sweep_id = made.get_json()["id"]
    answers(doc, "/sweeps", "get", client.get("/sweeps"))
    answers(doc, "/sweeps/{sweep_id}", "get", client.get(f"/sweeps/{sweep_id}"))

    # a finished sweep, as the worker leaves it: the record's summary names its files, which the API serves
    done = "sw_00000000000000aa"
    create_sweep(scratch_redis, done, {"url": "ws://127.0.0.1:9", "sessions": [1]}, ["n01-f6-r0"], "schedule:x")
    (tmp_path / done / "n01-f6-r0").mkdir(parents=True)
    (tmp_path / done / "summary.json").write_text('{"points": []}')
    (tmp_path / done / "summary.csv").write_text("point,ok\n")
    (tmp_path / done / "latency.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / done / "n01-f6-r0" / "load-result.json").write_text("{}")
    summary = {"files": {"summary_json": "summary.json", "summary_csv": "summary.csv", "plots": ["latency.png"],
                         "reports": {"n01-f6-r0": "n01-f6-r0/load-result.json"}}}
    update_record(scratch_redis, done, status="done", summary=summary, finished_at="2026-12-06T00:00:00Z")
    record = client.get(f"/sweeps/{done}")
    answers(doc, "/sweeps/{sweep_id}", "get", record)
    links = record.get_json()["links"]
    for url in (links["summary_json"], links["summary_csv"], links["plots"]["latency"],
                links["reports"]["n01-f6-r0"]):
        answers(doc, "/sweeps/{sweep_id}/files/{name}", "get", client.get(url))
    answers(doc, "/sweeps/{sweep_id}/files/{name}", "get",
            client.get(links["summary_csv"], headers={"Range": "bytes=0-3"}))

    for path, method, reply in (
            ("/sweeps", "post", client.post("/sweeps", json={"url": "http://x", "sessions": 1})),
            ("/sweeps", "post", client.post("/sweeps", data="not json", content_type="text/plain")),
            ("/sweeps", "get", client.get("/sweeps?limit=0")),
            ("/sweeps/{sweep_id}", "get", client.get("/sweeps/sw_0123456789abcdef")),
            ("/sweeps/{sweep_id}/files/{name}", "get", client.get(f"/sweeps/{done}/files/nope.png"))):
        assert 400 <= reply.status_code < 500
        answers(doc, path, method, reply)
    assert client.get("/sweeps").get_json()["sweeps"][0]["id"] in (sweep_id, done)


@pytest.mark.parametrize("path", ["/", "/ui/batches", "/ui/sweeps", "/openapi.json"])
def test_pages_and_the_document_answer_as_documented(app, path):
    answers(served(app), path, "get", app.test_client().get(path))


@pytest.mark.parametrize("path", ["/v1/videos/edits", "/v1/videos/extensions", "/v1/videos/characters",
                                  "/v1/videos/vid_1/remix"])
def test_the_routes_left_out_answer_not_offered(app, path):
    """What NOT_DOCUMENTED says of them: a 404 not_offered in the documented error shape."""
    doc = served(app)
    reply = app.test_client().post(path, json={"prompt": "x"})
    assert reply.status_code == 404 and reply.get_json()["error"]["code"] == "not_offered"
    schema = {"components": doc["components"], "$ref": "#/components/schemas/ErrorBody"}
    assert Draft202012Validator(schema).is_valid(reply.get_json())
