"""GET /openapi.json: an OpenAPI 3.1 document whose schemas are generated from api/schemas.py's pydantic models.

Paths are written out here (they are few and each lists every status code the view can return): /jobs and the
health routes, then the OpenAI-compatible /v1/videos; the blueprint of /sweeps may add its own by exposing
`OPENAPI_PATHS` (a dict of path -> path item).
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

bp = Blueprint("openapi", __name__)

_REF = "#/components/schemas/{model}"


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
            422: "Idempotency-Key reused with another body, webhook_url refused, exceeds_worker_capacity (the "
                 "request needs more rows than any worker serves), or json_too_complex (the body nests over 32 "
                 "deep or holds more tokens than the API parses)", 503: "Redis or queue full",
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
              (schemas.ErrorBody, "serialization")]
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
    from h3batch.api import sweeps  # noqa: PLC0415

    paths = _paths()
    paths.update(_batch_paths())
    paths.update(getattr(sweeps, "OPENAPI_PATHS", {}))  # optional: the sweeps room documents its own routes
    paths.update(_openai_paths())
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
