"""A job's input images: fl2va's keyframes (`first_frame`, `last_frame`) and ref2va's `references`.

Taken from a multipart upload (file parts; `references` may repeat) or as `data:` URLs (JSON strings, or multipart
text parts): never as a URL the server would fetch. Each image is checked at the door, before anything is written:

- what arrives decodes as an image Pillow reads (PNG, JPEG, WebP, GIF, BMP, ...): else 400 `invalid_image`;
- at most `MAX_IMAGE_BYTES` encoded and `MAX_IMAGE_PIXELS` decoded (the header's size is read before any pixel is
  decoded, so a decompression bomb costs nothing): else 413 `image_too_large`;
- the count fits the task (`TASK_INPUTS`: fl2va a first and/or a last keyframe, ref2va 1 to 9 references, t2va
  none): else 400 `invalid_request`. Every message names the field (`first_frame`, `references[2]`).

Then each is converted to RGB and re-encoded as PNG. Keyframes are placed on the job's canvas here, by the released
model's rule (diffusers' `MiniMaxH3ResizeStep`, the worker's `conditioning.place_keyframes`): the first keyframe given
is stretched onto the canvas with LANCZOS; with both, the last one is scaled to cover the canvas and centre-cropped.
References are stored at their own size: the worker scales each to the release's reference short edge (2048 in the
published release). `store_inputs` writes them under `<job id>/inputs/` of the artifact store (local directory or S3)
before the job's record exists, so a worker never sees a job without its images; the record's `inputs` names the
keys. Deleting, expiring or reaping a job removes them with its other files.

Pillow is the library here: decoding, the pixel-count check and the resize are all its own.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from h3batch.api.errors import ApiError
from h3batch.core.artifact_store import ArtifactStore, input_key

MAX_IMAGE_BYTES = 16 * 1024 * 1024
"""Largest encoded image (16 MiB)."""
MAX_IMAGE_PIXELS = 4096 * 4096
"""Largest decoded image, in pixels (4096 x 4096)."""
MAX_REFERENCES = 9
"""ref2va's limit of reference images (diffusers' for images)."""
IMAGE_FIELDS = ("first_frame", "last_frame", "references")
TASK_INPUTS = {"t2va": (), "fl2va": ("first_frame", "last_frame"), "ref2va": ("references",)}
"""The image fields each task takes."""
_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+)?(;[^,]*)?,", re.ASCII)


class ImageError(ApiError):
    """A refused image; `field` names it (POST /batches reports it per line)."""

    def __init__(self, status: int, code: str, message: str, field: str):
        super().__init__(status, code, message)
        self.field = field


@dataclass(frozen=True)
class JobImage:
    """One checked input image, as stored: PNG bytes in RGB."""

    field: str  # first_frame, last_frame, references[i]
    name: str  # file stem under inputs/: first_frame, last_frame, reference-0 ...
    png: bytes
    width: int
    height: int


def from_data_url(field: str, value: Any) -> bytes:
    """The bytes of a `data:image/...;base64,...` URL. 400 invalid_image naming `field` for anything else (an
    http(s) URL included: the server fetches nothing)."""
    if not isinstance(value, str):
        raise ImageError(400, "invalid_image", f"{field}: expected a data: URL (data:image/png;base64,...) or a "
                                               f"file part, found {type(value).__name__}", field)
    match = _DATA_URL.match(value)
    if match is None or ";base64" not in (match.group(2) or ""):
        raise ImageError(400, "invalid_image", f"{field}: expected a base64 data: URL (data:image/png;base64,...) "
                                               f"or a file part; the server fetches no URLs", field)
    encoded = value[match.end():]
    if len(encoded) > (MAX_IMAGE_BYTES * 4) // 3 + 4:
        raise ImageError(413, "image_too_large", f"{field}: expected at most {MAX_IMAGE_BYTES // 2**20} MiB, found "
                                                 f"about {len(encoded) * 3 // 4 // 2**20} MiB", field)
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(400, "invalid_image", f"{field}: the data: URL is not valid base64", field) from None


def decode(field: str, name: str, data: bytes) -> JobImage:
    """Check one image's bytes and re-encode it as RGB PNG (module docstring); ImageError naming `field`."""
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(413, "image_too_large", f"{field}: expected at most {MAX_IMAGE_BYTES // 2**20} MiB, found "
                                                 f"{len(data) / 2**20:.1f} MiB", field)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageError(413, "image_too_large", f"{field}: expected at most {MAX_IMAGE_PIXELS} pixels "
                                                         f"(4096x4096), found {width}x{height}", field)
            rgb = image.convert("RGB")  # decodes (and fails here on a truncated file)
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, SyntaxError) as exc:
        raise ImageError(400, "invalid_image", f"{field}: expected an image (PNG, JPEG, WebP, ...), found data "
                                               f"Pillow cannot read ({type(exc).__name__})", field) from None
    return JobImage(field, name, _png(rgb), rgb.width, rgb.height)


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def check_count(task: str, raw: dict[str, list[tuple[str, bytes]]]) -> None:
    """The image fields fit the task; 400 invalid_request naming the field otherwise."""
    wanted = TASK_INPUTS.get(task, ())
    for name in IMAGE_FIELDS:
        if raw.get(name) and name not in wanted:
            raise ImageError(400, "invalid_request", f"{name}: not an input of task {task} (its image inputs: "
                                                     f"{', '.join(wanted) or 'none'})", name)
    for name in ("first_frame", "last_frame"):
        if len(raw.get(name, ())) > 1:
            raise ImageError(400, "invalid_request", f"{name}: expected one image, found {len(raw[name])}", name)
    if task == "fl2va" and not (raw.get("first_frame") or raw.get("last_frame")):
        raise ImageError(400, "invalid_request", "first_frame: task fl2va needs a first_frame, a last_frame or "
                                                 "both", "first_frame")
    if task == "ref2va" and not 1 <= len(raw.get("references", ())) <= MAX_REFERENCES:
        raise ImageError(400, "invalid_request", f"references: task ref2va needs 1 to {MAX_REFERENCES} images, "
                                                 f"found {len(raw.get('references', ()))}", "references")


def split_json(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[tuple[str, bytes]]]]:
    """A JSON create body without its image fields, and those images' bytes by field (data: URLs decoded)."""
    rest = {k: v for k, v in body.items() if k not in IMAGE_FIELDS}
    raw: dict[str, list[tuple[str, bytes]]] = {}
    for name in ("first_frame", "last_frame"):
        if body.get(name) is not None:
            raw[name] = [(name, from_data_url(name, body[name]))]
    refs = body.get("references")
    if refs is not None:
        if not isinstance(refs, list):
            raise ImageError(400, "invalid_image", f"references: expected a list of data: URLs, found "
                                                   f"{type(refs).__name__}", "references")
        if len(refs) > MAX_REFERENCES:  # before decoding any of them
            raise ImageError(400, "invalid_request", f"references: expected at most {MAX_REFERENCES} images, found "
                                                     f"{len(refs)}", "references")
        raw["references"] = [(f"references[{i}]", from_data_url(f"references[{i}]", v)) for i, v in enumerate(refs)]
    return rest, raw


def split_form(texts: list[tuple[str, str]], files: list[tuple[str, Any]]
               ) -> tuple[dict[str, Any], dict[str, list[tuple[str, bytes]]]]:
    """A multipart create body: its text fields (other than images) and its images' bytes by field. Image fields
    may be file parts or data: URL text parts; `references` may repeat (in order), every other name may not."""
    body: dict[str, Any] = {}
    raw: dict[str, list[tuple[str, bytes]]] = {}
    seen: dict[str, int] = {}
    for name, value in [*texts, *files]:
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1 and name != "references":
            raise ApiError(400, "invalid_request", f"{name[:64]}: expected one form part, found more")
        if name not in IMAGE_FIELDS:
            if not isinstance(value, str):
                raise ApiError(400, "unsupported_parameter", f"{name[:64]}: file uploads are accepted for "
                                                             f"first_frame, last_frame and references only")
            body[name] = value
            continue
        entries = raw.setdefault(name, [])
        label = f"references[{len(entries)}]" if name == "references" else name
        if len(entries) >= MAX_REFERENCES:
            raise ImageError(400, "invalid_request", f"references: expected at most {MAX_REFERENCES} images, found "
                                                     f"more", "references")
        if isinstance(value, str):
            entries.append((label, from_data_url(label, value)))
        else:  # a werkzeug FileStorage: read at most one byte past the limit
            data = value.stream.read(MAX_IMAGE_BYTES + 1)
            entries.append((label, data))
    return body, raw


def check_images(task: str, raw: dict[str, list[tuple[str, bytes]]], width: int, height: int) -> list[JobImage]:
    """Count, decode and check every image, and place the keyframes on the `width` x `height` canvas (module
    docstring); ImageError naming the first bad field. Writes nothing."""
    check_count(task, raw)
    images: list[JobImage] = []
    for name in ("first_frame", "last_frame"):
        for field, data in raw.get(name, ()):
            images.append(decode(field, name, data))
    for index, (field, data) in enumerate(raw.get("references", ())):
        images.append(decode(field, f"reference-{index}", data))
    return place_keyframes(images, width, height)


def place_keyframes(images: list[JobImage], width: int, height: int) -> list[JobImage]:
    """The keyframes on the canvas: the first given stretched (LANCZOS), a second one cover-cropped; references as
    they are."""
    frames = [im for im in images if im.name in ("first_frame", "last_frame")]
    placed = []
    for image in images:
        if image.name not in ("first_frame", "last_frame") or (image.width, image.height) == (width, height):
            placed.append(image)
            continue
        with Image.open(io.BytesIO(image.png)) as pil:
            if image is frames[0]:
                out = pil.resize((width, height), Image.Resampling.LANCZOS)
            else:
                scale = max(width / pil.width, height / pil.height)
                size = (max(width, round(pil.width * scale)), max(height, round(pil.height * scale)))
                left, top = max(0, (size[0] - width) // 2), max(0, (size[1] - height) // 2)
                out = pil.resize(size, Image.Resampling.LANCZOS).crop((left, top, left + width, top + height))
        placed.append(JobImage(image.field, image.name, _png(out), width, height))
    return placed


def store_inputs(store: ArtifactStore, scratch: Path, job_id: str, images: list[JobImage]) -> dict[str, Any]:
    """Write the images under `<job id>/inputs/<name>.png`; returns the record's `inputs` field ({"first_frame":
    key, "last_frame": key, "references": [keys]}). StoreUnavailable from the store; on any failure what was
    written is removed. `scratch` is a local folder for the files handed to the store (the artifacts directory:
    the local store moves them into place)."""
    inputs: dict[str, Any] = {}
    try:
        for image in images:
            scratch.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".upload-", suffix=".png", dir=scratch)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(image.png)
                stored = store.put_file(Path(tmp), input_key(job_id, f"{image.name}.png"), "image/png")
            finally:
                Path(tmp).unlink(missing_ok=True)
            if image.name.startswith("reference-"):
                inputs.setdefault("references", []).append(stored.key)
            else:
                inputs[image.name] = stored.key
    except BaseException:
        store.delete_job(job_id)
        raise
    return inputs


def fingerprint(images: list[JobImage]) -> dict[str, Any]:
    """What the images add to an Idempotency-Key's fingerprint: each stored PNG's sha256, by field."""
    import hashlib

    return {"images": {image.field: hashlib.sha256(image.png).hexdigest() for image in images}} if images else {}
