"""api/media.py's sprite sheet on MP4s written here with PyAV: the sheet is cols*tile_w x rows*tile_h, each tile
shows the frame sprite_layout picked (tiles differ exactly where those frames differ), and short clips leave the
rest of the grid black; the content route serves it like the other variants."""
from __future__ import annotations

import io
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from h3batch.api import media


def _mp4(path: Path, levels: list[int], width: int = 128, height: int = 64) -> Path:
    """An H.264 MP4 whose frame i is a flat grey of levels[i]."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 24)
        for i, level in enumerate(levels):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), level, np.uint8), format="rgb24")
            frame.pts = i
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return path


def _tiles(sheet: Image.Image, cols: int, rows: int, tile_w: int, tile_h: int) -> list[float]:
    pixels = np.asarray(sheet.convert("L"), dtype=np.float64)
    return [pixels[r * tile_h:(r + 1) * tile_h, c * tile_w:(c + 1) * tile_w].mean()
            for r in range(rows) for c in range(cols)]


def test_a_long_clip_gives_a_4x4_sheet_of_evenly_spaced_frames(tmp_path):
    """107 frames (4 s at 24 fps), grey level 2*i: 16 tiles of 160x80, tile k the middle frame of the k-th share,
    so the tiles differ from each other as the frames do (ascending greys)."""
    levels = [2 * i for i in range(107)]
    target = media.write_spritesheet(_mp4(tmp_path / "clip.mp4", levels), tmp_path / "spritesheet.jpg")
    indices, cols, rows, tile_w, tile_h = media.sprite_layout(107, 128, 64)
    assert (len(indices), cols, rows, tile_w, tile_h) == (16, 4, 4, 160, 80)
    assert indices == sorted(set(indices)) and indices[0] == 3 and indices[-1] == 103  # centred, not the ends
    with Image.open(target) as sheet:
        assert sheet.format == "JPEG" and sheet.size == (cols * tile_w, rows * tile_h)
        means = _tiles(sheet, cols, rows, tile_w, tile_h)
    for mean, index in zip(means, indices):
        assert abs(mean - levels[index]) < 4, (means, indices)
    assert all(b - a > 5 for a, b in zip(means, means[1:])), means  # frames differ, so do their tiles


def test_a_clip_of_few_frames_shows_each_once_and_leaves_the_rest_black(tmp_path):
    """5 frames of 64x128 (portrait): a 3x2 grid of 160x320 tiles, the sixth cell black; two equal frames give
    equal tiles."""
    levels = [200, 200, 60, 120, 250]
    target = media.write_spritesheet(_mp4(tmp_path / "short.mp4", levels, 64, 128), tmp_path / "s.jpg")
    indices, cols, rows, tile_w, tile_h = media.sprite_layout(5, 64, 128)
    assert (indices, cols, rows, tile_w, tile_h) == ([0, 1, 2, 3, 4], 3, 2, 160, 320)
    with Image.open(target) as sheet:
        assert sheet.size == (480, 640)
        means = _tiles(sheet, cols, rows, tile_w, tile_h)
    assert means[0] == pytest.approx(means[1], abs=1) and means[5] < 2, means
    assert [round(m / 10) for m in means[:5]] == [round(v / 10) for v in levels], means


def test_the_content_route_serves_the_sheet_with_head_range_and_etag(scratch_redis, redis_url, tmp_path):
    """GET /v1/videos/{id}/content?variant=spritesheet on a completed job (a real Redis record, the MP4 on disk):
    image/jpeg, cached beside the MP4, the same bytes again; HEAD, Range and If-None-Match as for the other variants;
    an unknown variant is 400 listing spritesheet."""
    from h3batch.api import create_app
    from h3batch.core import jobs
    from h3batch.core.jobs import JobSpec, JobStatus
    from tests.conftest import SCRATCH_DB

    r = scratch_redis
    job = jobs.create_job(r, JobSpec(prompt="grey ramp", seconds=4.0, width=128, height=64, seed=1))
    (tmp_path / job["id"]).mkdir()
    _mp4(tmp_path / job["id"] / "video.mp4", [2 * i for i in range(107)])
    jobs.transition(r, job["id"], JobStatus.IN_PROGRESS, fields={"started_at": time.time()})
    jobs.transition(r, job["id"], JobStatus.COMPLETED, fields={"artifact": f"{job['id']}/video.mp4",
                                                               "expires_at": time.time() + 3600}, record_ttl_s=3600)
    app = create_app({"TESTING": True, "REDIS_URL": f"{redis_url.rsplit('/', 1)[0]}/{SCRATCH_DB}",
                      "ARTIFACTS_DIR": str(tmp_path), "API_KEYS": []})
    http = app.test_client()
    url = f"/v1/videos/{job['id']}/content?variant=spritesheet"
    whole = http.get(url)
    assert whole.status_code == 200 and whole.mimetype == "image/jpeg", whole.get_data()[:300]
    body = whole.get_data()
    assert (tmp_path / job["id"] / "spritesheet.jpg").read_bytes() == body and http.get(url).get_data() == body
    with Image.open(io.BytesIO(body)) as sheet:
        assert sheet.size == (640, 320)
    head = http.head(url)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(body) and not head.get_data()
    assert head.headers["ETag"] == whole.headers["ETag"] and head.headers["Accept-Ranges"] == "bytes"
    part = http.get(url, headers={"Range": "bytes=10-109"})
    assert part.status_code == 206 and part.get_data() == body[10:110]
    assert part.headers["Content-Range"] == f"bytes 10-109/{len(body)}"
    assert http.get(url, headers={"If-None-Match": whole.headers["ETag"]}).status_code == 304
    bad = http.get(f"/v1/videos/{job['id']}/content?variant=gif")
    assert bad.status_code == 400 and "spritesheet" in bad.get_json()["error"]["message"]
