"""OpenAI-compatible `/v1/videos` routes over the same job records as `/jobs`: each view reads the wire format
(api/openai_protocol.py), calls the job service (api/job_service.py) and answers with a `video` object.
The OpenAPI paths of these routes are in api/openapi.py."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from h3batch.api import idempotency, job_http, job_inputs, job_service, media
from h3batch.api.errors import ApiError
from h3batch.api.openai_protocol import (
    DEFAULT_MODEL_ID,
    POLL_AFTER_MS,
    VIDEOS,
    parse_create,
    validated,
    video_object,
)
from h3batch.api.request_guard import form_parts
from h3batch.api.redis_client import get_redis
from h3batch.core import capacity, defaults, routing

bp = Blueprint("openai_videos", __name__, url_prefix="/v1")


def model_id() -> str:
    """The model id served: app config OPENAI_MODEL (from H3BATCH_OPENAI_MODEL)."""
    return current_app.config.get("OPENAI_MODEL") or DEFAULT_MODEL_ID


# --- request body ---

def _raw_fields() -> dict[str, Any]:
    """The create body as a dict: JSON object, or multipart / urlencoded text parts. The one file part taken is
    `input_reference` (its bytes; a data: URL text part also works); others are refused."""
    if request.mimetype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        texts, files = form_parts()
        for name in files:
            if name != "input_reference":
                raise ApiError(400, "unsupported_parameter",
                               f"{name}: file uploads are not supported (input_reference is the one image taken)")
        fields: dict[str, Any] = dict(texts)
        if "input_reference" in files:
            fields["input_reference"] = request.files["input_reference"].stream.read(job_inputs.MAX_IMAGE_BYTES + 1)
        return fields

    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "expected a JSON object or multipart/form-data body, e.g. "
                                            "{\"prompt\": \"rain on a tin roof\", \"seconds\": \"4\"}")
    return body


def _render(record: dict[str, Any], position: int | None) -> dict[str, Any]:
    return video_object(record, position, model_id())


def _reply(record: dict[str, Any], status: int = 200):
    return job_http.job_reply(record, status, _render, POLL_AFTER_MS)


@bp.post("/videos")
def create_video():
    """Create a video job (JSON or multipart). 202 video object; 400 unsupported_parameter / model_not_found /
    unsupported_size / unsupported_duration; 422 invalid_webhook_url / exceeds_worker_capacity; 503 queue_full."""
    fields = _raw_fields()
    reference = fields.pop("input_reference", None)
    parsed = parse_create(fields, model_id())
    if reference not in (None, ""):
        parsed["task"] = _input_reference_task()
    req = validated(parsed, current_app.config["MAX_PROMPT_CHARS"], current_app.config.get("CANVAS"),
                    current_app.config.get("LORA_POLICY"))
    images = []
    caller = job_http.caller()
    fleet = job_service.UNREAD
    if reference not in (None, ""):
        fleet = capacity.fleet(caller.r)
        job_service.check_capacity(fleet, job_service.need_of(req, caller.default_precision, fleet))  # 422 first
        data = reference if isinstance(reference, bytes) else job_inputs.from_data_url("input_reference", reference)
        images = job_inputs.check_images(req.task, {"first_frame": [("input_reference", data)]}, req.width,
                                         req.height)
    record, replayed = job_service.create_job(
        caller, req, VIDEOS, idempotency.parse_key(request.headers.get("Idempotency-Key")),
        idempotency.fingerprint({"v1": req.model_dump(mode="json"), **job_inputs.fingerprint(images)}), images,
        fleet)
    response = _reply(record, 202)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        response.headers["Location"] = f"/v1/videos/{record['id']}"
    return response


def _input_reference_task() -> str:
    """`input_reference` is fl2va's first keyframe: the task when the fleet serves fl2va, else 400 naming the tasks
    it serves (a fleet of FastH3 V2 workers serves t2va only)."""
    fleet = capacity.fleet(get_redis())
    served = sorted({t for c in (fleet.capabilities if fleet else ()) for t in c.tasks}) or [routing.DEFAULT_TASK]
    if "fl2va" not in served:
        raise ApiError(400, "unsupported_parameter", f"input_reference: the image a video starts from needs task "
                                                     f"fl2va (a native MiniMax-H3 release); the fleet serves "
                                                     f"{', '.join(served)}")
    return "fl2va"


@bp.get("/videos/<video_id>")
def retrieve_video(video_id: str):
    """One video object; 404 video_not_found."""
    return _reply(job_http.owned_job(video_id, VIDEOS))


@bp.get("/videos")
def list_videos():
    """`after`, `limit` (1..100, default 20), `order` (asc|desc, default desc) → {object:"list", data, first_id,
    last_id, has_more}."""
    limit = job_service.page_limit(request.args.get("limit", str(defaults.LIST_DEFAULT_LIMIT)), digits_only=True)
    return jsonify(job_service.list_page(job_http.caller(), VIDEOS, _render, limit=limit,
                                         after=request.args.get("after") or None,
                                         order=request.args.get("order", "desc")))


@bp.delete("/videos/<video_id>")
def delete_video(video_id: str):
    """Abort if active, remove the record and files → {id, object:"video.deleted", deleted:true}; 404."""
    job_service.delete(job_http.caller(video_id), video_id, VIDEOS)
    return jsonify({"id": video_id, "object": "video.deleted", "deleted": True})


@bp.route("/videos/<video_id>/content", methods=["GET", "HEAD"])
def video_content(video_id: str):
    """`variant` video (MP4, default) | thumbnail (PNG, middle frame) | spritesheet (JPEG grid of up to 16 frames) |
    audio (AAC in .m4a). Range/ETag on all. 400 unsupported_variant; 404; 409 video_not_completed; 410
    artifact_expired."""
    variant = request.args.get("variant", "video")
    if variant not in media.VARIANTS:
        raise ApiError(400, "unsupported_variant", f"variant: expected one of {', '.join(media.VARIANTS)}, found "
                                                   f"{variant!r}")
    caller = job_http.caller(video_id)
    record, mp4 = job_service.content_object(caller, video_id, VIDEOS)
    try:
        stored, media_type = media.variant_object(caller.artifacts, mp4, variant)
    except FileNotFoundError:
        raise ApiError(410, "artifact_expired", VIDEOS.gone_message.format(id=video_id)) from None
    etag = (record.get("sha256") if variant == "video" else None) or True
    suffix = Path(media.VARIANTS[variant][0]).suffix  # .mp4, .png, .jpg, .m4a
    return job_http.send_job_content(caller.artifacts, stored, media_type, etag, f"{video_id}{suffix}")


@bp.route("/videos/<video_id>/remix", methods=["POST"])
@bp.route("/videos/edits", methods=["POST"])
@bp.route("/videos/extensions", methods=["POST"])
@bp.route("/videos/characters", methods=["POST"])
def not_offered(video_id: str | None = None):
    """Remix, edit, extend and characters are Sora features h3batch does not offer."""
    raise ApiError(404, "not_offered", f"{request.path}: h3batch offers text-to-video+audio only (no remix, edit, "
                                       f"extension or characters)")
