"""The official `openai` SDK against the live /v1/videos view (real HTTP, real worker, real MP4s)."""
from __future__ import annotations

import io
import time

import av
import numpy as np
import openai
import pytest
import requests
from openai import OpenAI
from PIL import Image

from h3batch.api import media
from h3batch.worker.h3.mp4 import probe_mp4
from tests.api.conftest import KEY_A, KEY_B, auth
from tests.service_stack import REPO

MODEL = "FastVideo/FastVideo-FastH3-8-Step-V2"
# openai warns on every videos call that OpenAI's own Sora API shuts down in 2026; h3batch keeps the format.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")


def client(base: str, key: str = KEY_A) -> OpenAI:
    return OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)


def poll_video(sdk: OpenAI, video_id: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        video = sdk.videos.retrieve(video_id)
        if video.status in ("completed", "failed"):
            return video
        time.sleep(0.1)
    raise AssertionError(f"video {video_id} did not finish in {timeout_s} s")


def test_sdk_full_lifecycle(stack, tmp_path):
    """create (multipart with vLLM-Omni extras) → retrieve → list → download video/thumbnail/audio → delete → 404."""
    sdk = client(stack.base)
    video = sdk.videos.create(model=MODEL, prompt="a lighthouse in fog, foghorn", seconds="4", size="256x128",
                              extra_body={"seed": 1234, "num_inference_steps": 8, "flow_shift": 10,
                                          "guidance_scale": 1})
    assert video.object == "video" and video.status in ("queued", "in_progress")
    assert video.model == MODEL and video.size == "256x128" and video.seconds == "4"
    assert video.progress < 100 and video.remixed_from_video_id is None and video.completed_at is None
    assert isinstance(video.created_at, int)

    done = poll_video(sdk, video.id)
    assert done.status == "completed", done.error
    assert done.progress == 100 and done.completed_at >= done.created_at and done.expires_at > done.completed_at
    extra = done.model_extra
    assert extra["seed"] == 1234 and extra["num_frames"] == 107 and extra["h3batch_status"] == "completed"
    assert set(extra["stage_durations"]) >= {"text_encode", "denoise", "decode", "mux"}

    ids = [v.id for v in sdk.videos.list(limit=1, order="desc")]  # auto-paginates one video per page
    assert video.id in ids and len(ids) == len(set(ids))

    path = tmp_path / "clip.mp4"
    sdk.videos.download_content(video.id).write_to_file(path)
    info = probe_mp4(path)
    assert (info["width"], info["height"], info["frames"]) == (256, 128, 107)
    assert info["audio_codec"] == "aac" and info["channels"] == 2

    thumb = sdk.videos.download_content(video.id, variant="thumbnail").read()
    assert thumb[:8] == b"\x89PNG\r\n\x1a\n"
    with av.open(io.BytesIO(thumb)) as container:
        frame = next(container.decode(video=0))
        assert (frame.width, frame.height) == (256, 128)

    audio = sdk.videos.download_content(video.id, extra_query={"variant": "audio"}).read()
    with av.open(io.BytesIO(audio)) as container:
        stream = container.streams.audio[0]
        assert len(container.streams.video) == 0 and stream.codec_context.name == "aac"
        assert stream.codec_context.channels == 2 and stream.codec_context.sample_rate == 32000
        samples = sum(f.samples for f in container.decode(audio=0))
        assert abs(samples / 32000 - 107 / 24) < 0.1

    deleted = sdk.videos.delete(video.id)
    assert deleted.id == video.id and deleted.deleted is True and deleted.object == "video.deleted"
    with pytest.raises(openai.NotFoundError):
        sdk.videos.retrieve(video.id)


@pytest.mark.parametrize("kwargs, field, code", [
    ({"input_reference": ("ref.png", b"\x89PNG fake", "image/png")}, "input_reference", "unsupported_parameter"),
    ({"extra_body": {"negative_prompt": "blurry"}}, "negative_prompt", "unsupported_parameter"),
    ({"model": "sora-2"}, "model", "model_not_found"),
    ({"extra_body": {"num_inference_steps": 4}}, "num_inference_steps", "unsupported_parameter"),
    ({"extra_body": {"guidance_scale": 5}}, "guidance_scale", "unsupported_parameter"),
    ({"size": "4000x1000"}, "width", "unsupported_size"),  # over the area cap (1000x500 now maps to 1024x512)
    ({"seconds": "2"}, "seconds", "unsupported_duration"),
    ({"extra_body": {"fps": 30}}, "fps", "unsupported_parameter"),
    ({"extra_body": {"colour": "red"}}, "colour", "unsupported_parameter"),
])
def test_sdk_unsupported_fields_are_clear_400s(compat_api, kwargs, field, code):
    """Fields h3batch cannot honour give 400 with the error envelope naming the field (nothing is created)."""
    sdk = client(compat_api.base)
    params = {"prompt": "a dog barking", "size": "256x128", "seconds": "4", **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.videos.create(**params)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["code"] == code and field in error["message"], error
    assert error["retryable"] is False


def test_json_create_cancel_maps_to_failed(stack):
    """A hand-written JSON create works; a cancelled job reads as OpenAI `failed` with error.code `cancelled`."""
    base = stack.base
    reply = requests.post(f"{base}/v1/videos", json={"prompt": "waves", "seconds": 4, "size": "256x128",
                                                      "seed": "5"}, headers=auth(), timeout=60)
    assert reply.status_code == 202, reply.text
    video = reply.json()
    assert video["status"] in ("queued", "in_progress") and reply.headers["openai-poll-after-ms"] == "1000"
    assert requests.post(f"{base}/jobs/{video['id']}/cancel", headers=auth(), timeout=60).status_code == 202
    sdk = client(base)
    done = poll_video(sdk, video["id"], timeout_s=60)
    assert done.status == "failed" and done.error.code == "cancelled"
    assert done.model_extra["h3batch_status"] == "cancelled"
    with pytest.raises(openai.ConflictError) as caught:  # no content for a failed video; SDK told not to retry
        sdk.videos.download_content(video["id"])
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_keys_isolate_videos_and_missing_key_is_401(stack):
    """Bearer keys as on /jobs: no key → 401, another key's video → 404, and list shows only the caller's."""
    with pytest.raises(openai.AuthenticationError):
        client(stack.base, key="not-a-key").videos.list()
    mine = client(stack.base).videos.create(prompt="owned by A", size="256x128", seconds="4")
    with pytest.raises(openai.NotFoundError):
        client(stack.base, key=KEY_B).videos.retrieve(mine.id)
    assert mine.id not in [v.id for v in client(stack.base, key=KEY_B).videos.list()]
    client(stack.base).videos.delete(mine.id)


def test_list_pages_with_after_cursor(stack):
    """`limit` + `after` pages through videos without gaps or duplicates, in `order`."""
    sdk = client(stack.base)
    made = [sdk.videos.create(prompt=f"page {i}", size="256x128", seconds="4").id for i in range(3)]
    try:
        first = sdk.videos.list(limit=2, order="asc")
        raw = requests.get(f"{stack.base}/v1/videos", params={"limit": 2, "order": "asc"}, headers=auth(),
                           timeout=60).json()
        assert raw["object"] == "list" and raw["has_more"] is True and raw["last_id"] == raw["data"][-1]["id"]
        ascending = [v.id for v in first]  # SDK follows `after` to the end
        assert ascending.index(made[0]) < ascending.index(made[1]) < ascending.index(made[2])
        descending = [v.id for v in sdk.videos.list(limit=2, order="desc")]
        assert descending == list(reversed(ascending))
        bad = requests.get(f"{stack.base}/v1/videos", params={"after": "job_nope"}, headers=auth(), timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cursor"
    finally:
        for video_id in made:
            sdk.videos.delete(video_id)


def test_spritesheet_variant_is_a_grid_of_the_clips_frames_with_head_range_and_etag(stack, compat_artifacts):
    """variant=spritesheet (the SDK names it): a JPEG of 4x4 tiles of 160x80 for a 256x128 clip of 107 frames,
    each tile the frame media.sprite_layout picked (tiles differ where those frames differ), stored beside the MP4;
    HEAD, Range and If-None-Match answer as for the other variants; the document and docs/api.md list it."""
    sdk = client(stack.base)
    video = sdk.videos.create(model=MODEL, prompt="waves at dusk", seconds="4", size="256x128")
    video = poll_video(sdk, video.id, timeout_s=600)  # a hang guard: a loaded machine renders slowly
    assert video.status == "completed", video.error
    sheet_bytes = sdk.videos.download_content(video.id, variant="spritesheet").read()
    indices, cols, rows, tile_w, tile_h = media.sprite_layout(107, 256, 128)
    with Image.open(io.BytesIO(sheet_bytes)) as sheet:
        assert sheet.format == "JPEG" and sheet.size == (cols * tile_w, rows * tile_h) == (640, 320)
        pixels = np.asarray(sheet.convert("RGB"), dtype=np.float64)
    tiles = [pixels[s // cols * tile_h:(s // cols + 1) * tile_h, s % cols * tile_w:(s % cols + 1) * tile_w]
             for s in range(len(indices))]
    url = f"{stack.base}/v1/videos/{video.id}/content"
    mp4 = requests.get(url, headers=auth(), timeout=60).content
    with av.open(io.BytesIO(mp4)) as container:
        frames = [f.to_image() for i, f in enumerate(container.decode(video=0)) if i in indices]
    sources = [np.asarray(f.resize((tile_w, tile_h), Image.Resampling.LANCZOS), dtype=np.float64) for f in frames]
    assert len(sources) == len(tiles)

    def far(x, y) -> float:
        return float(np.abs(x - y).mean())

    for a, tile in enumerate(tiles):  # each tile is nearest its own frame; where the frames differ, so do the tiles
        for b, other in enumerate(sources):
            if b != a and far(sources[a], other) > 1:
                assert far(tile, sources[a]) < far(tile, other) and far(tile, tiles[b]) > 1, (a, b)
    assert (compat_artifacts / video.id / "spritesheet.jpg").read_bytes() == sheet_bytes

    variant = {"variant": "spritesheet"}
    head = requests.head(url, params=variant, headers=auth(), timeout=60)
    assert head.status_code == 200 and head.headers["Content-Type"] == "image/jpeg" and not head.content
    assert int(head.headers["Content-Length"]) == len(sheet_bytes) and head.headers["Accept-Ranges"] == "bytes"
    part = requests.get(url, params=variant, headers={**auth(), "Range": "bytes=10-109"}, timeout=60)
    assert part.status_code == 206 and part.content == sheet_bytes[10:110]
    assert part.headers["Content-Range"] == f"bytes 10-109/{len(sheet_bytes)}"
    same = requests.get(url, params=variant, headers={**auth(), "If-None-Match": head.headers["ETag"]}, timeout=60)
    assert same.status_code == 304

    doc = requests.get(f"{stack.base}/openapi.json", timeout=60).json()
    content = doc["paths"]["/v1/videos/{video_id}/content"]["get"]
    assert "spritesheet" in content["parameters"][1]["schema"]["enum"]
    assert "image/jpeg" in content["responses"]["200"]["content"]
    assert "| `variant=spritesheet` | ✓ | `image/jpeg`" in (REPO / "docs" / "api.md").read_text()
