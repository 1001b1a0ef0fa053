"""GET /openapi.json: an OpenAPI 3.1 document whose schemas are generated from api/schemas.py's pydantic models.

Paths are written out here by hand: /jobs and the health routes, /batches, /sweeps, the OpenAI-compatible /v1/videos,
the web pages and this document. Each lists every status code its view can return and its request rules (header
and query forms, text numbers), which no route-to-OpenAPI generator infers from plain Flask views; adopting one
(flask-openapi3, apispec) would mean rewriting every view around its decorators. What a generator would guarantee,
that the document and the routes agree, tests/api/test_openapi.py checks instead: every rule of the URL map is
documented with its methods (or named in NOT_DOCUMENTED with its reason), and every documented path has a rule.
"""
from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from pydantic.json_schema import GenerateJsonSchema, models_json_schema

from h3batch.api import media, schemas
from h3batch.api.idempotency import MAX_KEY_CHARS
from h3batch.api.openai_protocol import VideoObject, create_body_schema
from h3batch.api.openai_videos import model_id
from h3batch.core import defaults
from h3batch.loadrunner.sweep_spec import MAX_LOAD_FRAMES, MAX_SESSIONS
from h3batch.loadrunner.sweep_spec import MAX_POINTS as MAX_SWEEP_POINTS
from h3batch.loadrunner.sweep_store import PointStatus, SweepStatus

bp = Blueprint("openapi", __name__)

_REF = "#/components/schemas/{model}"

NOT_DOCUMENTED = {
    ("/v1/videos/{video_id}/remix", "post"): "Sora's remix: 404 not_offered",
    ("/v1/videos/edits", "post"): "Sora's edits: 404 not_offered",
    ("/v1/videos/extensions", "post"): "Sora's extensions: 404 not_offered",
    ("/v1/videos/characters", "post"): "Sora's characters: 404 not_offered",
}
"""Routes left out of the document, each with its reason: they exist only to answer SDK calls for what h3batch does
not offer (docs/api.md). Three share their URL with /v1/videos/{video_id}, whose GET and DELETE answer there too;
a concrete path in the document would claim those methods are not allowed (405)."""


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


_IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                    "schema": {"type": "string", "minLength": 1,
                               # idempotency.parse_key strips spaces and one pair of quotes (a structured-field
                               # string) before its 1..MAX_KEY_CHARS check: both forms are accepted
                               "pattern": r'^\s*("[\s\S]{1,%d}"|[\s\S]{1,%d})\s*$' % (MAX_KEY_CHARS, MAX_KEY_CHARS)},
                    "description": f"Retry-safe create: same key + body returns the first job; 1..{MAX_KEY_CHARS} "
                                   "characters, optionally in double quotes"}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {400: "Invalid request", 401: "Missing or bad API key", 404: "No such job or batch",
            409: "Wrong job state or Idempotency-Key in use",
            410: "Video expired", 413: "Body over its limit (64 KiB; 48 MiB on POST /jobs and /v1/videos), or "
                                      "an input image over 16 MiB or 4096x4096 (image_too_large)", 416: "Range not satisfiable",
            422: "Idempotency-Key reused with another body, webhook_url refused, invalid_webhook_events (an "
                 "unknown event, or webhook_events without webhook_url), exceeds_worker_capacity (the request needs "
                 "more rows than any worker serves), or json_too_complex (the body nests over 32 deep or holds more "
                 "tokens than the API parses)", 503: "Redis or queue full",
            429: "Over the API key's rate limit (rate_limited: Retry-After, RateLimit headers; api/ratelimit.py), "
                 "or too_many_active_jobs (H3BATCH_MAX_ACTIVE_PER_KEY)"}
    # 429 may answer any authenticated route: the per-key rate limit runs before every view.
    return {str(s): _json("ErrorBody", text[s]) for s in (*statuses, 429)}


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_WAIT = {"name": "wait", "in": "query", "required": False,
         "schema": {"type": "number", "minimum": 0, "maximum": 60},
         "description": "Block up to this many seconds for the job to finish (same as `Prefer: wait=N`)."}
_LINKS = {
    "GetJob": {"operationId": "getJob", "parameters": {"job_id": "$response.body#/id"}},
    "CancelJob": {"operationId": "cancelJob", "parameters": {"job_id": "$response.body#/id"}},
    "DeleteJob": {"operationId": "deleteJob", "parameters": {"job_id": "$response.body#/id"}},
    "GetContent": {"operationId": "getJobContent", "parameters": {"job_id": "$response.body#/id"}},
    "GetEvents": {"operationId": "getJobEvents", "parameters": {"job_id": "$response.body#/id"}},
}


def _paths() -> dict[str, Any]:
    job_ok = {**_json("Job", "The job"), "links": _LINKS}
    return {
        "/jobs": {
            "post": {"operationId": "createJob", "summary": "Queue a render",
                     "requestBody": {"required": True,
                                     "content": {"application/json": {"schema": _ref("CreateJobWithImages")},
                                                 "multipart/form-data": {"schema": _ref("CreateJobForm")}}},
                     "parameters": [{"name": "Prefer", "in": "header", "required": False,
                                     "schema": {"type": "string"}, "description": "`wait=N`: block up to N s"},
                                    _IDEMPOTENCY_KEY],
                     "responses": {"202": {**job_ok, "description": "Queued (Location: /jobs/{id})"},
                                   "200": {**job_ok, "description": "Finished within Prefer: wait"},
                                   **_errors(400, 401, 404, 409, 413, 422, 503)}},
            "get": {"operationId": "listJobs", "summary": "List jobs, newest first",
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                        {"name": "after", "in": "query", "schema": {"type": "string", "minLength": 1},
                         "description": "last_id of the previous page; an id that is not one of your jobs is 400 "
                                        "invalid_cursor"},
                        {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
                        {"name": "status", "in": "query", "schema": {"enum": list(schemas.StatusName.__args__)}}],
                    "responses": {"200": _json("JobList", "One page"), **_errors(400, 401, 503)}},
        },
        "/jobs/{job_id}": {
            "get": {"operationId": "getJob", "summary": "One job", "parameters": [_JOB_ID, _WAIT],
                    "responses": {"200": job_ok, **_errors(400, 401, 404, 503)}},
            "delete": {"operationId": "deleteJob", "summary": "Abort if active, remove job and files",
                       "parameters": [_JOB_ID],
                       "responses": {"204": {"description": "Deleted"}, **_errors(401, 404, 503)}},
        },
        "/jobs/{job_id}/cancel": {
            "post": {"operationId": "cancelJob", "summary": "Cancel a queued or running job", "parameters": [_JOB_ID],
                     "responses": {"202": _json("Job", "Cancelled, or cancel requested"),
                                   **_errors(401, 404, 409, 503)}},
        },
        "/jobs/{job_id}/content": {
            "get": {"operationId": "getJobContent", "summary": "The MP4 (Range, ETag)", "parameters": [_JOB_ID],
                    "responses": {
                        "200": {"description": "Whole video", "content": {"video/mp4": {"schema": {
                            "type": "string", "format": "binary"}}}},
                        "206": {"description": "Byte range", "content": {"video/mp4": {"schema": {
                            "type": "string", "format": "binary"}}}},
                        "304": {"description": "Not modified (If-None-Match)"},
                        **_errors(401, 404, 409, 410, 416, 503)}},
        },
        "/jobs/{job_id}/events": {
            "get": {"operationId": "getJobEvents", "summary": "Server-sent events until the job finishes",
                    "parameters": [_JOB_ID, {"name": "Last-Event-ID", "in": "header", "required": False,
                                             "schema": {"type": "string", "pattern": r"^\d+-\d+$"},
                                             "description": "Replay the events after this one."}],
                    "responses": {"200": {"description": "`text/event-stream`; `event:` is status, stage, "
                                                         "progress, completed, failed or cancelled; `data:` JSON",
                                          "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                                  **_errors(400, 401, 404, 503)}},
        },
        "/jobs/{job_id}/logs": {
            "get": {"operationId": "getJobLogs", "summary": "The worker's log lines about this job, oldest first "
                    "(messages only, redacted; the newest 500)", "parameters": [_JOB_ID],
                    "responses": {"200": {"description": "`{object: list, job_id, data: [{ts, level, logger, "
                                                         "message}]}`",
                                          "content": {"application/json": {"schema": {"type": "object"}}}},
                                  **_errors(401, 404, 503)}},
        },
        "/usage": {
            "get": {"operationId": "getUsage", "summary": "The calling key's jobs by final status, seconds of video "
                    "and GPU-seconds over UTC days (counted once per job, when it finishes)",
                    "parameters": [
                        {"name": name, "in": "query", "required": False, "schema": {"type": "string"},
                         "description": f"{what}: ISO-8601 (2026-12-01, 2026-12-01T08:00:00Z) or Unix seconds; "
                                        f"the UTC day it falls on is summed whole"}
                        for name, what in (("from", f"Window start (default: {defaults.USAGE_DEFAULT_DAYS} days "
                                                    f"before `to`)"), ("to", "Window end (default: now)"))],
                    "responses": {"200": _json("Usage", "Usage over the window"), **_errors(400, 401, 503)}},
        },
        "/healthz": {"get": {"operationId": "healthz", "summary": "Process alive", "security": [],
                             "responses": {"200": {"description": "Alive"}}}},
        "/readyz": {"get": {"operationId": "readyz", "summary": "Redis reachable and a worker heartbeat fresh",
                            "security": [],
                            "responses": {"200": {"description": "Ready"}, "503": {"description": "Not ready"}}}},
        "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics of the whole service "
                             "(docs/service.md, Metrics); H3BATCH_METRICS_TOKEN as Bearer, or loopback only",
                             "security": [{"metricsToken": []}, {}],
                             "responses": {"200": {"description": "Prometheus text exposition format",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}},
                                           "401": _json("ErrorBody", "Missing or wrong metrics token"),
                                           "403": _json("ErrorBody", "Not a loopback client and no token set"),
                                           "503": _json("ErrorBody", "Redis unavailable")}}},
    }


def _openai_paths() -> dict[str, Any]:
    """/v1/videos (api/openai_videos.py): the OpenAI-compatible view; its video object schema is inlined."""
    def error(description: str) -> dict[str, Any]:
        return _json("ErrorBody", description)

    video = {"description": "A video object", "content": {"application/json": {"schema":
                                                                               VideoObject.model_json_schema()}}}
    video_id = {"name": "video_id", "in": "path", "required": True, "schema": {"type": "string"}}
    create_fields = create_body_schema(model_id())  # the model this server serves
    common = {"401": error("Missing or bad API key"), "429": error("Over the key's rate limit, or its active-job "
                                                                    "cap (too_many_active_jobs)"),
              "503": error("Redis or queue full")}
    return {
        "/v1/videos": {
            "post": {"operationId": "createVideo", "summary": "OpenAI-compatible create (JSON or multipart)",
                     "parameters": [_IDEMPOTENCY_KEY],
                     "requestBody": {"required": True, "content": {"application/json": {"schema": create_fields},
                                                                   "multipart/form-data": {"schema": create_fields}}},
                     "responses": {"202": video, "400": error("Unsupported field, model, size or duration"),
                                   "409": error("Idempotency-Key in use"),
                                   "422": error("webhook_url refused, Idempotency-Key reused, "
                                                 "exceeds_worker_capacity (more rows than any worker serves), or "
                                                 "json_too_complex (the body costs too much to parse)"),
                                   **common}},
            "get": {"operationId": "listVideos", "summary": "OpenAI-compatible list",
                    "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                               "maximum": defaults.LIST_MAX_LIMIT}},
                                   {"name": "after", "in": "query", "schema": {"type": "string"}},
                                   {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}}],
                    "responses": {"200": {"description": "{object: list, data, first_id, last_id, has_more}",
                                          "content": {"application/json": {"schema": {"type": "object"}}}},
                                  "400": error("Bad limit, order or cursor"), **common}},
        },
        "/v1/videos/{video_id}": {
            "get": {"operationId": "retrieveVideo", "parameters": [video_id],
                    "responses": {"200": video, "404": error("No such video"), **common}},
            "delete": {"operationId": "deleteVideo", "parameters": [video_id],
                       "responses": {"200": {"description": "{id, object: video.deleted, deleted: true}",
                                             "content": {"application/json": {"schema": {"type": "object"}}}},
                                     "404": error("No such video"), **common}},
        },
        "/v1/videos/{video_id}/content": {
            "get": {"operationId": "downloadVideoContent", "parameters": [
                        video_id, {"name": "variant", "in": "query", "schema": {"enum": list(media.VARIANTS)}}],
                    "responses": {"200": {"description": "MP4, PNG thumbnail, JPEG sprite sheet (up to "
                                                         f"{media.SPRITE_FRAMES} evenly spaced frames in a grid, tiles "
                                                         f"{media.SPRITE_TILE_WIDTH} px wide at the clip's aspect) or "
                                                         "AAC .m4a", "content": {
                                      "video/mp4": {"schema": {"type": "string", "format": "binary"}},
                                      "image/png": {"schema": {"type": "string", "format": "binary"}},
                                      "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
                                      "audio/mp4": {"schema": {"type": "string", "format": "binary"}}}},
                                  "206": {"description": "Byte range"}, "304": {"description": "Not modified"},
                                  "400": error("Unknown variant"), "404": error("No such video"),
                                  "409": error("Not completed"), "410": error("Expired"),
                                  "416": error("Range not satisfiable"), **common}},
        },
    }


def _batch_paths() -> dict[str, Any]:
    """/batches (api/batches.py); the batch object and results line are inlined."""
    batch_id = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}
    counts = {"type": "object", "properties": {k: {"type": "integer", "minimum": 0} for k in
                                               ("total", "queued", "in_progress", "completed", "failed", "cancelled")}}
    line_error = {"type": "object", "properties": {"line": {"type": "integer"}, "field": {"type": "string"},
                                                   "message": {"type": "string"}}}
    batch = {"type": "object", "required": ["id", "object", "status", "counts", "progress"], "properties": {
        "id": {"type": "string"}, "object": {"const": "batch"},
        "status": {"enum": ["queued", "in_progress", "completed", "cancelled"]}, "counts": counts,
        "progress": {"type": "number", "minimum": 0, "maximum": 1},
        "eta_s": {"type": ["number", "null"], "description": "From this batch's measured job times; null until one "
                                                              "item has completed"},
        "created_at": {"type": "number"}, "finished_at": {"type": ["number", "null"]},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "skipped": {"type": "array", "items": line_error}, "webhook_url": {"type": ["string", "null"]},
        "results_url": {"type": "string"}, "archive_url": {"type": "string"}}}
    batch_json = {"description": "The batch", "content": {"application/json": {"schema": batch}}}
    create_json = {"type": "object", "required": ["requests"], "properties": {
        "requests": {"type": "array", "minItems": 1, "maxItems": defaults.MAX_BATCH,
                     "items": {"type": "object", "description": "A POST /jobs body, plus an optional custom_id "
                                                                "(1..64 of A-Z a-z 0-9 . _ -), unique in the batch"}},
        "metadata": {"type": "object", "maxProperties": defaults.BATCH_METADATA_KEYS,
                     "additionalProperties": {"type": "string", "maxLength": defaults.BATCH_METADATA_VALUE_CHARS}},
        "on_invalid": {"enum": ["reject", "skip"]}, "webhook_url": {"type": "string"}}}
    create_form = {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary", "description": "JSONL: one job request per line"},
        "metadata": {"type": "string", "description": "a JSON object"}, "on_invalid": {"enum": ["reject", "skip"]},
        "webhook_url": {"type": "string"}}}
    batch_links = {name: {"operationId": op, "parameters": {"batch_id": "$response.body#/id"}} for name, op in (
        ("GetBatch", "getBatch"), ("CancelBatch", "cancelBatch"), ("DeleteBatch", "deleteBatch"),
        ("GetBatchResults", "getBatchResults"), ("GetBatchArchive", "getBatchArchive"))}
    list_json = {"description": "{object: list, data: [batch], first_id, last_id, has_more}",
                 "content": {"application/json": {"schema": {"type": "object"}}}}
    return {
        "/batches": {
            "post": {"operationId": "createBatch", "summary": "Queue many job requests as one batch",
                     "parameters": [_IDEMPOTENCY_KEY],
                     "requestBody": {"required": True, "content": {"application/json": {"schema": create_json},
                                                                   "multipart/form-data": {"schema": create_form}}},
                     "responses": {"202": {**batch_json, "description": "Queued (Location: /batches/{id})",
                                           "links": batch_links},
                                   **_errors(400, 401, 404, 409, 413, 422, 503)}},
            "get": {"operationId": "listBatches", "summary": "List batches, newest first",
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                        {"name": "after", "in": "query", "schema": {"type": "string", "minLength": 1}}],
                    "responses": {"200": list_json, **_errors(400, 401, 503)}},
        },
        "/batches/{batch_id}": {
            "get": {"operationId": "getBatch", "summary": "One batch: counts, progress, ETA", "parameters": [batch_id],
                    "responses": {"200": batch_json, **_errors(400, 401, 404, 503)}},
            "delete": {"operationId": "deleteBatch", "summary": "Remove the batch, its jobs and files",
                       "parameters": [batch_id],
                       "responses": {"200": {"description": "{id, object: batch.deleted, deleted: true}",
                                             "content": {"application/json": {"schema": {"type": "object"}}}},
                                     **_errors(400, 401, 404, 503)}},
        },
        "/batches/{batch_id}/cancel": {
            "post": {"operationId": "cancelBatch", "summary": "Cancel every item not finished",
                     "parameters": [batch_id], "responses": {"200": batch_json, **_errors(400, 401, 404, 409, 503)}},
        },
        "/batches/{batch_id}/results": {
            "get": {"operationId": "getBatchResults", "summary": "One JSON line per item, in input order",
                    "parameters": [batch_id],
                    "responses": {"200": {"description": "{index, custom_id, job_id, status, error, content_url} "
                                                         "per line",
                                          "content": {"application/x-ndjson": {"schema": {"type": "string"}}}},
                                  **_errors(400, 401, 404, 503)}},
        },
        "/batches/{batch_id}/archive": {
            "get": {"operationId": "getBatchArchive", "summary": "Zip of the finished MP4s plus manifest.jsonl "
                                                                "(Range, If-Range, ETag)",
                    "parameters": [batch_id],
                    "responses": {"200": {"description": "Whole archive", "content": {"application/zip": {
                                      "schema": {"type": "string", "format": "binary"}}}},
                                  "206": {"description": "Byte range", "content": {"application/zip": {
                                      "schema": {"type": "string", "format": "binary"}}}},
                                  "304": {"description": "Not modified (If-None-Match)"},
                                  **_errors(400, 401, 404, 409, 416, 503)}},
        },
    }


def sweep_request_schema() -> dict[str, Any]:
    """POST /sweeps' body (loadrunner/sweep_spec.py `parse_sweep_request`; a stdlib dataclass, as the load runner
    has no pydantic). Never narrower than the parser: where a rule has no JSON Schema form (the driver's own checks
    across fields; label and WAV names, whose Python patterns take Unicode letters and a trailing newline) the
    parser refuses what the schema lets through, never the reverse."""
    def grid(high: int) -> dict[str, Any]:
        value = {"type": "integer", "minimum": 1, "maximum": high}
        return {"anyOf": [value, {"type": "array", "minItems": 1, "items": value}]}

    number, count = {"type": "number"}, {"type": "integer"}
    optional_number, optional_text = {"type": ["number", "null"]}, {"type": ["string", "null"]}
    properties = {
        "url": {"type": "string", "pattern": "^wss?://",
                "description": "the duplex server (ws:// or wss://), vetted like a webhook URL"},
        "sessions": {**grid(MAX_SESSIONS), "description": "session counts of the grid (one or a list)"},
        "load_frames": {**grid(MAX_LOAD_FRAMES), "description": "load frames of the grid; default [250]"},
        "repetitions": {"type": "integer", "minimum": 1, "maximum": 16},
        "model": optional_text,
        "input_wav": {**optional_text, "description": "a WAV of the sweep input set, by name (no path)"},
        "expected_input_sha256": optional_text,
        "drain_s": number, "tail_s": number, "timeout_s": number, "cleanup_timeout_s": number,
        "max_frame_deficit": count, "min_voiced_frames": count, "minimum_audio_chunks": count,
        "voiced_frame_rms_threshold": number,
        "max_client_rtf": optional_number, "max_stream_rtf": optional_number, "max_lag_drift_ms": optional_number,
        "labels": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1},
                   "description": "server_revision, server_hardware and free-form labels"},
    }
    return {"type": "object", "required": ["url", "sessions"], "additionalProperties": False,
            "properties": properties,
            "description": f"A grid of sessions x load frames x repetitions, at most {MAX_SWEEP_POINTS} points"}


def _sweep_paths() -> dict[str, Any]:
    """/sweeps (api/sweeps.py): load-runner sweeps; the record (loadrunner/sweep_store.py) is inlined."""
    sweep_id = {"name": "sweep_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
                "description": "sw_<16 hex>"}
    text_or_null = {"type": ["string", "null"]}
    sweep = {"type": "object", "required": ["id", "status", "origin", "created_at", "request", "point_ids", "links"],
             "properties": {
                 "id": {"type": "string"}, "status": {"enum": [s.value for s in SweepStatus]},
                 "origin": {"type": "string", "description": "`api`, or `schedule:<name>` for the beat's"},
                 "owner": text_or_null, "created_at": {"type": "string"}, "started_at": text_or_null,
                 "finished_at": text_or_null, "request": {"type": "object"},
                 "point_ids": {"type": "array", "items": {"type": "string"}},
                 "summary": {"type": ["object", "null"]}, "error": text_or_null,
                 "points": {"type": "array", "description": "GET /sweeps/{sweep_id} only",
                            "items": {"type": "object", "required": ["id", "status"], "properties": {
                                "id": {"type": "string"}, "status": {"enum": [s.value for s in PointStatus]}}}},
                 "links": {"type": "object", "description": "self; once finished also summary_json, summary_csv, "
                                                            "plots and reports (URLs of GET .../files/{name})"}}}
    sweep_json = {"description": "The sweep", "content": {"application/json": {"schema": sweep}}}
    not_found = _json("ErrorBody", "No such sweep (sweep_not_found; also another key's)")
    binary = {"schema": {"type": "string", "format": "binary"}}
    files = {"image/png": binary, "application/json": {"schema": {}}, "text/csv": {"schema": {"type": "string"}}}
    return {
        "/sweeps": {
            "post": {"operationId": "createSweep", "summary": "Queue a load-runner sweep",
                     "requestBody": {"required": True,
                                     "content": {"application/json": {"schema": sweep_request_schema()}}},
                     "responses": {"202": {**sweep_json, "description": "Queued (Location: /sweeps/{id})"},
                                   "400": _json("ErrorBody", "invalid_sweep: the grid, a field or the target URL"),
                                   "413": _json("ErrorBody", "Body over 64 KiB"),
                                   "422": _json("ErrorBody", "json_too_complex (the body costs too much to parse)"),
                                   **_errors(401, 503)}},
            "get": {"operationId": "listSweeps", "summary": "The caller's and the scheduled sweeps, newest first, "
                                                            "without points",
                    "parameters": [{"name": "limit", "in": "query",
                                    "schema": {"type": "integer", "minimum": 1, "maximum": 200}}],
                    "responses": {"200": {"description": "{sweeps: [sweep]}", "content": {"application/json": {
                                      "schema": {"type": "object", "required": ["sweeps"], "properties": {
                                          "sweeps": {"type": "array", "items": sweep}}}}}},
                                  "400": _json("ErrorBody", "invalid_limit, or a repeated query parameter"),
                                  **_errors(401, 503)}},
        },
        "/sweeps/{sweep_id}": {
            "get": {"operationId": "getSweep", "summary": "Status, per-point results and links to the files",
                    "parameters": [sweep_id],
                    "responses": {"200": sweep_json, "404": not_found, **_errors(400, 401, 503)}},
        },
        "/sweeps/{sweep_id}/files/{name}": {
            "get": {"operationId": "getSweepFile", "summary": "A plot (PNG), the summary (JSON, CSV) or a point's "
                                                              "load-result.json (Range, ETag)",
                    "parameters": [sweep_id, {"name": "name", "in": "path", "required": True,
                                              "schema": {"type": "string", "minLength": 1},
                                              "description": "as the sweep's links name it, e.g. summary.json or "
                                                             "<point id>/load-result.json"}],
                    "responses": {"200": {"description": "The file", "content": files},
                                  "206": {"description": "Byte range", "content": files},
                                  "304": {"description": "Not modified"},
                                  "404": _json("ErrorBody", "sweep_not_found or file_not_found"),
                                  "416": _json("ErrorBody", "Range not satisfiable"), **_errors(400, 401, 503)}},
        },
    }


def _page_paths() -> dict[str, Any]:
    """The web pages (api/web.py) and this document: served without a key."""
    html = {"200": {"description": "The page", "content": {"text/html": {"schema": {"type": "string"}}}}}
    pages = {"/": ("webIndex", "Web page: submit a prompt, live progress, the gallery"),
             "/ui/batches": ("webBatches", "Web page: upload a JSONL file as a batch and follow it"),
             "/ui/sweeps": ("webSweeps", "Web page: load-runner sweeps and their plots")}
    paths = {path: {"get": {"operationId": op, "summary": summary, "security": [], "responses": html}}
             for path, (op, summary) in pages.items()}
    paths["/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This document (OpenAPI 3.1)", "security": [],
        "responses": {"200": {"description": "The document",
                              "content": {"application/json": {"schema": {"type": "object"}}}}}}}
    return paths


class _NumbersAlsoAsText(GenerateJsonSchema):
    """Request bodies: pydantic's lax mode reads numbers from text ("7", " +7 ", "2_56"; the web page sends a seed as
    text so 63-bit values stay exact), so every int and float of a validation-mode model also takes a string. The
    document must not be narrower than what is accepted: Schemathesis sends schema-violating bodies and expects
    them refused. Responses (serialization mode) keep their plain number types."""

    def int_schema(self, schema):
        return self._or_text(super().int_schema(schema))

    def float_schema(self, schema):
        return self._or_text(super().float_schema(schema))

    def _or_text(self, number: dict[str, Any]) -> dict[str, Any]:
        if self.mode != "validation":
            return number
        return {"anyOf": [number, {"type": "string", "description": "the number as text"}]}


def model_schemas() -> dict[str, Any]:
    """The document's component schemas, generated from api/schemas.py's models."""
    models = [(schemas.CreateJob, "validation"), (schemas.Job, "serialization"), (schemas.JobList, "serialization"),
              (schemas.ErrorBody, "serialization"), (schemas.Usage, "serialization")]
    _, top = models_json_schema(models, ref_template=_REF, schema_generator=_NumbersAlsoAsText)
    found = top.get("$defs", {})
    found.update(_image_bodies(found["CreateJob"]))
    return found


def _image_bodies(create: dict[str, Any]) -> dict[str, Any]:
    """POST /jobs with input images (api/job_inputs.py): the JSON body (images as base64 `data:` URLs) and the
    multipart body (images as file parts, `references` repeated), each CreateJob's fields plus the three images."""
    import copy  # noqa: PLC0415

    from h3batch.api.job_inputs import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_REFERENCES  # noqa: PLC0415

    limits = (f"at most {MAX_IMAGE_BYTES // 2**20} MiB and {MAX_IMAGE_PIXELS} pixels (4096x4096); 413 "
              f"image_too_large above, 400 invalid_image for what is not an image")
    data_url = {"type": "string", "pattern": "^data:", "description": f"a base64 data: URL ({limits})"}
    binary = {"type": "string", "contentMediaType": "image/*", "description": f"an image file ({limits})"}
    what = {"first_frame": "fl2va: the keyframe the clip starts from, stretched onto the canvas",
            "last_frame": "fl2va: the keyframe the clip ends on (cover-cropped onto the canvas when a first_frame is "
                          "given too)",
            "references": f"ref2va: 1 to {MAX_REFERENCES} reference images, in the order the prompt reads them "
                          f"(<Picture 1> ...)"}
    bodies = {}
    for name, image in (("CreateJobWithImages", data_url), ("CreateJobForm", binary)):
        body = copy.deepcopy(create)
        body["title"] = name
        body["properties"].update({
            "first_frame": {**image, "description": f"{what['first_frame']}; {image['description']}"},
            "last_frame": {**image, "description": f"{what['last_frame']}; {image['description']}"},
            "references": {"type": "array", "items": image, "minItems": 1, "maxItems": MAX_REFERENCES,
                           "description": what["references"]}})
        bodies[name] = body
    return bodies


def build_document() -> dict[str, Any]:
    paths = _paths()
    paths.update(_batch_paths())
    paths.update(_sweep_paths())
    paths.update(_openai_paths())
    paths.update(_page_paths())
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "h3batch job API", "version": "0.1.0",
                 "description": "Text prompt → MP4 with stereo sound (FastH3 8-Step V2). Errors: "
                                "{\"error\": {code, message, retryable}}."},
        "paths": paths,
        "components": {"schemas": model_schemas(),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                           "metricsToken": {"type": "http", "scheme": "bearer",
                                                            "description": "H3BATCH_METRICS_TOKEN (GET /metrics)"}}},
    }
    if current_app.config.get("API_KEYS"):
        doc["security"] = [{"bearer": []}]
    return doc


@bp.get("/openapi.json")
def openapi_json():
    """The OpenAPI 3.1 document of this API."""
    return jsonify(build_document())
