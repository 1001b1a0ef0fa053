"""Pydantic models of the job API: the create request (validated at the door) and the response shapes.

The same models generate /openapi.json, so the document cannot drift from what the views accept and return.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, WithJsonSchema,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from h3batch.core import defaults, lanes, loras, routing
from h3batch.core.jobs import WEBHOOK_EVENTS
from h3batch.core.geometry import (
    ASPECT_RATIOS,
    CANVAS_PROFILES,
    MAX_EDGE,
    TINY_CANVAS,
    GeometryError,
    RequestGeometry,
    check_canvas_area,
    shown,
)

StatusName = Literal["queued", "in_progress", "completed", "failed", "cancelled", "expired"]
StageName = Literal["queued", "text_encode", "denoise", "decode", "mux", "finalize"]


MAX_SECONDS = 3600.0
"""Durations above this are refused before the geometry rules (round(24 * 1e308) overflows); the window is 4..15 s."""


Precision = Literal["bf16", "fp8"]
"""core.routing.PRECISIONS as a schema type."""
Task = Literal["t2va", "fl2va", "ref2va"]
"""core.routing.TASKS as a schema type; the fleet's heartbeats say which of them are served."""

PriorityName = Literal["interactive", "batch"]
"""core.lanes.Priority as a schema type."""

AspectRatio = Literal["16:9", "9:16", "1:1", "4:3", "3:4"]
"""core.geometry.ASPECT_RATIOS as a schema type (tests check the two agree)."""


class LoraItem(BaseModel):
    """One per-job adapter: an allow-listed name or org/repo@<40-hex commit>, and its weight (docs/adapters.md)."""

    model_config = ConfigDict(extra="forbid")

    ref: str = Field(min_length=1, max_length=300, description="An adapter name from the server's allow-list "
                     "(H3BATCH_LORA_ALLOW), or a Hub reference `org/repo@<40-hex commit>` it lists. Never a URL.")
    # The range is checked by core/loras.py (400 lora_scale_out_of_range); the keywords only document it.
    scale: float = Field(1.0, json_schema_extra={"minimum": -loras.MAX_SCALE, "maximum": loras.MAX_SCALE},
                         description="Weight of the adapter's delta (diffusers' set_adapters weight).")


WebhookEventList = Annotated[list[str], WithJsonSchema({"type": "array", "minItems": 1, "items": {
    "type": "string", "enum": list(WEBHOOK_EVENTS)}})]
"""A job's `webhook_events` as the document states it (the names are checked by CreateJob: 422, not 400)."""


LORA_CODES = ("too_many_loras", "unknown_lora", "lora_revision_not_allowed", "lora_scale_out_of_range")
"""core.loras' request codes: validation errors of these kinds keep their code and message."""


class CreateJob(BaseModel):
    """POST /jobs body. Unknown fields are refused (400 unsupported_parameter)."""

    model_config = ConfigDict(extra="forbid")
    _lora_records: list[dict[str, Any]] | None = PrivateAttr(None)

    # minLength/pattern/maxLength document the checks `_prompt_ok` makes (it words the errors better than pydantic).
    prompt: str = Field(description="What the clip shows and sounds like; not empty.",
                        json_schema_extra={"minLength": 1, "maxLength": defaults.MAX_PROMPT_CHARS, "pattern": r"\S"})
    # The geometry limits are checked by h3batch.core.geometry (errors unsupported_size / unsupported_duration); the
    # schema keywords below only document them (the aspect rule has no JSON Schema keyword).
    seconds: float = Field(defaults.DEFAULT_SECONDS, description="Clip length, 4 to 15 s.",
                           json_schema_extra={"minimum": 4, "maximum": 15})
    width: int = Field(defaults.DEFAULT_WIDTH, description="Canvas width in pixels, a multiple of 32.",
                       json_schema_extra={"minimum": 32, "multipleOf": 32})
    height: int = Field(defaults.DEFAULT_HEIGHT, description="Canvas height in pixels, a multiple of 32; "
                                                             "aspect width/height 1:4 to 4:1.",
                        json_schema_extra={"minimum": 32, "multipleOf": 32})
    aspect_ratio: AspectRatio | None = Field(None, description="Instead of width/height: the release's trained "
                                             "bucket for this aspect (16:9 -> 1344x768 on FastH3 V2).")
    seed: int | None = Field(None, ge=0, lt=2**63, description="Sampler noise seed; random 63-bit when omitted "
                                                                "(the chosen value is recorded on the job).")
    release: str | None = Field(None, min_length=1, max_length=200,
                                description="Release id the job needs; a worker serving another one fails the job "
                                            "with release_mismatch.")
    webhook_url: str | None = Field(None, min_length=1, max_length=2048,
                                    description="http(s) URL that gets a signed POST (Standard Webhooks) when the job "
                                                "completes, fails or is cancelled; see docs/api.md.")
    webhook_events: WebhookEventList | None = Field(
        None, description="Which events webhook_url is sent, out of `completed`, `failed` and `cancelled` (Replicate's "
                    "webhook_events_filter); absent: all three. Needs webhook_url. An unknown name, an empty list or "
                    "the field without webhook_url is 422 invalid_webhook_events.")
    precision: Precision | None = Field(None, description="Numeric precision of the render: `bf16` (the release's "
                                        "semantics) or `fp8` (opt-in, faster, with a stated error). Absent: the "
                                        "server's default (bf16 unless the operator set H3BATCH_DEFAULT_PRECISION). "
                                        "The job goes only to workers of that precision; 422 no_capable_worker when "
                                        "no live worker renders it.")
    loras: list[LoraItem] | None = Field(None, json_schema_extra={"maxItems": loras.DEFAULT_MAX_LORAS},
                                         description="Per-job LoRAs on the native MiniMax-H3 release, applied for this "
                                         "job only: up to H3BATCH_MAX_LORAS (default 4) of {ref, scale}. 400 "
                                         "unknown_lora, lora_revision_not_allowed, too_many_loras, "
                                         "lora_scale_out_of_range; 422 lora_base_mismatch when no live worker serves "
                                         "a release that takes adapters (FastH3 V2 takes none).")
    task: Task = Field(routing.DEFAULT_TASK, description="Workflow: `t2va` (text to video with sound, every release), "
                       "`fl2va` (from a first_frame and/or to a last_frame) or `ref2va` (with 1-9 references), the "
                       "last two on a native MiniMax-H3 release (docs/api.md \"Release kinds\"). A task no live "
                       "worker serves gets 422 no_capable_worker naming what the fleet serves.")
    timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False,
                                    description="Seconds from creation the job may take, queue time included; past "
                                                "them it fails with error code `timeout`. At most the operator's "
                                                "H3BATCH_MAX_JOB_TIMEOUT_S (else 400).")
    priority: PriorityName | None = Field(None, description="Queue lane: `interactive` (the default of POST /jobs "
                                          "and /v1/videos) starts before waiting `batch` work; `batch` (every batch "
                                          "item's lane) waits for an idle worker. Neither starves: after "
                                          "H3BATCH_INTERACTIVE_STREAK interactive starts in a row (default 4) while "
                                          "batch work waits, one batch job goes next. A batch line may say `batch` "
                                          "but not `interactive`.")

    @field_validator("seed", "width", "height", "seconds", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any, info: ValidationInfo) -> Any:
        # JSON true/false would pass pydantic's lax int/float mode as 1/0; /v1/videos has always refused them.
        if isinstance(value, bool):
            raise PydanticCustomError("bool_refused", "{field}: expected {kind}, found {found}",
                                      {"field": info.field_name, "found": str(value).lower(),
                                       "kind": "a number" if info.field_name == "seconds" else "an integer"})
        return value

    @field_validator("prompt", "release")
    @classmethod
    def _encodable(cls, value: str | None, info: ValidationInfo) -> str | None:
        # JSON may carry lone surrogates (\ud800); they cannot be stored as UTF-8, so refuse them at the door.
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise PydanticCustomError("invalid_text", "{field}: expected valid Unicode text, found an unpaired "
                                          "surrogate", {"field": info.field_name}) from None
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_ok(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise PydanticCustomError("empty_prompt", "prompt: expected a non-empty text, found {found}",
                                      {"found": repr(value)})
        # NUL and the other C0 controls (tab, newline, CR aside) mean nothing in a prompt and truncate C strings.
        control = next((c for c in value if ord(c) < 32 and c not in "\t\n\r"), None)
        if control is not None:
            raise PydanticCustomError("invalid_text", "prompt: expected text without control characters, found "
                                      "U+{code} at character {at}",
                                      {"code": f"{ord(control):04X}", "at": value.index(control)})
        limit = (info.context or {}).get("max_prompt_chars", defaults.MAX_PROMPT_CHARS)
        if len(value) > limit:
            raise PydanticCustomError("prompt_too_long", "prompt: expected at most {limit} characters, found {n}",
                                      {"limit": limit, "n": len(value)})
        return value

    @model_validator(mode="before")
    @classmethod
    def _canvas_from_release(cls, data: Any, info: ValidationInfo) -> Any:
        """A size left out (wholly or one side) or given as aspect_ratio comes from the served release's canvas
        (context `canvas`: a CANVAS_PROFILES name, H3BATCH_CANVAS)."""
        if not isinstance(data, dict):
            return data
        profile = CANVAS_PROFILES.get((info.context or {}).get("canvas") or "", TINY_CANVAS)
        aspect = data.get("aspect_ratio")
        if aspect is not None and (not isinstance(aspect, str) or aspect not in ASPECT_RATIOS):
            return data  # the field's own Literal check words the error
        given = {name: data[name] for name in ("width", "height") if name in data}  # a null stays null (refused)
        try:
            if aspect is not None and given:
                raise GeometryError("aspect_ratio", "either aspect_ratio or width/height, not both",
                                    f"aspect_ratio={aspect!r} with {given}")
            width, height = profile.resolve(None, None, aspect)
        except GeometryError as exc:
            raise PydanticCustomError("unsupported_size", "{detail}", {"detail": str(exc)}) from None
        return {"width": width, "height": height, **data}

    @model_validator(mode="after")
    def _webhook_events_ok(self) -> "CreateJob":
        if self.webhook_events is None:
            return self
        unknown = [name for name in self.webhook_events if name not in WEBHOOK_EVENTS]
        if unknown or not self.webhook_events:
            found = repr(unknown[0]) if unknown else "an empty list"
            raise PydanticCustomError("invalid_webhook_events", "webhook_events: expected a list of one or more of "
                                      "{names}, found {found}", {"names": ", ".join(WEBHOOK_EVENTS), "found": found})
        if self.webhook_url is None:
            raise PydanticCustomError("invalid_webhook_events", "webhook_events: chooses which events webhook_url is "
                                      "sent; give a webhook_url too, or leave webhook_events out")
        self.webhook_events = [name for name in WEBHOOK_EVENTS if name in self.webhook_events]  # once each, in order
        return self

    @model_validator(mode="after")
    def _loras_allowed(self, info: ValidationInfo) -> "CreateJob":
        # The whole rule is core/loras.py, against the API's allow-list (context `loras`); what it resolved each item
        # to (Hub repo and commit, or the worker's folder) is what the job record keeps (`lora_records`).
        if self.loras is not None:
            policy = (info.context or {}).get("loras") or loras.LoraPolicy({})
            items = [{"ref": item.ref, "scale": item.scale} for item in self.loras]
            try:
                self._lora_records = loras.check_loras(items, policy)
            except loras.LoraError as exc:
                raise PydanticCustomError(exc.code if exc.code in LORA_CODES else "invalid_lora", "{message}",
                                          {"message": str(exc)}) from None
        return self

    @property
    def lora_records(self) -> list[dict[str, Any]]:
        """The checked adapters as the job record keeps them ([] without `loras`)."""
        return list(getattr(self, "_lora_records", None) or [])

    @model_validator(mode="after")
    def _geometry_supported(self) -> "CreateJob":
        for name in ("width", "height"):
            value = getattr(self, name)
            if value > MAX_EDGE:
                raise PydanticCustomError("unsupported_size", "{field}: expected at most {limit} pixels (the model's "
                                          "1344x768 area at the 32-pixel minimum edge), found {found}",
                                          {"field": name, "limit": MAX_EDGE, "found": shown(value)})
        if self.seconds > MAX_SECONDS:
            raise PydanticCustomError("unsupported_duration", "seconds: expected a duration of 4 to 15 s, found "
                                      "{found}", {"found": shown(self.seconds)})
        try:
            RequestGeometry(self.width, self.height, self.seconds)
            check_canvas_area(self.width, self.height)  # a giant canvas would only OOM-kill worker after worker
        except GeometryError as exc:
            kind = "unsupported_duration" if exc.field == "seconds" else "unsupported_size"
            raise PydanticCustomError(kind, "{detail}", {"detail": str(exc)}) from None
        return self


def first_error(exc: ValidationError) -> tuple[str, str, str]:
    """(type, where, message) of the first error pydantic found; `where` is the dotted field path, or "body"."""
    first = exc.errors(include_url=False)[0]
    return first["type"], ".".join(str(p) for p in first["loc"]) or "body", first["msg"]


class ErrorDetail(BaseModel):
    code: str
    message: str
    retryable: bool
    request_id: str | None = None
    details: list[dict[str, Any]] | None = Field(None, description="POST /batches: one entry per refused line, "
                                                                   "{line, field, message}.")


class ErrorBody(BaseModel):
    """Every non-2xx answer."""

    error: ErrorDetail


class JobError(BaseModel):
    code: str
    message: str
    retryable: bool
    stage: str | None = None


class JobLinks(BaseModel):
    self: str
    content: str
    cancel: str
    events: str


class Job(BaseModel):
    """A job as GET /jobs/{id} shows it."""

    id: str
    object: Literal["job"] = "job"
    status: StatusName
    stage: StageName
    progress: float = Field(ge=0.0, le=1.0, description="0..1, non-decreasing within an attempt; 1 iff completed.")
    step: int = Field(description="Denoise step done, 0..total_steps.")
    total_steps: int
    queue_position: int | None = Field(None, description="1 = next to start; null unless queued.")
    eta_s: float | None = Field(None, description="Estimated seconds until the job finishes, for a person watching: "
                                                  "from its own progress while running; from its place in line, the "
                                                  "live workers and the mean completed job while queued. Null when "
                                                  "there is nothing to go on, and once finished.")
    prompt: str
    seconds: float
    width: int
    height: int
    seed: int
    release: str | None = Field(None, description="Release requested (null: whatever the worker serves).")
    release_id: str | None = Field(None, description="Release that rendered the job.")
    task: Task = Field(routing.DEFAULT_TASK, description="Workflow the job runs.")
    precision: Precision = Field(routing.DEFAULT_PRECISION, description="Precision it renders in (workers of that "
                                                                        "precision only).")
    priority: PriorityName = Field("interactive", description="Queue lane (`batch` for batch items).")
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    queue_wait_s: float | None = None
    inference_time_s: float | None = None
    timings: dict[str, float] | None = Field(None, description="Seconds per stage (text_encode, denoise, decode, "
                                                               "mux, finalize).")
    frames: int | None = None
    size_bytes: int | None = None
    attempt: int
    worker: str | None = None
    timeout_s: float | None = Field(None, description="The timeout_s asked for (seconds from creation), if any.")
    cancel_reason: str | None = None
    cancelled_at_stage: str | None = None
    error: JobError | None = None
    metadata: dict[str, Any] | None = Field(None, description="Provenance once rendered: resolved parameters, seed, "
                                                             "release_id, contract_hash, gpu, library versions.")
    webhook_url: str | None = None
    webhook_events: list[str] | None = Field(None, description="The events webhook_url is sent, when the job chose "
                                                               "some (null: all of them).")
    webhook_deliveries: list[dict[str, Any]] | None = Field(None, description="One entry per webhook attempt.")
    loras: list[dict[str, Any]] | None = Field(None, description="Per-job LoRAs as accepted: ref, scale and the Hub "
                                               "repo + commit (or worker folder) each resolved to.")
    links: JobLinks


class JobList(BaseModel):
    """GET /jobs page."""

    object: Literal["list"] = "list"
    data: list[Job]
    first_id: str | None
    last_id: str | None
    has_more: bool


class UsageJobs(BaseModel):
    """Jobs counted, by the status they ended in (each job once, however many attempts it took)."""

    completed: int
    failed: int
    cancelled: int
    total: int


class UsageDay(BaseModel):
    """One UTC day's usage (days with none are left out)."""

    date: str = Field(description="The UTC day, YYYY-MM-DD.")
    jobs: UsageJobs
    video_seconds: float
    gpu_seconds: float


class Usage(BaseModel):
    """GET /usage: the calling key's usage over the UTC days from..to (core/usage.py)."""

    object: Literal["usage"] = "usage"
    from_: str = Field(alias="from", description="First UTC day summed, YYYY-MM-DD.")
    to: str = Field(description="Last UTC day summed, YYYY-MM-DD.")
    jobs: UsageJobs
    video_seconds: float = Field(description="Seconds of video of the completed jobs.")
    gpu_seconds: float = Field(description="Render time the workers measured for the completed jobs (their "
                                           "inference_time_s); failed and cancelled renders add none.")
    days: list[UsageDay] = Field(description="Per UTC day with any usage, oldest first.")


def job_view(record: dict[str, Any], queue_position: int | None, eta_s: float | None = None) -> dict[str, Any]:
    """The public JSON of a record (private fields such as owner and sha256 left out)."""
    job_id = record["id"]
    started, created, finished = record.get("started_at"), record["created_at"], record.get("finished_at")
    timings = record.get("timings")
    view = Job(
        id=job_id, status=record["status"], stage=record["stage"], progress=record.get("progress") or 0.0,
        step=record.get("step") or 0, total_steps=record.get("total_steps") or defaults.TOTAL_STEPS,
        queue_position=queue_position if record["status"] == "queued" else None, eta_s=eta_s,
        prompt=record.get("prompt", ""), seconds=record["seconds"], width=record["width"], height=record["height"],
        seed=record["seed"], release=record.get("release"), release_id=record.get("release_id"),
        task=record.get("task") or routing.DEFAULT_TASK, precision=record.get("precision") or routing.DEFAULT_PRECISION,
        priority=lanes.lane_of(record).value,
        created_at=created, started_at=started, finished_at=finished, expires_at=record.get("expires_at"),
        queue_wait_s=None if started is None else round(started - created, 6),
        inference_time_s=None if not timings else round(sum(timings.values()), 6),
        timings=timings, frames=record.get("frames"), size_bytes=record.get("size_bytes"),
        attempt=record.get("attempt") or 0, worker=record.get("worker"),
        cancel_reason=record.get("cancel_reason"), cancelled_at_stage=record.get("cancelled_at_stage"),
        timeout_s=record.get("timeout_s"),
        error=record.get("error"), metadata=record.get("metadata"), webhook_url=record.get("webhook_url"),
        webhook_events=record.get("webhook_events"),
        webhook_deliveries=record.get("webhook_deliveries"), loras=record.get("loras") or None,
        links=JobLinks(self=f"/jobs/{job_id}", content=f"/jobs/{job_id}/content", cancel=f"/jobs/{job_id}/cancel",
                       events=f"/jobs/{job_id}/events"),
    )
    return view.model_dump(mode="json")
