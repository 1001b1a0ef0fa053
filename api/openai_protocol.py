"""The OpenAI Videos wire format of `/v1/videos` (routes in api/openai_videos.py): create-body parsing, the `video`
object, and the codes and wording of its errors. Needs no Flask app or request.

A video id IS a job id, so `/v1/videos/{id}` and `/jobs/{id}` show one record two ways. Statuses collapse to
OpenAI's four (cancelled → `failed` with `error.code:"cancelled"`; expired → `completed` with a past `expires_at`),
`progress` is an integer 0..100 (100 only when completed), times are integer Unix seconds, and h3batch's own fields
(stage, seed, num_frames, stage_durations, metadata, ...) sit beside OpenAI's, never renamed.

Create accepts JSON and multipart/form-data (the `openai` SDK always sends multipart, every value a text part, so
values are coerced here). Fields: OpenAI's `prompt`, `model`, `seconds`, `size`, `user`; vLLM-Omni's extras that map
to T2VA (`width`, `height`, `num_frames`, `fps`, `seed`, `num_inference_steps`, `guidance_scale`, `flow_shift`,
... checked with the V2 sampler rules); h3batch's `webhook_url`, `release` and `priority`. Conditioning and editing
inputs (`negative_prompt`, ...) and any other field get 400 `unsupported_parameter`. `input_reference` is fl2va's first
keyframe (api/openai_videos.py), served when the fleet serves fl2va (a native MiniMax-H3 release).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from h3batch.api.errors import ApiError
from h3batch.api.job_service import Vocabulary
from h3batch.api.schemas import LORA_CODES, CreateJob, first_error
from h3batch.core import lanes, loras, request_rules
from h3batch.core.geometry import ASPECT_RATIOS, FPS, GeometryError, RequestGeometry, nearest_canvas, shown
from h3batch.core.jobs import FINISHED, JobStatus

DEFAULT_MODEL_ID = "FastVideo/FastVideo-FastH3-8-Step-V2"
"""The model id /v1 serves by default (`model` omitted or equal to it); api/openai_videos.py `model_id` says which."""
POLL_AFTER_MS = "1000"
"""`openai-poll-after-ms` on queued / in-progress replies: how long the SDK's `poll` sleeps between retrieves."""
MAX_EXTRA_PARAMS_BYTES = 16 * 1024

_REFERENCE_FIELDS = ("input_reference", "image_reference", "video_reference", "audio_reference", "control_reference",
                     "control_type", "source_video", "source_audio", "video_noise_mask", "audio_noise_mask",
                     "character_ids", "remix_video_id")
"""Conditioning / editing inputs: h3batch is text-to-video+audio only."""
_NO_CFG_FIELDS = ("guidance_scale_2", "true_cfg_scale")
_UNSUPPORTED = {
    "negative_prompt": "FastH3 V2 runs without CFG, so a negative prompt would have no effect",
    "boundary_ratio": "FastH3 V2 has a single expert; boundary_ratio applies to two-expert models",
    "sound_duration": "the audio always spans the video; set `seconds` instead",
    "lora": "name per-job adapters as `loras: [{\"ref\": ..., \"scale\": ...}]` (docs/adapters.md)",
    "video_params": "send width, height, num_frames and fps as top-level fields",
}
_SAMPLER_INTS = ("num_inference_steps",)
_FLOAT_FIELDS = ("guidance_scale", "flow_shift", "audio_flow_shift")
_INT_FIELDS = ("seed", "width", "height", "num_frames", "fps")
_ACCEPTED = ("prompt", "model", "seconds", "size", "user", "width", "height", "num_frames", "fps", "seed",
             "num_inference_steps", "guidance_scale", "flow_shift", "audio_flow_shift", "generate_sound",
             "extra_params", "webhook_url", "release", "aspect_ratio", "precision", "input_reference", "loras",
             "priority", *_NO_CFG_FIELDS)


# --- the create body as JSON Schema (GET /openapi.json) ---
# Every value parse_create accepts must validate here (Schemathesis sends schema-violating bodies and expects them
# refused), so each field states all the forms the parser takes: multipart text for every number, numbers for
# `seconds`, and "" or null for "not given". Narrower rules (4..15 s, multiples of 32, the fixed sampler values) are
# checked by the parser and the contract, not written here.

_NOT_GIVEN = ({"type": "null"}, {"type": "string", "maxLength": 0})
_INT_TEXT = {"type": "string", "pattern": r"^\s*\+?[0-9]+\s*$"}
"""`_as_int`'s text form (a multipart part, or JSON text)."""
_NUMBER_OR_TEXT = ({"type": "number"}, {"type": "string"})
"""float() of it is what the sampler and duration rules read."""


def _optional(*forms: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"anyOf": [*forms, *_NOT_GIVEN]}
    if description:
        schema["description"] = description
    return schema


def create_body_schema(model_id: str = DEFAULT_MODEL_ID) -> dict[str, Any]:
    """The /v1/videos create body (JSON, and multipart where every value is a text part): one property per
    accepted field."""
    integer = ({"type": "integer"}, _INT_TEXT)
    properties = {
        "prompt": {"type": "string", "description": "What the clip shows and sounds like; not empty."},
        "model": _optional({"type": "string", "enum": [model_id]}),
        "seconds": _optional(*_NUMBER_OR_TEXT, description="4..15; OpenAI sends a decimal string (\"4\")"),
        "size": _optional({"type": "string", "pattern": r"^\s*[0-9]+\s*[xX]\s*[0-9]+\s*$"},
                          description="WIDTHxHEIGHT; sizes that are not multiples of 32 map to the nearest canvas"),
        "seed": _optional({"type": "integer", "minimum": 0}, _INT_TEXT),
        "width": _optional(*integer), "height": _optional(*integer), "num_frames": _optional(*integer),
        "fps": _optional({"type": "integer", "enum": [FPS]}, _INT_TEXT),
        "num_inference_steps": _optional({"type": "integer", "enum": [request_rules.REQUIRED_STEPS]}, _INT_TEXT),
        **{name: _optional(*_NUMBER_OR_TEXT, description="the release's fixed value only")
           for name in (*_FLOAT_FIELDS, *_NO_CFG_FIELDS)},
        "generate_sound": _optional({"type": "boolean"}, {"type": "integer"}, {"type": "string"},
                                    description="true (every clip has stereo sound)"),
        "extra_params": _optional({"type": "object"}, {"type": "string"},
                                  description="vLLM-Omni's extras: task t2va and the release's fixed sampler values"),
        "user": _optional({"type": "string"}),
        "webhook_url": _optional({"type": "string"}, description="http(s) URL for the signed completion POST"),
        "release": _optional({"type": "string"}, description="release id the job needs"),
        "precision": _optional({"type": "string", "enum": ["bf16", "fp8"]},
                               description="h3batch extension: bf16 (the release's semantics; the default) or fp8 "
                                           "(opt-in); only workers of that precision render it"),
        "priority": _optional({"type": "string", "enum": ["interactive", "batch"]},
                              description="h3batch extension: queue lane, `interactive` (the default) or `batch` "
                                          "(waits for an idle worker; see docs/api.md \"Priority\")"),
        "aspect_ratio": _optional({"type": "string", "enum": list(ASPECT_RATIOS)},
                                  description="instead of size: the release's trained bucket"),
        "input_reference": _optional({"type": "string", "contentMediaType": "image/*"},
                                     description="the image the video starts from (a file part, or a data: URL): "
                                                 "fl2va's first keyframe, placed on the canvas (docs/api.md "
                                                 "\"Images\"); 400 naming the tasks served when the fleet serves "
                                                 "no fl2va"),
        "loras": _optional({"type": "array", "items": {"type": "object"}}, {"type": "string"},
                           description="h3batch extension (the SDK's extra_body): per-job LoRAs [{ref, scale}] on the "
                                       "native release, or that list as JSON text in a multipart part; see "
                                       "docs/adapters.md"),
    }
    return {"type": "object", "required": ["prompt"], "properties": properties}


def _bad(field: str, message: str, code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, f"{field}: {message}")


# --- request parsing ---

MAX_INT_DIGITS = 30
"""Longest integer accepted in any numeric field; every real value has at most 19 digits (a 63-bit seed), and a
longer one would only overflow the float arithmetic of the geometry rules further on."""
_ASCII_INT = re.compile(r"^\s*\+?([0-9]+)\s*$")


def _as_int(field: str, value: Any) -> int:
    """An integer from JSON (int, integral float) or a form's text: ASCII digits with an optional "+", at most
    MAX_INT_DIGITS of them (so "++5", "²", "٣" and 5000-digit strings are 400, never int()'s ValueError)."""
    if isinstance(value, bool):
        raise _bad(field, f"expected an integer, found {str(value).lower()}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if abs(value) >= 10 ** MAX_INT_DIGITS:
            raise _bad(field, f"expected an integer of at most {MAX_INT_DIGITS} digits, found {shown(value)}")
        return value
    match = _ASCII_INT.match(value) if isinstance(value, str) else None
    if match is None:
        raise _bad(field, f"expected an integer, found {shown(value)}")
    if len(match.group(1)) > MAX_INT_DIGITS:
        raise _bad(field, f"expected an integer of at most {MAX_INT_DIGITS} digits, found {shown(value)}")
    return int(match.group(1))


def _as_seconds(value: Any) -> float:
    """OpenAI sends seconds as a decimal string ("4"); numbers are accepted too."""
    if isinstance(value, bool):
        raise ApiError(400, "unsupported_duration", f"seconds: expected a decimal string like \"4\", found {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ApiError(400, "unsupported_duration", f"seconds: expected a decimal string like \"4\", "
                                                    f"found {shown(value)}") from None
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ApiError(400, "unsupported_duration", f"seconds: expected a finite number, found {shown(value)}")
    return seconds


_SIZE = re.compile(r"^\s*([0-9]{1,%d})\s*x\s*([0-9]{1,%d})\s*$" % (MAX_INT_DIGITS, MAX_INT_DIGITS), re.IGNORECASE)


def _as_size(value: Any) -> tuple[int, int]:
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ApiError(400, "unsupported_size", f"size: expected \"<width>x<height>\" like \"256x128\", "
                                                f"found {shown(value)}")
    return int(match.group(1)), int(match.group(2))


def parse_create(fields: Mapping[str, Any], served_model: str) -> dict[str, Any]:
    """Validate a /v1/videos create body for a server serving `served_model`; returns CreateJob's fields. Raises
    ApiError (400) naming the field."""
    for name in fields:
        if name == "input_reference":  # fl2va's first keyframe: api/openai_videos.py maps it (fleet permitting)
            if fields[name] is not None and not isinstance(fields[name], (str, bytes)):
                raise _bad(name, "expected an image file part or a data: URL", "invalid_image")
            continue
        if name in _REFERENCE_FIELDS:
            raise _bad(name, "conditioning and editing inputs are not supported: h3batch is text-to-video+audio only",
                       "unsupported_parameter")
        if name in _UNSUPPORTED and fields[name] not in (None, ""):
            raise _bad(name, _UNSUPPORTED[name], "unsupported_parameter")
        if name not in _ACCEPTED and name not in _UNSUPPORTED:
            raise _bad(name, f"unknown field (accepted: {', '.join(_ACCEPTED)})", "unsupported_parameter")
    model = fields.get("model")
    if model not in (None, "") and model != served_model:
        raise ApiError(400, "model_not_found", f"model: this server serves {served_model!r}, found {model!r}")
    if "prompt" not in fields:
        raise _bad("prompt", "required (the text to render)")

    width, height = None, None  # absent: CreateJob gives the served release's default canvas
    if fields.get("size") not in (None, ""):
        width, height = _as_size(fields["size"])
    ints = {name: _as_int(name, fields[name]) for name in _INT_FIELDS if fields.get(name) not in (None, "")}
    for name, from_size in (("width", width), ("height", height)):
        if name in ints and fields.get("size") not in (None, "") and ints[name] != from_size:
            raise ApiError(400, "unsupported_size", f"{name}: {ints[name]} contradicts size {fields['size']!r}")
    width, height = ints.get("width", width), ints.get("height", height)
    if "width" not in ints and "height" not in ints and width is not None and (width % 32 or height % 32):
        try:  # an OpenAI size such as 1280x720: the nearest canvas of that aspect (the video reports what rendered)
            width, height = nearest_canvas(width, height)
        except GeometryError as exc:
            raise ApiError(400, "unsupported_size", f"size: {exc}") from None
    if ints.get("fps", FPS) != FPS:
        raise _bad("fps", f"FastH3 V2 renders at {FPS} fps only, found {ints['fps']}", "unsupported_parameter")

    seconds = _as_seconds(fields["seconds"]) if fields.get("seconds") not in (None, "") else None
    if "num_frames" in ints:
        if seconds is None:
            seconds = ints["num_frames"] / FPS
        else:
            try:
                resolved = RequestGeometry(256, 128, seconds).num_frames  # the frame count ignores the canvas
            except (GeometryError, OverflowError):
                resolved = None  # the duration error of CreateJob names the real problem
            if resolved is not None and ints["num_frames"] not in (resolved, round(seconds * FPS)):
                raise ApiError(400, "unsupported_duration", f"num_frames: {ints['num_frames']} contradicts seconds "
                                                            f"{fields['seconds']!r} ({resolved} frames)")
    # None: not given; CreateJob's default applies, raised to the fleet's shortest clip (job_service.need_of)

    for name in (*_FLOAT_FIELDS, *_NO_CFG_FIELDS):
        value = fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** MAX_INT_DIGITS:
            # float() of it overflows inside the sampler rules; no real setting is that large
            raise _bad(name, f"expected a number of at most {MAX_INT_DIGITS} digits, found {shown(value)}")
    sampler: dict[str, Any] = {}
    for name in ("num_inference_steps", *_FLOAT_FIELDS):
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
    size = {name: value for name, value in (("width", width), ("height", height)) if value is not None}
    if fields.get("aspect_ratio") not in (None, ""):
        size["aspect_ratio"] = fields["aspect_ratio"]
    _as_text("user", fields.get("user"))  # OpenAI's end-user id: checked, then not used
    return {"prompt": fields["prompt"], **({"seconds": seconds} if seconds is not None else {}), **size,
            "seed": ints.get("seed"),
            "release": _as_text("release", fields.get("release")),
            **({"precision": fields["precision"]} if fields.get("precision") not in (None, "") else {}),
            **({"priority": fields["priority"]} if fields.get("priority") not in (None, "") else {}),
            "webhook_url": _as_text("webhook_url", fields.get("webhook_url")),
            **({"loras": _as_loras(fields["loras"])} if fields.get("loras") not in (None, "") else {})}


def _as_loras(value: Any) -> Any:
    """`loras` as sent: a JSON list (JSON body, the SDK's extra_body) or its JSON text (a multipart part); the list
    itself is checked by CreateJob (core/loras.py)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _bad("loras", "expected a JSON list of {\"ref\", \"scale\"} objects") from None
    return value


def _as_text(field: str, value: Any) -> str | None:
    """A text field: "" and null mean not given; any other non-text (0, false, [] ...) is refused, never dropped."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _bad(field, f"expected a string, found {shown(value)}")
    return value


EXTRA_SAMPLER_FIELDS = ("num_inference_steps", "flow_shift", "audio_flow_shift", "guidance_scale")
"""Sampler knobs a vllm-omni client may repeat inside `extra_params`: the release's own fixed values (8, 10, 3, 1) are
accepted as no-ops, any other value is refused naming `extra_params.<field>` (the top-level rules, same wording)."""


def _check_extra_params(raw: Any) -> None:
    """vLLM-Omni's `extra_params` (a JSON object, ≤ 16 KiB): `task: "t2va"` and the release's fixed sampler values
    (`EXTRA_SAMPLER_FIELDS`) are accepted and change nothing; anything else is refused naming the field."""
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
        if name in EXTRA_SAMPLER_FIELDS and value is not None:
            try:
                request_rules.check_sampler_fields({name: value})
            except request_rules.RequestRuleError as exc:
                raise _bad(f"extra_params.{name}", str(exc), "unsupported_parameter") from None
            continue
        raise _bad(f"extra_params.{name}", "not supported (only task=\"t2va\" and the release's fixed "
                                           f"{', '.join(EXTRA_SAMPLER_FIELDS)})", "unsupported_parameter")


_OWN_MESSAGES = ("unsupported_size", "unsupported_duration", "empty_prompt", "prompt_too_long", "bool_refused")
"""Validation errors whose message already names the field."""


def validated(fields: dict[str, Any], max_prompt_chars: int, canvas: str | None = None,
              lora_policy: loras.LoraPolicy | None = None) -> CreateJob:
    """parse_create's fields as CreateJob (`canvas`: a CANVAS_PROFILES name for the default size; `lora_policy`: the
    per-job LoRA allow-list). 400 unsupported_size / unsupported_duration / invalid_request / the core/loras.py
    codes."""
    try:
        return CreateJob.model_validate(fields, context={"max_prompt_chars": max_prompt_chars, "canvas": canvas,
                                                         "loras": lora_policy})
    except ValidationError as exc:
        kind, where, message = first_error(exc)
        code = kind if kind in ("unsupported_size", "unsupported_duration", *LORA_CODES) else "invalid_request"
        own = kind in _OWN_MESSAGES or kind in LORA_CODES or kind == "invalid_lora"
        raise ApiError(400, code, message if own else f"{where}: {message}") from None


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
    loras: list[dict[str, Any]] | None = None
    priority: Literal["interactive", "batch"] = Field("interactive", description="Queue lane.")
    h3batch_status: str = Field(description="The native status (adds cancelled, expired).")


def _int_time(value: float | None) -> int | None:
    return None if value is None else int(value)


def video_object(record: dict[str, Any], position: int | None, model: str) -> dict[str, Any]:
    """A job record as an OpenAI `video` object of `model`, plus h3batch's fields."""
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
        "id": record["id"], "object": "video", "model": model, "status": openai_status, "progress": progress,
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
        "loras": record.get("loras") or None, "priority": lanes.lane_of(record).value, "h3batch_status": status,
    }).model_dump(mode="json")


VIDEOS = Vocabulary(
    api="openai", noun="video", not_found="video_not_found", not_completed="video_not_completed",
    not_completed_message="video {id} is {status}; its content exists only once it is completed",
    expired_message="video {id} expired at {at}", gone_message="video {id}'s files are no longer stored",
    not_completed_retryable=False)
"""/v1/videos' codes and wording for the job service's errors."""
