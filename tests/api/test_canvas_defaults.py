"""Real-model canvas defaults at the API (P4.7): the served release's default size, `aspect_ratio` buckets, the shared
area cap, and OpenAI size strings mapped to the nearest canvas, through the Flask app on a real Redis."""
from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from h3batch.api import create_app
from h3batch.api.schemas import AspectRatio, CreateJob
from h3batch.core.geometry import ASPECT_RATIOS


@pytest.fixture
def client_for(redis_url):
    """An app factory per canvas profile, on its own Redis DB; every job it made is deleted afterwards."""
    url = redis_url.rsplit("/", 1)[0] + "/9"
    made: list[tuple[object, str]] = []

    def make(canvas: str):
        client = create_app({"TESTING": True, "REDIS_URL": url, "API_KEYS": [], "CANVAS": canvas}).test_client()

        def post(path: str, **body):
            reply = client.post(path, json={"prompt": "rain on a tin roof", **body})
            if reply.status_code in (200, 202):
                made.append((client, reply.get_json()["id"]))
            return reply
        post.client = client
        return post

    yield make
    for client, job_id in made:
        client.delete(f"/jobs/{job_id}")


def _size(canvas: str, **body) -> tuple[int, int]:
    job = CreateJob.model_validate({"prompt": "x", **body}, context={"canvas": canvas})
    return job.width, job.height


def test_schema_aspect_ratios_are_the_request_contracts():
    """The API's aspect_ratio values are exactly core.geometry.ASPECT_RATIOS."""
    assert set(get_args(AspectRatio)) == set(ASPECT_RATIOS)


@pytest.mark.parametrize("canvas, body, size", [
    ("v2", {}, (1344, 768)), ("tiny", {}, (256, 128)), ("v2", {"width": 768}, (768, 768)),
    ("v2", {"aspect_ratio": "16:9"}, (1344, 768)), ("v2", {"aspect_ratio": "9:16"}, (768, 1344)),
    ("v2", {"aspect_ratio": "1:1"}, (768, 768)), ("v2", {"aspect_ratio": "4:3"}, (1024, 768)),
    ("v2", {"aspect_ratio": "3:4"}, (768, 1024)), ("tiny", {"aspect_ratio": "16:9"}, (224, 128)),
    ("tiny", {"aspect_ratio": "1:1"}, (128, 128)), ("v2", {"width": 512, "height": 256}, (512, 256)),
])
def test_size_comes_from_the_request_else_the_served_release(canvas, body, size):
    """No size: the release's default (1344x768 on V2, 256x128 tiny); aspect_ratio: its bucket at that budget."""
    assert _size(canvas, **body) == size


@pytest.mark.parametrize("body, words", [
    ({"aspect_ratio": "16:9", "width": 1344}, "aspect_ratio: expected either aspect_ratio or width/height"),
    ({"width": 1536, "height": 1024}, "width x height: expected at most 1032192 pixels"),
])
def test_contradictions_and_the_area_cap_are_refused(body, words):
    """aspect_ratio with a size, and a canvas over the model's 1344x768 area, are unsupported_size naming why."""
    with pytest.raises(ValidationError) as err:
        _size("v2", **body)
    first = err.value.errors()[0]
    assert first["type"] == "unsupported_size" and words in first["msg"]


@pytest.mark.parametrize("body", [{"width": None}, {"aspect_ratio": ["16:9"]}, {"aspect_ratio": "2:1"}])
def test_null_sizes_and_unknown_ratios_are_refused_not_defaulted(body):
    """An explicit null size or a malformed aspect_ratio is a validation error, never silently the default."""
    with pytest.raises(ValidationError):
        _size("v2", **body)


def test_native_jobs_take_aspect_ratio_and_the_served_canvas(client_for):
    """POST /jobs on a V2-serving API: no size gives 1344x768, aspect_ratio 9:16 gives 768x1344, a bad one is 400."""
    post = client_for("v2")
    assert (post("/jobs").get_json()["width"], post("/jobs").get_json()["height"]) == (1344, 768)
    job = post("/jobs", aspect_ratio="9:16").get_json()
    assert (job["width"], job["height"]) == (768, 1344)
    reply = post("/jobs", aspect_ratio="2:1")
    assert reply.status_code == 400 and "aspect_ratio" in reply.get_json()["error"]["message"]


@pytest.mark.parametrize("size, rendered", [("1280x720", "1280x736"), ("720x1280", "736x1280"),
                                            ("1024x576", "1024x576")])
def test_openai_size_strings_map_to_the_nearest_canvas_and_report_it(client_for, size, rendered):
    """/v1/videos maps a size that is not in multiples of 32 to the nearest canvas of its aspect; the video says so."""
    post = client_for("v2")
    reply = post("/v1/videos", size=size)
    assert reply.status_code == 202, reply.get_data(as_text=True)
    video = reply.get_json()
    assert video["size"] == rendered
    job = post.client.get(f"/jobs/{video['id']}").get_json()  # the record the worker renders from
    assert f"{job['width']}x{job['height']}" == rendered


def test_openai_without_a_size_gets_the_served_release_default(client_for):
    """/v1/videos with no size renders the served release's default canvas (tiny: 256x128)."""
    assert client_for("tiny")("/v1/videos").get_json()["size"] == "256x128"
    assert client_for("v2")("/v1/videos", aspect_ratio="4:3").get_json()["size"] == "1024x768"
