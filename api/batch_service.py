"""What POST /batches and its reads do, apart from HTTP: parse a submission (JSON or JSONL), validate every line with
the job service's own rules, create the batch (core/batches.py) under an Idempotency-Key, and show it: the batch
object, its results lines and its archive layout (api/zipstream.py).

Every line goes through `job_service.validate_create`, the check POST /jobs makes (api/schemas.py over
core/geometry.py and core/request_rules.py), and through the same webhook URL vetting; a refused line is reported as
`{line, field, message}`. Nothing is written until every line has been judged.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import dataclasses
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from h3batch.api import idempotency, job_inputs, job_service
from h3batch.core.archive_names import member_names
from h3batch.api.errors import ApiError
from h3batch.api.job_service import Caller, FieldError
from h3batch.api.json_budget import JsonBudget, TooComplex, max_tokens
from h3batch.api.jobs import JOBS
from h3batch.api.zipstream import Member, ZipLayout, file_crc32
from h3batch.core import batches, capacity, defaults, jsonl, lanes
from h3batch.core import jobs as store
from h3batch.core.artifact_store import StoreUnavailable
from h3batch.core.jobs import JobSpec, JobStatus

log = logging.getLogger("h3batch.api")

TOP_LEVEL = ("requests", "metadata", "on_invalid", "webhook_url")
ON_INVALID = ("reject", "skip")
CUSTOM_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A custom_id names the item's file in the archive: 1..64 of letters, digits, `.`, `_`, `-`, not starting with a
dot (so it is a safe file name on every system)."""
MAX_DETAILS = 100
"""Refused lines listed in one 422 (the message gives the full count)."""


@dataclass(frozen=True)
class Submission:
    """A batch as sent: the requests with their (1-based) line numbers, and the batch's options."""

    lines: list[tuple[int, Any]]
    metadata: dict[str, str] = field(default_factory=dict)
    on_invalid: str = "reject"
    webhook_url: str | None = None


def _metadata(value: Any) -> dict[str, str]:
    """The batch's `metadata`: an object of up to 16 string values (keys up to 64, values up to 512 characters)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > defaults.BATCH_METADATA_KEYS or not all(
            isinstance(k, str) and 0 < len(k) <= 64 and isinstance(v, str)
            and len(v) <= defaults.BATCH_METADATA_VALUE_CHARS for k, v in value.items()):
        raise ApiError(400, "invalid_request", f"metadata: expected an object of at most "
                                               f"{defaults.BATCH_METADATA_KEYS} string values (keys 1..64, values up "
                                               f"to {defaults.BATCH_METADATA_VALUE_CHARS} characters)")
    return dict(value)


def _options(metadata: Any, on_invalid: Any, webhook_url: Any) -> tuple[dict[str, str], str, str | None]:
    if on_invalid is None:
        on_invalid = "reject"
    if on_invalid not in ON_INVALID:
        raise ApiError(400, "invalid_request",
                       f"on_invalid: expected 'reject' or 'skip', found {str(on_invalid)[:40]!r}")
    if webhook_url is not None and (not isinstance(webhook_url, str) or not 0 < len(webhook_url) <= 2048):
        raise ApiError(400, "invalid_request", "webhook_url: expected a URL of 1..2048 characters")
    return _metadata(metadata), on_invalid, webhook_url


def from_json(body: Any) -> Submission:
    """`{"requests": [...], "metadata", "on_invalid", "webhook_url"}`; line n is requests[n-1]. 400 otherwise."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "expected a JSON object body, e.g. {\"requests\": [{\"prompt\": \"rain "
                                            "on a tin roof\"}]}, or a multipart upload with a JSONL `file`")
    unknown = sorted(set(body) - set(TOP_LEVEL))
    if unknown:
        raise ApiError(400, "unsupported_parameter", f"{unknown[0][:64]}: unknown field (accepted: "
                                                     f"{', '.join(TOP_LEVEL)})")
    requests = body.get("requests")
    if not isinstance(requests, list):
        raise ApiError(400, "invalid_request", "requests: expected a list of job requests")
    metadata, on_invalid, webhook_url = _options(body.get("metadata"), body.get("on_invalid"), body.get("webhook_url"))
    return Submission([(n, item) for n, item in enumerate(requests, start=1)], metadata, on_invalid, webhook_url)


def from_jsonl(data: bytes, metadata: str | None, on_invalid: str | None, webhook_url: str | None, *,
               max_batch: int = defaults.MAX_BATCH) -> Submission:
    """A JSONL upload: one job request per non-blank line (blank lines are skipped, numbers stay those of the file);
    `metadata` is a JSON string. A line that is not JSON becomes a refused line, like any other."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_request", "file: expected UTF-8 text (one JSON job request per line)") from None
    try:
        meta = json.loads(metadata) if metadata else None
    except ValueError:
        raise ApiError(400, "invalid_request", "metadata: expected a JSON object") from None
    meta, on_invalid, webhook_url = _options(meta, on_invalid or None, webhook_url or None)
    lines: list[tuple[int, Any]] = []
    budget = JsonBudget(max_tokens(max_batch))  # the line split exactly as parsed: what the body scan cannot see
    for n, raw in jsonl.numbered_lines(text):  # the one line rule the CLI reads by too (core/jsonl.py)
        try:
            budget.feed(raw.encode())
        except TooComplex as exc:
            raise ApiError(422, "json_too_complex", budget.describe(exc)) from None
        budget.end_line()
        try:
            lines.append((n, json.loads(raw)))
        except (ValueError, RecursionError) as exc:
            lines.append((n, _NotJson(str(exc)[:120])))
    return Submission(lines, meta, on_invalid, webhook_url)


@dataclass(frozen=True)
class _NotJson:
    reason: str


def validate(sub: Submission, caller: Caller, *, max_batch: int, max_prompt_chars: int,
             canvas: str | None) -> tuple[list[batches.Item], list[dict[str, Any]], dict[str, Any]]:
    """(items, refused lines, canonical form for the idempotency fingerprint). 400 when the count is out of range
    (largest_batch: H3BATCH_MAX_BATCH, or a smaller queue or per-key cap, named in the message)."""
    most, bound = largest_batch(caller, max_batch)
    if not 1 <= len(sub.lines) <= most:
        code = "batch_too_large" if sub.lines else "invalid_request"
        raise ApiError(400, code, f"requests: expected 1..{most} job requests ({bound}), found {len(sub.lines)}")
    if sub.webhook_url is not None:
        caller.vet_webhook_url(sub.webhook_url)  # the batch's own: 400/422 for the whole submission
    items: list[batches.Item] = []
    refused: list[dict[str, Any]] = []
    over: list[dict[str, Any]] = []  # lines no worker serves (too large, or task/precision not served)
    canonical: list[Any] = []
    seen: set[str] = set()
    fleet = capacity.fleet(caller.r)  # read once: every line is measured against the same fleet
    for index, (line, raw) in enumerate(sub.lines):
        def refuse(where: str, message: str, line: int = line) -> None:
            refused.append({"line": line, "field": where, "message": message})

        if isinstance(raw, _NotJson):
            refuse("body", f"expected one JSON object per line ({raw.reason})")
            continue
        if not isinstance(raw, dict):
            refuse("body", f"expected a JSON object (a job request), found {type(raw).__name__}")
            continue
        body = dict(raw)
        custom_id = body.pop("custom_id", None)
        if custom_id is not None:
            if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
                refuse("custom_id", "custom_id: expected 1..64 letters, digits, '.', '_' or '-', not starting "
                                    "with '.' or '-'")
                continue
            if custom_id in seen:
                refuse("custom_id", f"custom_id: {custom_id!r} is used by an earlier line; it must be unique")
                continue
        try:
            body, raw_images = job_inputs.split_json(body)  # data: URLs (api/job_inputs.py), as POST /jobs takes
            req = job_service.validate_create(body, max_prompt_chars=max_prompt_chars, canvas=canvas,
                                              lora_policy=caller.lora_policy)
            job_service.check_timeout(caller, req)
            if req.priority == lanes.Priority.INTERACTIVE.value:
                raise FieldError(422, "invalid_request", "priority: a batch item runs in the batch lane; "
                                 "'interactive' is for single jobs (POST /jobs), found 'interactive'", "priority")
            if req.webhook_url is not None:
                caller.vet_webhook_url(req.webhook_url)
        except (FieldError, job_inputs.ImageError) as exc:
            refuse(exc.field, exc.message)
            continue
        except ApiError as exc:  # webhook_url refused (422) or webhooks not configured (400)
            refuse("webhook_url", exc.message)
            continue
        need = job_service.need_of(req, caller.default_precision, fleet)
        unserved = job_service.over_capacity(fleet, need)
        images: list = []
        if unserved is None:  # the images of a line the fleet serves (a line no worker serves is reported as such)
            try:
                images = job_inputs.check_images(req.task, raw_images, req.width, req.height)
            except job_inputs.ImageError as exc:
                refuse(exc.field, exc.message)
                continue
        if custom_id is not None:
            seen.add(custom_id)
        # The idempotency form holds the request, not the fleet's verdict: a retry after the fleet changed is still
        # the same request (the first attempt's outcome is replayed).
        canonical.append({**req.model_dump(mode="json"), "custom_id": custom_id, **job_inputs.fingerprint(images)})
        if unserved is not None:  # as POST /jobs answers 422 exceeds_worker_capacity / no_capable_worker
            over.append({"line": line, "field": unserved.field, "message": f"{unserved.code}: {unserved.message}"})
            continue
        why = job_service.lora_base_refusal(fleet, req)
        if why is not None:  # as POST /jobs answers 422 lora_base_mismatch
            over.append({"line": line, "field": "loras", "message": f"lora_base_mismatch: {why}"})
            continue
        spec = JobSpec(prompt=req.prompt, seconds=need.seconds, width=req.width, height=req.height,
                       seed=store.random_seed() if req.seed is None else req.seed, release=req.release,
                       owner=caller.owner, webhook_url=req.webhook_url,
                       webhook_events=tuple(req.webhook_events or ()), task=need.task, precision=need.precision,
                       loras=tuple(req.lora_records), timeout_s=req.timeout_s,
                       priority=lanes.Priority.BATCH.value)
        items.append(batches.Item(spec=spec, index=index, custom_id=custom_id, images=tuple(images)))
    form = {"requests": canonical, "refused": refused, "metadata": sub.metadata, "on_invalid": sub.on_invalid,
            "webhook_url": sub.webhook_url}
    return items, sorted(refused + over, key=lambda entry: entry["line"]), form


def create(caller: Caller, sub: Submission, *, max_batch: int, max_prompt_chars: int, canvas: str | None,
           idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
    """Validate, then write the batch and release what idle workers can take now; returns (batch, replayed).
    422 invalid_batch (nothing queued) when a line is refused, unless on_invalid is skip and one line passed."""
    items, refused, form = validate(sub, caller, max_batch=max_batch, max_prompt_chars=max_prompt_chars,
                                    canvas=canvas)
    if refused and (sub.on_invalid == "reject" or not items):
        shown = refused[:MAX_DETAILS]
        more = f" (the first {len(shown)} listed)" if len(refused) > len(shown) else ""
        raise ApiError(422, "invalid_batch", f"{len(refused)} of {len(sub.lines)} lines refused{more}; nothing was "
                                             f"queued" + ("" if items else " (no line passed)"), False, None, shown)
    held = None
    while idempotency_key is not None:  # a key whose batch is gone creates afresh (api/idempotency.py)
        held = idempotency.claim(caller.r, caller.owner, idempotency_key, idempotency.fingerprint(form),
                                 exists=lambda batch_id: batches.load_batch(caller.r, batch_id) is not None)
        if held.job_id is None:
            break
        batch = batches.load_batch(caller.r, held.job_id)
        if batch is not None:
            return batch, True
    keyed = bool(caller.owner)  # an open API (no keys) has no key to count by: the queue cap alone applies
    limits = batches.Admission(max_queued=caller.max_queued,
                               max_active_per_key=caller.max_active_per_key if keyed else 0,
                               creates_per_min=caller.creates_per_min if keyed else 0)
    try:
        items = _store_images(caller, items)
        batch_id = batches.create_batch(caller.r, caller.owner, items, metadata=sub.metadata,
                                        skipped=refused, webhook_url=sub.webhook_url, limits=limits)
    except batches.Refused as exc:
        _drop_images(caller, items)
        if held is not None:
            idempotency.release(caller.r, held)
        raise _refusal(caller, exc, len(items)) from None
    except BaseException:
        _drop_images(caller, items)
        if held is not None:
            idempotency.release(caller.r, held)
        raise
    if held is not None:
        idempotency.record_job(caller.r, held, batch_id)
    batches.feed(caller.r, caller.send_render)  # failures: items stay in h3b:queue and the reaper re-sends
    log.info("batch created items=%d skipped=%d", len(items), len(refused),
             extra={"job_id": batch_id, "request_id": caller.request_id})
    return batches.load_batch(caller.r, batch_id), False  # type: ignore[return-value]


def _store_images(caller: Caller, items: list[batches.Item]) -> list[batches.Item]:
    """Items whose lines carry images get their job id now and their images stored under it (inputs/), as a single
    create does; 503 storage_unavailable when the store refuses (what was written is removed by the caller)."""
    out = []
    for item in items:
        if item.images:
            job_id = store.new_job_id()
            item = dataclasses.replace(item, spec=dataclasses.replace(item.spec, job_id=job_id))
            try:
                inputs = job_inputs.store_inputs(caller.artifacts, caller.artifacts_dir, job_id, list(item.images))
            except StoreUnavailable as exc:
                _drop_images(caller, out)  # the lines stored before this one
                raise ApiError(503, "storage_unavailable", f"the artifact store is unavailable ({exc}); retry later",
                               True, {"Retry-After": "5"}) from None
            out.append(dataclasses.replace(item, spec=dataclasses.replace(item.spec, inputs=inputs)))
        else:
            out.append(item)
    return out


def _drop_images(caller: Caller, items: list[batches.Item]) -> None:
    """A refused batch leaves nothing stored."""
    for item in items:
        if item.images and item.spec.job_id:
            caller.artifacts.delete_job(item.spec.job_id)


def _refusal(caller: Caller, exc: batches.Refused, asked: int) -> ApiError:
    """The answer to a batch its limits refused (nothing was written): the same codes a single job gets."""
    if exc.limit == "queue_full":
        return job_service.queue_full(caller, asked)
    if exc.limit == "too_many_active_jobs":
        return job_service.too_many_active(caller, asked)
    need = min(asked, caller.creates_per_min)
    return ApiError(429, "rate_limited", f"this batch of {asked} jobs spends {asked} create tokens (one per job) and "
                                         f"needs {need} in this API key's bucket of {caller.creates_per_min} per "
                                         f"minute (H3BATCH_RATE_CREATES_PER_MIN; a batch larger than the bucket "
                                         f"needs it full); retry in {exc.retry_after_s} s", True,
                    {"Retry-After": str(exc.retry_after_s)})


def largest_batch(caller: Caller, max_batch: int) -> tuple[int, str]:
    """(most items one batch may carry for this caller, the setting that bounds it): H3BATCH_MAX_BATCH, but never
    more than the queue or the key's active-job cap could ever admit (a larger one would be refused for ever)."""
    bounds = [(max_batch, "H3BATCH_MAX_BATCH"), (caller.max_queued, "H3BATCH_MAX_QUEUED")]
    if caller.owner and caller.max_active_per_key:
        bounds.append((caller.max_active_per_key, "H3BATCH_MAX_ACTIVE_PER_KEY"))
    return min(bounds)


def owned(caller: Caller, batch_id: str) -> dict[str, Any]:
    """The caller's batch. 404 batch_not_found when absent or another key's."""
    batch = batches.load_batch(caller.r, batch_id) if batch_id.startswith("batch_") else None
    if batch is None or batch.get("owner", "") != caller.owner:
        raise _gone(batch_id)
    return batch


def _records(caller: Caller, batch: dict[str, Any]) -> tuple[list[tuple[str, int, str | None]], list]:
    entries = batches.items(caller.r, batch["id"])
    return entries, batches.item_records(caller.r, [job_id for job_id, _, _ in entries])


def view(caller: Caller, batch: dict[str, Any]) -> dict[str, Any]:
    """The batch object (stamping it finished first when every item is, e.g. after cancels through /jobs)."""
    entries, records = _records(caller, batch)
    if len(entries) != batch["total"] and batches.load_batch(caller.r, batch["id"]) is None:
        raise _gone(batch["id"])  # deleted while this request read it
    shown = batches.summary(batch, records, workers=batches.ready_workers(caller.r))
    if batch["finished_at"] is None and shown["status"] in ("completed", "cancelled"):
        batches.check_finished(caller.r, batch["id"], record_ttl_s=caller.result_ttl_s + defaults.RECORD_GRACE_S)
        batch = batches.load_batch(caller.r, batch["id"]) or batch
    batch_id = batch["id"]
    return {"id": batch_id, "object": "batch", "status": batch.get("status") or shown["status"],
            "counts": shown["counts"], "progress": shown["progress"], "eta_s": shown["eta_s"],
            "created_at": batch["created_at"], "finished_at": batch["finished_at"], "metadata": batch["metadata"],
            "skipped": batch["skipped"], "webhook_url": batch["webhook_url"],
            "results_url": f"/batches/{batch_id}/results", "archive_url": f"/batches/{batch_id}/archive"}


def list_page(caller: Caller, *, limit: int, after: str | None) -> dict[str, Any]:
    try:
        found, has_more = batches.list_batches(caller.r, caller.owner, limit=limit, after=after)
    except store.BadCursor as exc:
        raise ApiError(400, "invalid_cursor", str(exc)) from None
    data = []
    for batch in found:
        try:
            data.append(view(caller, batch))
        except ApiError as exc:
            if exc.status != 404:
                raise  # a batch deleted while the page was read is left out, as if listed a moment later
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def results(caller: Caller, batch: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per item in input order: index, custom_id, job_id, status, error, content_url."""
    entries, records = _records(caller, batch)
    lines = []
    for (job_id, index, custom_id), record in zip(entries, records):
        status = batches.item_status(record)
        lines.append({"index": index, "custom_id": custom_id, "job_id": job_id, "status": status,
                      "error": (record or {}).get("error"),
                      "content_url": f"/jobs/{job_id}/content" if status == JobStatus.COMPLETED.value else None})
    return lines


def _gone(batch_id: str) -> ApiError:
    return ApiError(404, "batch_not_found", f"no batch with id {batch_id[:80]!r}")


def cancel(caller: Caller, batch: dict[str, Any]) -> dict[str, Any]:
    """Cancel what has not finished. 404 when it was deleted meanwhile; 409 batch_already_finished."""
    outcome = batches.cancel(caller.r, batch["id"], record_ttl_s=caller.result_ttl_s)
    if outcome is batches.CancelOutcome.GONE:
        raise _gone(batch["id"])
    if outcome is batches.CancelOutcome.FINISHED:
        status = (batches.load_batch(caller.r, batch["id"]) or batch).get("status")
        raise ApiError(409, "batch_already_finished", f"batch {batch['id']} is already {status}", False,
                       job_service.NO_RETRY)
    log.info("batch cancel requested", extra={"job_id": batch["id"]})
    now = batches.load_batch(caller.r, batch["id"])
    if now is None:
        raise _gone(batch["id"])  # deleted right after the cancel: answer as a cancel after the delete would
    return view(caller, now)


def delete(caller: Caller, batch: dict[str, Any]) -> None:
    """Remove the batch, its jobs (running ones stop at their next step) and their files. 404 when a concurrent
    DELETE removed it first."""
    job_ids = batches.delete(caller.r, batch["id"], caller.owner)
    if job_ids is None:
        raise _gone(batch["id"])
    for job_id in job_ids:
        job_service._remove_artifacts(caller, job_id)
    log.info("batch deleted", extra={"job_id": batch["id"]})


# --- the archive ---

def item_file(caller: Caller, job_id: str) -> tuple[dict[str, Any], int, Callable[[], BinaryIO]] | None:
    """(record, size, opener) of a batch item's MP4, or None when it has none to serve. The one place the archive
    reaches a job's file: the resolution GET /jobs/{id}/content uses (job_service.content_object), so the local
    directory and S3 (read by ranged GETs) serve the archive alike."""
    try:
        record, found = job_service.content_object(caller, job_id, JOBS)
    except ApiError:
        return None
    store = caller.artifacts
    return record, found.size, lambda: store.reader(found.key, found.size)


def archive(caller: Caller, batch: dict[str, Any]) -> tuple[ZipLayout, str]:
    """(layout, ETag) of the finished batch's zip: `manifest.jsonl` (the results lines, each with the `file` it
    is stored as, core/archive_names.py), then each completed item's MP4. 409 batch_not_finished while items are
    still queued or running (the member list must not change between two ranges of one download)."""
    if batch["finished_at"] is None:
        view(caller, batch)  # stamps it when every item has finished meanwhile
        batch = batches.load_batch(caller.r, batch["id"]) or batch
    if batch["finished_at"] is None:
        raise ApiError(409, "batch_not_finished", f"batch {batch['id']} is still running; its archive exists once "
                                                  f"every item has finished", True)
    lines = results(caller, batch)
    names = member_names((line["index"], line["custom_id"]) for line in lines)
    known = batches.known_crcs(caller.r, batch["id"])
    files: list[Member] = []
    job_of: dict[str, str] = {}
    fingerprint: list[str] = []
    for line in lines:
        line["file"] = None
        if line["status"] != JobStatus.COMPLETED.value:
            continue
        found = item_file(caller, line["job_id"])
        if found is None:
            continue
        record, size, opener = found
        crc, crc_size = known.get(line["job_id"], (None, -1))
        name = line["file"] = names[line["index"]]
        files.append(Member(name, size, open=opener, crc32=crc if crc_size == size else None))
        job_of[name] = line["job_id"]
        fingerprint.append(f"{name}\0{size}\0{record.get('sha256') or ''}\0")
    # the manifest names each item's member (`file`, null when the zip has none for it): a client checks by it
    manifest = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    members = [Member("manifest.jsonl", len(manifest), data=manifest), *files]
    digest = hashlib.sha256(manifest)
    for text in fingerprint:
        digest.update(text.encode())

    def crc_of(member: Member) -> int:
        assert member.open is not None
        with member.open() as stream:
            crc = file_crc32(stream)
        batches.remember_crc(caller.r, batch["id"], job_of[member.name], crc, member.size)
        return crc

    layout = ZipLayout(members, modified=batch["finished_at"], crc_of=crc_of)
    return layout, f'"{digest.hexdigest()[:32]}"'
