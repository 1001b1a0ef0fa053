"""OpenAI-compatible `/v1/videos`: the OpenAI Videos wire format over the same job records as `/jobs`.

A video id IS a job id, so `/v1/videos/{id}` and `/jobs/{id}` show one record two ways. Statuses collapse to
OpenAI's four (cancelled → `failed` with `error.code:"cancelled"`; expired → `completed` with a past `expires_at`),
`progress` is an integer 0..100 (100 only when completed), times are integer Unix seconds, and h3batch's own fields
(stage, seed, num_frames, stage_durations, metadata, ...) sit beside OpenAI's, never renamed.

Create accepts JSON and multipart/form-data (the `openai` SDK always sends multipart, every value a text part, so
values are coerced here). Fields: OpenAI's `prompt`, `model`, `seconds`, `size`, `user`; vLLM-Omni's extras that map
to T2VA (`width`, `height`, `num_frames`, `fps`, `seed`, `num_inference_steps`, `guidance_scale`, `flow_shift`,
... checked with the V2 sampler rules); h3batch's `webhook_url` and `release`. Conditioning and editing inputs
(`input_reference`, `negative_prompt`, ...) and any other field get 400 `unsupported_parameter`.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal, Mapping

from flask import Blueprint, current_app, g, jsonify, request, send_file
from pydantic import BaseModel, Field, ValidationError

from h3batch.api import idempotency, media
from h3batch.api.errors import ApiError
from h3batch.api.redis_client import get_redis
from h3batch.api.schemas import CreateJob
from h3batch.core import defaults, request_rules
from h3batch.core.geometry import FPS, GeometryError, RequestGeometry
from h3batch.core.jobs import FINISHED, JobStatus, delete_job, list_jobs, load_job, queue_position

log = logging.getLogger("h3batch.api")
bp = Blueprint("openai_videos", __name__, url_prefix="/v1")

DEFAULT_MODEL_ID = "FastVideo/FastVideo-FastH3-8-Step-V2"
"""The model id /v1 serves (`model` omitted or equal to it); H3BATCH_OPENAI_MODEL or config OPENAI_MODEL override."""
POLL_AFTER_MS = "1000"
"""`openai-poll-after-ms` on queued / in-progress replies: how long the SDK's `poll` sleeps between retrieves."""
MAX_EXTRA_PARAMS_BYTES = 16 * 1024

_NO_RETRY = {"x-should-retry": "false"}
_REFERENCE_FIELDS = ("input_reference", "image_reference", "video_reference", "audio_reference", "control_reference",
                     "control_type", "source_video", "source_audio", "video_noise_mask", "audio_noise_mask",
                     "character_ids", "remix_video_id")
"""Conditioning / editing inputs: h3batch is text-to-video+audio only."""
_NO_CFG_FIELDS = ("guidance_scale_2", "true_cfg_scale")
_UNSUPPORTED = {
    "negative_prompt": "FastH3 V2 runs without CFG, so a negative prompt would have no effect",
    "boundary_ratio": "FastH3 V2 has a single expert; boundary_ratio applies to two-expert models",
    "sound_duration": "the audio always spans the video; set `seconds` instead",
    "lora": "FastH3 V2 does not support per-request LoRA",
    "video_params": "send width, height, num_frames and fps as top-level fields",
}
_SAMPLER_INTS = ("num_inference_steps",)
_INT_FIELDS = ("seed", "width", "height", "num_frames", "fps")
_ACCEPTED = ("prompt", "model", "seconds", "size", "user", "width", "height", "num_frames", "fps", "seed",
             "num_inference_steps", "guidance_scale", "flow_shift", "audio_flow_shift", "generate_sound",
             "extra_params", "webhook_url", "release", *_NO_CFG_FIELDS)


def model_id() -> str:
    import os  # noqa: PLC0415

    return current_app.config.get("OPENAI_MODEL") or os.environ.get("H3BATCH_OPENAI_MODEL") or DEFAULT_MODEL_ID


def _bad(field: str, message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, f"{field}: {message}")


# --- request parsing ---

def _raw_fields() -> dict[str, Any]:
    """The create body as a dict: JSON object, or multipart / urlencoded text parts. File parts are refused."""
    if request.mimetype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        for name in request.files:
            raise _bad(name, "file uploads are not supported: h3batch is text-to-video+audio only",
                       "unsupported_parameter")
        fields: dict[str, Any] = {}
        for name in request.form:
            values = request.form.getlist(name)
            fields[name] = values[0] if len(values) == 1 else values
        return fields
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "expected a JSON object or multipart/form-data body, e.g. "
                                            "{\"prompt\": \"rain on a tin roof\", \"seconds\": \"4\"}")
    return body


def _as_int(field: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _bad(field, f"expected an integer, found {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("+").isdigit():
        return int(value.strip())
    raise _bad(field, f"expected an integer, found {value!r}")


def _as_seconds(value: Any) -> float:
    """OpenAI sends seconds as a decimal string ("4"); numbers are accepted too."""
    if isinstance(value, bool):
        raise ApiError(400, "unsupported_duration", f"seconds: expected a decimal string like \"4\", found {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ApiError(400, "unsupported_duration", f"seconds: expected a decimal string like \"4\", "
                                                    f"found {value!r}") from None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ApiError(400, "unsupported_duration", f"seconds: expected a finite number, found {value!r}")
    return seconds


def _as_size(value: Any) -> tuple[int, int]:
    if not isinstance(value, str) or value.lower().count("x") != 1:
        raise ApiError(400, "unsupported_size", f"size: expected \"<width>x<height>\" like \"256x128\", "
                                                f"found {value!r}")
    width, height = value.lower().split("x")
    if not (width.strip().isdigit() and height.strip().isdigit()):
        raise ApiError(400, "unsupported_size", f"size: expected \"<width>x<height>\" like \"256x128\", "
                                                f"found {value!r}")
    return int(width), int(height)


def parse_create(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a /v1/videos create body; returns CreateJob's fields. Raises ApiError (400) naming the field."""
    for name in fields:
        if name in _REFERENCE_FIELDS:
            raise _bad(name, "conditioning and editing inputs are not supported: h3batch is text-to-video+audio only",
                       "unsupported_parameter")
        if name in _UNSUPPORTED and fields[name] not in (None, ""):
            raise _bad(name, _UNSUPPORTED[name], "unsupported_parameter")
        if name not in _ACCEPTED and name not in _UNSUPPORTED:
            raise _bad(name, f"unknown field (accepted: {', '.join(_ACCEPTED)})", "unsupported_parameter")
    model = fields.get("model")
    if model not in (None, "") and model != model_id():
        raise ApiError(400, "model_not_found", f"model: this server serves {model_id()!r}, found {model!r}")
    if "prompt" not in fields:
        raise _bad("prompt", "required (the text to render)")

    width, height = defaults.DEFAULT_WIDTH, defaults.DEFAULT_HEIGHT
    if fields.get("size") not in (None, ""):
        width, height = _as_size(fields["size"])
    ints = {name: _as_int(name, fields[name]) for name in _INT_FIELDS if fields.get(name) not in (None, "")}
    for name, from_size in (("width", width), ("height", height)):
        if name in ints and fields.get("size") not in (None, "") and ints[name] != from_size:
            raise ApiError(400, "unsupported_size", f"{name}: {ints[name]} contradicts size {fields['size']!r}")
    width, height = ints.get("width", width), ints.get("height", height)
    if ints.get("fps", FPS) != FPS:
        raise _bad("fps", f"FastH3 V2 renders at {FPS} fps only, found {ints['fps']}", "unsupported_parameter")

    seconds = _as_seconds(fields["seconds"]) if fields.get("seconds") not in (None, "") else None
    if "num_frames" in ints:
        if seconds is None:
            seconds = ints["num_frames"] / FPS
        else:
            try:
                resolved = RequestGeometry(width, height, seconds).num_frames
            except GeometryError:
                resolved = None  # the duration error below names the real problem
            if resolved is not None and ints["num_frames"] not in (resolved, round(seconds * FPS)):
                raise ApiError(400, "unsupported_duration", f"num_frames: {ints['num_frames']} contradicts seconds "
                                                            f"{fields['seconds']!r} ({resolved} frames)")
    if seconds is None:
        seconds = defaults.DEFAULT_SECONDS

    sampler: dict[str, Any] = {}
    for name in ("num_inference_steps", "guidance_scale", "flow_shift", "audio_flow_shift"):
        value = fields.get(name)
        if value in (None, ""):
            continue
        sampler[name] = _as_int(name, value) if name in _SAMPLER_INTS else value
    try:
        request_rules.check_sampler_fields(sampler)
    except request_rules.RequestRuleError as exc:
        raise _bad(exc.field, str(exc), "unsupported_parameter") from None
    for name in _NO_CFG_FIELDS:
        value = fields.get(name)
        if value not in (None, "") and not request_rules._is_close_number(value, 1.0):
            raise _bad(name, f"FastH3 V2 runs without CFG: {name}=1 only, got {value!r}", "unsupported_parameter")
    sound = fields.get("generate_sound")
    if sound not in (None, "") and str(sound).strip().lower() not in ("true", "1", "yes"):
        raise _bad("generate_sound", "every h3batch clip has stereo sound (T2VA); false is not supported",
                   "unsupported_parameter")
    _check_extra_params(fields.get("extra_params"))
    return {"prompt": fields["prompt"], "seconds": seconds, "width": width, "height": height,
            "seed": ints.get("seed"), "release": fields.get("release") or None,
            "webhook_url": fields.get("webhook_url") or None}


def _check_extra_params(raw: Any) -> None:
    """vLLM-Omni's `extra_params` (a JSON object, ≤ 16 KiB): only `task: "t2va"` means anything here."""
    if raw in (None, ""):
        return
    text = raw if isinstance(raw, str) else json.dumps(raw)
    if len(text.encode()) > MAX_EXTRA_PARAMS_BYTES:
        raise _bad("extra_params", f"expected at most {MAX_EXTRA_PARAMS_BYTES} bytes of JSON, found "
                                   f"{len(text.encode())}")
    try:
        params = json.loads(text) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        raise _bad("extra_params", "expected a JSON object string") from None
    if not isinstance(params, dict):
        raise _bad("extra_params", f"expected a JSON object, found {type(params).__name__}")
    for name, value in params.items():
        if name == "task" and value in ("t2va", "t2v"):
            continue
        raise _bad(f"extra_params.{name}", "not supported (only task=\"t2va\")", "unsupported_parameter")


def _validated(fields: dict[str, Any]) -> CreateJob:
    try:
        return CreateJob.model_validate(fields, context={"max_prompt_chars": current_app.config["MAX_PROMPT_CHARS"]})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        kind, where = first["type"], ".".join(str(p) for p in first["loc"]) or "body"
        code = kind if kind in ("unsupported_size", "unsupported_duration") else "invalid_request"
        message = first["msg"] if kind in ("unsupported_size", "unsupported_duration", "empty_prompt",
                                           "prompt_too_long") else f"{where}: {first['msg']}"
        raise ApiError(400, code, message) from None


# --- the video object ---

class VideoObject(BaseModel):
    """OpenAI's `video` object plus h3batch's fields (the response model; /openapi.json shows its schema)."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["queued", "in_progress", "completed", "failed"]
    progress: int = Field(ge=0, le=100, description="0..100; 100 only when completed.")
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    prompt: str | None = None
    seconds: str = Field(description="Clip length as a decimal string, e.g. \"4\".")
    size: str = Field(description="\"<width>x<height>\".")
    remixed_from_video_id: None = None
    error: dict[str, Any] | None = Field(None, description="{code, message}; code `cancelled` for a cancelled job.")
    stage: str | None = None
    queue_position: int | None = None
    attempt: int = 0
    started_at: float | None = None
    seed: int | None = None
    num_frames: int | None = None
    fps: int = FPS
    inference_time_s: float | None = None
    stage_durations: dict[str, float] | None = None
    worker: str | None = None
    cancel_reason: str | None = None
    release_id: str | None = None
    metadata: dict[str, Any] | None = None
    webhook_url: str | None = None
    webhook_deliveries: list[dict[str, Any]] | None = None
    h3batch_status: str = Field(description="The native status (adds cancelled, expired).")


def _int_time(value: float | None) -> int | None:
    return None if value is None else int(value)


def video_object(record: dict[str, Any], position: int | None = None) -> dict[str, Any]:
    """A job record as an OpenAI `video` object, plus h3batch's fields."""
    status = record["status"]
    error = record.get("error")
    openai_status = {"cancelled": "failed", "expired": "completed"}.get(status, status)
    if status == JobStatus.CANCELLED.value:
        reason = record.get("cancel_reason") or "user"
        error = {"code": "cancelled", "message": f"cancelled ({reason}) at stage "
                                                 f"{record.get('cancelled_at_stage') or record.get('stage')}"}
    elif error:
        error = {"code": error.get("code"), "message": error.get("message")}
    progress = 100 if openai_status == "completed" else min(99, int((record.get("progress") or 0.0) * 100))
    finished = status in {s.value for s in FINISHED}
    timings = record.get("timings")
    meta = record.get("metadata") or {}
    try:
        num_frames = RequestGeometry(record["width"], record["height"], record["seconds"]).num_frames
    except GeometryError:
        num_frames = record.get("frames")
    return VideoObject(**{
        "id": record["id"], "object": "video", "model": model_id(), "status": openai_status, "progress": progress,
        "created_at": _int_time(record["created_at"]),
        "completed_at": _int_time(record.get("finished_at")) if finished else None,
        "expires_at": _int_time(record.get("expires_at")), "prompt": record.get("prompt"),
        "seconds": f"{record['seconds']:g}", "size": f"{record['width']}x{record['height']}",
        "remixed_from_video_id": None, "error": error,
        # h3batch extensions (as vLLM-Omni does: added beside OpenAI's fields, never renamed)
        "stage": record.get("stage"), "queue_position": position if status == "queued" else None,
        "attempt": record.get("attempt") or 0, "started_at": record.get("started_at"), "seed": record.get("seed"),
        "num_frames": record.get("frames") or num_frames, "fps": FPS,
        "inference_time_s": None if not timings else round(sum(timings.values()), 6),
        "stage_durations": timings, "worker": record.get("worker"), "cancel_reason": record.get("cancel_reason"),
        "release_id": record.get("release_id") or meta.get("release_id"), "metadata": record.get("metadata"),
        "webhook_url": record.get("webhook_url"), "webhook_deliveries": record.get("webhook_deliveries"),
        "h3batch_status": status,
    }).model_dump(mode="json")


def _respond(record: dict[str, Any], status: int = 200):
    response = jsonify(video_object(record, queue_position(get_redis(), record["id"])))
    response.status_code = status
    if record["status"] in (JobStatus.QUEUED.value, JobStatus.IN_PROGRESS.value):
        response.headers["openai-poll-after-ms"] = POLL_AFTER_MS
    return response


def _get_owned(video_id: str) -> dict[str, Any]:
    from h3batch.api.jobs import _expire_if_due  # noqa: PLC0415  (lazy expiry lives with the native view)

    g.job_id = video_id
    record = load_job(get_redis(), video_id)
    if record is None or (record.get("owner") or "") != g.owner:
        raise ApiError(404, "video_not_found", f"no video with id {video_id!r}")
    return _expire_if_due(record)


# --- routes ---

@bp.post("/videos")
def create_video():
    """Create a video job (JSON or multipart). 202 video object; 400 unsupported_parameter / model_not_found /
    unsupported_size / unsupported_duration; 422 invalid_webhook_url; 503 queue_full."""
    from h3batch.api.jobs import _create_and_enqueue  # noqa: PLC0415  (the one create path: record, then message)

    req = _validated(parse_create(_raw_fields()))
    r = get_redis()
    idem_key = idempotency.parse_key(request.headers.get("Idempotency-Key"))
    held = None
    if idem_key is not None:
        held = idempotency.claim(r, g.owner, idem_key,
                                 idempotency.fingerprint({"v1": req.model_dump(mode="json")}))
        if held.job_id is not None:
            record = load_job(r, held.job_id)
            if record is None:
                raise ApiError(404, "video_not_found", f"the video {held.job_id} this Idempotency-Key created is gone")
            response = _respond(record, 202)
            response.headers["Idempotent-Replayed"] = "true"
            return response
    try:
        record = _create_and_enqueue(r, req, api="openai")
    except BaseException:
        if held is not None:
            idempotency.release(r, held)
        raise
    if held is not None:
        idempotency.record_job(r, held, record["id"])
    response = _respond(record, 202)
    response.headers["Location"] = f"/v1/videos/{record['id']}"
    return response


@bp.get("/videos/<video_id>")
def retrieve_video(video_id: str):
    """One video object; 404 video_not_found."""
    return _respond(_get_owned(video_id))


@bp.get("/videos")
def list_videos():
    """`after`, `limit` (1..100, default 20), `order` (asc|desc, default desc) → {object:"list", data, first_id,
    last_id, has_more}."""
    raw_limit = request.args.get("limit", str(defaults.LIST_DEFAULT_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= defaults.LIST_MAX_LIMIT:
        raise _bad("limit", f"expected an integer 1..{defaults.LIST_MAX_LIMIT}, found {raw_limit!r}")
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise _bad("order", f"expected 'asc' or 'desc', found {order!r}")
    r = get_redis()
    after = request.args.get("after") or None
    if after is not None:
        cursor = load_job(r, after)
        if cursor is None or (cursor.get("owner") or "") != g.owner:
            raise ApiError(400, "invalid_cursor", f"after: expected the id of one of your videos, found {after!r}")
    from h3batch.core.jobs import BadCursor  # noqa: PLC0415

    try:
        records, has_more = list_jobs(r, limit=int(raw_limit), after=after, order=order, owner=g.owner)
    except BadCursor as exc:
        raise ApiError(400, "invalid_cursor", str(exc)) from None
    data = [video_object(rec, queue_position(r, rec["id"])) for rec in records]
    return jsonify({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None, "has_more": has_more})


@bp.delete("/videos/<video_id>")
def delete_video(video_id: str):
    """Abort if active, remove the record and files → {id, object:"video.deleted", deleted:true}; 404."""
    import shutil  # noqa: PLC0415

    _get_owned(video_id)
    delete_job(get_redis(), video_id)  # a running worker sees the record gone at its next step and stops
    shutil.rmtree(Path(current_app.config["ARTIFACTS_DIR"]) / video_id, ignore_errors=True)
    log.info("video deleted", extra={"job_id": video_id})
    return jsonify({"id": video_id, "object": "video.deleted", "deleted": True})


@bp.route("/videos/<video_id>/content", methods=["GET", "HEAD"])
def video_content(video_id: str):
    """`variant` video (MP4, default) | thumbnail (PNG, middle frame) | audio (AAC in .m4a). Range/ETag on all.
    400 unsupported_variant; 404; 409 video_not_completed; 410 artifact_expired."""
    variant = request.args.get("variant", "video")
    if variant not in media.VARIANTS:
        raise ApiError(400, "unsupported_variant", f"variant: expected one of {', '.join(media.VARIANTS)}, found "
                                                   f"{variant!r} (spritesheet is not offered)")
    record = _get_owned(video_id)
    if record["status"] == JobStatus.EXPIRED.value:
        raise ApiError(410, "artifact_expired", f"video {video_id} expired at {record.get('expires_at')}")
    if record["status"] != JobStatus.COMPLETED.value:
        raise ApiError(409, "video_not_completed", f"video {video_id} is {record['status']}; its content exists only "
                                                   f"once it is completed", False, _NO_RETRY)
    root = Path(current_app.config["ARTIFACTS_DIR"]).resolve()
    mp4 = (root / (record.get("artifact") or "")).resolve()
    if root not in mp4.parents or not mp4.is_file():
        raise ApiError(410, "artifact_expired", f"video {video_id}'s files are no longer stored")
    try:
        path, media_type = media.variant_file(mp4.parent, variant)
    except FileNotFoundError:
        raise ApiError(410, "artifact_expired", f"video {video_id}'s files are no longer stored") from None
    etag = record.get("sha256") if variant == "video" else True
    suffix = {"video": "mp4", "thumbnail": "png", "audio": "m4a"}[variant]
    response = send_file(path, mimetype=media_type, conditional=True, etag=etag or True,
                         download_name=f"{video_id}.{suffix}")
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["Cache-Control"] = "private, max-age=3600"
    return response


@bp.route("/videos/<video_id>/remix", methods=["POST"])
@bp.route("/videos/edits", methods=["POST"])
@bp.route("/videos/extensions", methods=["POST"])
@bp.route("/videos/characters", methods=["POST"])
def not_offered(video_id: str | None = None):
    """Remix, edit, extend and characters are Sora features h3batch does not offer."""
    raise ApiError(404, "not_offered", f"{request.path}: h3batch offers text-to-video+audio only (no remix, edit, "
                                       f"extension or characters)")



# --- OpenAPI (merged into /openapi.json by api/openapi.py) ---

def _openapi_paths() -> dict[str, Any]:
    def error(description: str) -> dict[str, Any]:
        return {"description": description,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}

    video = {"description": "A video object", "content": {"application/json": {"schema":
                                                                               VideoObject.model_json_schema()}}}
    video_id = {"name": "video_id", "in": "path", "required": True, "schema": {"type": "string"}}
    create_fields = {"type": "object", "required": ["prompt"], "properties": {
        "prompt": {"type": "string"}, "model": {"type": "string", "enum": [DEFAULT_MODEL_ID]},
        "seconds": {"type": "string", "description": "4..15, decimal string"},
        "size": {"type": ["string", "null"], "pattern": "^[0-9]+x[0-9]+$"}, "seed": {"type": "integer", "minimum": 0},
        "num_inference_steps": {"type": "integer", "enum": [8]}, "guidance_scale": {"type": ["number", "null"]},
        "flow_shift": {"type": ["number", "null"]}, "width": {"type": ["integer", "null"]}, "height": {"type": ["integer", "null"]},
        "num_frames": {"type": ["integer", "null"]}, "fps": {"type": "integer", "enum": [FPS]}, "user": {"type": ["string", "null"]},
        "webhook_url": {"type": "string", "format": "uri"}, "release": {"type": "string"}}}
    common = {"401": error("Missing or bad API key"), "429": error("Over the key's rate limit"),
              "503": error("Redis or queue full")}
    return {
        "/v1/videos": {
            "post": {"operationId": "createVideo", "summary": "OpenAI-compatible create (JSON or multipart)",
                     "requestBody": {"required": True, "content": {"application/json": {"schema": create_fields},
                                                                   "multipart/form-data": {"schema": create_fields}}},
                     "responses": {"202": video, "400": error("Unsupported field, model, size or duration"),
                                   "409": error("Idempotency-Key in use"),
                                   "422": error("webhook_url refused or Idempotency-Key reused"), **common}},
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
                    "responses": {"200": {"description": "MP4, PNG thumbnail or AAC .m4a", "content": {
                                      "video/mp4": {"schema": {"type": "string", "format": "binary"}},
                                      "image/png": {"schema": {"type": "string", "format": "binary"}},
                                      "audio/mp4": {"schema": {"type": "string", "format": "binary"}}}},
                                  "206": {"description": "Byte range"}, "304": {"description": "Not modified"},
                                  "400": error("Unknown variant"), "404": error("No such video"),
                                  "409": error("Not completed"), "410": error("Expired"),
                                  "416": error("Range not satisfiable"), **common}},
        },
    }


OPENAPI_PATHS = _openapi_paths()
