"""Derived downloads of a finished MP4 for `GET /v1/videos/{id}/content?variant=`: a PNG thumbnail (the middle
frame), a JPEG sprite sheet (up to `SPRITE_FRAMES` evenly spaced frames in a grid, tiles `SPRITE_TILE_WIDTH` px
wide at the clip's aspect) and the audio track as AAC in an .m4a (stream copy, no re-encode). Each is made with
PyAV (the sheet laid out with Pillow) on first request and cached beside the MP4 (temp file + os.replace, so
concurrent requests never see half a file); PyAV is imported only here, so the API imports it only when a variant is
asked for.

With an S3 store the API derives them the same way on first request (the MP4 fetched into a temp dir) and uploads
them beside the MP4 in the attempt's folder (`<job>/attempt-<n>/thumbnail.png`), so every API replica finds them
and deleting or expiring the job removes them with it. The worker does not make them: it stays free of this
(PyAV-over-HTTP) concern, and most clips are never asked for a thumbnail.
"""
from __future__ import annotations

import math
import os
import tempfile
import uuid
from fractions import Fraction
from pathlib import Path

from h3batch.core.artifact_store import ArtifactStore, StoredObject, sibling

VARIANTS = {"video": ("video.mp4", "video/mp4"), "thumbnail": ("thumbnail.png", "image/png"),
            "spritesheet": ("spritesheet.jpg", "image/jpeg"), "audio": ("audio.m4a", "audio/mp4")}
"""variant -> (file name in the job's artifact dir, media type)."""
SPRITE_FRAMES = 16
"""Most frames a sprite sheet shows (a 4x4 grid); a clip with fewer frames shows each once."""
SPRITE_TILE_WIDTH = 160
"""Width of one tile in pixels; its height keeps the clip's aspect (rounded to an even number, at least 2)."""
SPRITE_QUALITY = 85
"""JPEG quality of the sheet."""


def _atomic(target: Path, write) -> Path:
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
    try:
        write(temp)
        os.replace(temp, target)
    finally:
        temp.unlink(missing_ok=True)
    return target


def _middle_frame(mp4: Path):
    import av  # noqa: PLC0415

    with av.open(os.fspath(mp4)) as container:
        stream = container.streams.video[0]
        duration = float(stream.duration * stream.time_base) if stream.duration else 0.0
        chosen = None
        for frame in container.decode(stream):
            chosen = frame
            if frame.time is not None and frame.time >= duration / 2:
                break
        if chosen is None:
            raise ValueError(f"{mp4.name}: no video frame to make a thumbnail from")
        return chosen.reformat(format="rgb24")


def write_thumbnail(mp4: Path, target: Path) -> Path:
    """PNG of the middle frame of `mp4` at its full size."""
    import av  # noqa: PLC0415

    frame = _middle_frame(mp4)

    def write(temp: Path) -> None:
        codec = av.CodecContext.create("png", "w")
        codec.width, codec.height, codec.pix_fmt = frame.width, frame.height, "rgb24"
        codec.time_base = Fraction(1, 24)
        frame.pts = 0
        packets = list(codec.encode(frame)) + list(codec.encode(None))
        temp.write_bytes(b"".join(bytes(p) for p in packets))

    return _atomic(target, write)


def sprite_layout(frames: int, width: int, height: int) -> tuple[list[int], int, int, int, int]:
    """(indices of the frames shown, columns, rows, tile width, tile height) for a clip of `frames` frames of
    `width`x`height`: min(frames, SPRITE_FRAMES) frames, each the middle one of an equal share of the clip, in a grid
    ceil(sqrt(n)) columns wide, filled row by row."""
    count = max(1, min(frames, SPRITE_FRAMES))
    indices = [min(frames - 1, (2 * i + 1) * frames // (2 * count)) for i in range(count)]
    cols = math.ceil(math.sqrt(count))
    rows = math.ceil(count / cols)
    tile_h = max(2, round(SPRITE_TILE_WIDTH * height / width / 2) * 2)
    return indices, cols, rows, SPRITE_TILE_WIDTH, tile_h


def write_spritesheet(mp4: Path, target: Path) -> Path:
    """JPEG grid of evenly spaced frames of `mp4` (sprite_layout), black where the grid has no frame left."""
    import av  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    with av.open(os.fspath(mp4)) as container:
        stream = container.streams.video[0]
        total = stream.frames or sum(1 for _ in container.decode(stream))
        if not stream.frames:
            container.seek(0)
        indices, cols, rows, tile_w, tile_h = sprite_layout(total, stream.codec_context.width,
                                                            stream.codec_context.height)
        wanted = {index: slot for slot, index in enumerate(indices)}
        sheet = Image.new("RGB", (cols * tile_w, rows * tile_h))
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted:
                slot = wanted[index]
                tile = frame.to_image().resize((tile_w, tile_h), Image.Resampling.LANCZOS)
                sheet.paste(tile, ((slot % cols) * tile_w, (slot // cols) * tile_h))
            if index >= indices[-1]:
                break
    if not wanted:
        raise ValueError(f"{mp4.name}: no video frame to make a sprite sheet from")
    return _atomic(target, lambda temp: sheet.save(temp, format="JPEG", quality=SPRITE_QUALITY))


def write_audio(mp4: Path, target: Path) -> Path:
    """The MP4's AAC track copied (not re-encoded) into an .m4a container."""
    import av  # noqa: PLC0415

    def write(temp: Path) -> None:
        with av.open(os.fspath(mp4)) as source, av.open(os.fspath(temp), "w", format="ipod") as sink:
            audio_in = source.streams.audio[0]
            audio_out = sink.add_stream_from_template(audio_in)
            for packet in source.demux(audio_in):
                if packet.dts is None:  # the demuxer's end-of-stream marker
                    continue
                packet.stream = audio_out
                sink.mux(packet)

    return _atomic(target, write)


_MAKERS = {"thumbnail": write_thumbnail, "spritesheet": write_spritesheet, "audio": write_audio}
"""variant -> what makes its file from the MP4 (mp4 path, target path)."""


def variant_file(job_dir: Path, variant: str) -> tuple[Path, str]:
    """(path, media type) of a variant of the job's MP4 in `job_dir`, made now if not cached. KeyError for an
    unknown variant; FileNotFoundError when the MP4 is gone."""
    name, media_type = VARIANTS[variant]
    mp4 = job_dir / VARIANTS["video"][0]
    if not mp4.is_file():
        raise FileNotFoundError(mp4)
    target = job_dir / name
    if variant != "video" and not target.is_file():
        _MAKERS[variant](mp4, target)
    return target, media_type


def variant_object(store: ArtifactStore, mp4: StoredObject, variant: str) -> tuple[StoredObject, str]:
    """(stored object, media type) of a variant of the stored MP4 `mp4`, made and stored now if not yet there.
    KeyError for an unknown variant; FileNotFoundError when the MP4 is gone."""
    name, media_type = VARIANTS[variant]
    if variant == "video":
        return mp4, media_type
    path = store.local_path(mp4.key)
    if path is not None:  # the local directory: cached beside the MP4 as before
        target, _ = variant_file(path.parent, variant)
        return store.head(sibling(mp4.key, name)) or StoredObject(sibling(mp4.key, name), target.stat().st_size,
                                                                  "", target.stat().st_mtime), media_type
    key = sibling(mp4.key, name)
    found = store.head(key)
    if found is not None:
        return found, media_type
    with tempfile.TemporaryDirectory(prefix="h3batch-variant-") as tmp:
        local = store.download(mp4.key, Path(tmp) / VARIANTS["video"][0])
        made = _MAKERS[variant](local, Path(tmp) / name)
        return store.put_file(made, key, media_type), media_type
