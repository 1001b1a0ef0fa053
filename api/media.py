"""Derived downloads of a finished MP4 for `GET /v1/videos/{id}/content?variant=`: a PNG thumbnail (the middle
frame) and the audio track as AAC in an .m4a (stream copy, no re-encode). Both are made with PyAV on first request
and cached beside the MP4 (temp file + os.replace, so concurrent requests never see half a file); PyAV is imported
only here, so the API imports it only when a variant is asked for.

With an S3 store the API derives them the same way on first request (the MP4 fetched into a temp dir) and uploads
them beside the MP4 in the attempt's folder (`<job>/attempt-<n>/thumbnail.png`), so every API replica finds them
and deleting or expiring the job removes them with it. The worker does not make them: it stays free of this
(PyAV-over-HTTP) concern, and most clips are never asked for a thumbnail.
"""
from __future__ import annotations

import os
import tempfile
import uuid
from fractions import Fraction
from pathlib import Path

from h3batch.core.artifact_store import ArtifactStore, StoredObject, sibling

VARIANTS = {"video": ("video.mp4", "video/mp4"), "thumbnail": ("thumbnail.png", "image/png"),
            "audio": ("audio.m4a", "audio/mp4")}
"""variant -> (file name in the job's artifact dir, media type)."""


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


def variant_file(job_dir: Path, variant: str) -> tuple[Path, str]:
    """(path, media type) of a variant of the job's MP4 in `job_dir`, made now if not cached. KeyError for an
    unknown variant; FileNotFoundError when the MP4 is gone."""
    name, media_type = VARIANTS[variant]
    mp4 = job_dir / VARIANTS["video"][0]
    if not mp4.is_file():
        raise FileNotFoundError(mp4)
    target = job_dir / name
    if variant == "thumbnail" and not target.is_file():
        write_thumbnail(mp4, target)
    elif variant == "audio" and not target.is_file():
        write_audio(mp4, target)
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
        made = (write_thumbnail if variant == "thumbnail" else write_audio)(local, Path(tmp) / name)
        return store.put_file(made, key, media_type), media_type
