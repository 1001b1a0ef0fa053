"""h3batch.core.geometry: §7 worked examples, request validation and the canvas bucket rule."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from diffusers.modular_pipelines.minimax_h3.modular_pipeline import (
    align_num_frames,
    audio_latent_num_frames,
    resolve_canvas_size,
    video_latent_num_frames,
)

from h3batch.core.geometry import (
    AUDIO_HOP,
    AUDIO_SAMPLE_RATE,
    FPS,
    LATENTS_PER_SECOND,
    TINY_CANVAS,
    V2_CANVAS,
    CanvasProfile,
    GeometryError,
    RequestGeometry,
    bucket_canvas,
    check_canvas_area,
    nearest_canvas,
)

REPO = Path(__file__).resolve().parents[2]

# §7 worked examples: (request, L) → N, T, Hl, Wl, video rows, A, audio rows, S, audio samples.
SPEC_TABLE = [
    (RequestGeometry(1344, 768, 4.4), 30, (107, 32, 48, 84, 32_256, 178, 356, 32_642, 142_400)),
    (RequestGeometry(1344, 768, 5), 30, (124, 37, 48, 84, 37_296, 207, 414, 37_740, 165_600)),
    (RequestGeometry.from_frames(1344, 768, 209), 30, (209, 62, 48, 84, 62_496, 348, 696, 63_222, 278_400)),
    (RequestGeometry(768, 768, 5), 30, (124, 37, 48, 48, 21_312, 207, 414, 21_756, 165_600)),
    (RequestGeometry(768, 1344, 10.125), 30, (243, 72, 84, 48, 72_576, 405, 810, 73_416, 324_000)),
    (RequestGeometry(1344, 768, 15), 30, (362, 107, 48, 84, 107_856, 603, 1_206, 109_092, 482_400)),
    (
        RequestGeometry.from_frames(256, 128, 22, check_duration_window=False),
        12,
        (22, 7, 8, 16, 224, 37, 74, 310, 29_600),
    ),
]


@pytest.mark.parametrize("geometry, text_rows, expected", SPEC_TABLE)
def test_worked_examples_match_spec_table(geometry, text_rows, expected):
    """Every §7 worked-example row derives the listed N, T, Hl×Wl, row counts, S and audio samples."""
    got = (
        geometry.num_frames,
        geometry.latent_frames,
        geometry.latent_height,
        geometry.latent_width,
        geometry.video_rows,
        geometry.audio_latents,
        geometry.audio_rows,
        geometry.sequence_rows(text_rows),
        geometry.audio_samples,
    )
    assert got == expected
    assert (geometry.N, geometry.n, geometry.T, geometry.A) == (
        expected[0],
        (expected[0] - 5) // 17,
        expected[1],
        expected[5],
    )
    assert (geometry.Hl, geometry.Wl) == (expected[2], expected[3])


@pytest.mark.parametrize("geometry, text_rows, expected", SPEC_TABLE)
def test_frame_arithmetic_agrees_with_diffusers(geometry, text_rows, expected):
    """N, T and A agree with the diffusers oracle's align/latent-count helpers."""
    assert geometry.num_frames == align_num_frames(geometry.requested_frames, 17, 5)
    assert geometry.latent_frames == video_latent_num_frames(geometry.num_frames, 17, 5)
    assert geometry.audio_latents == audio_latent_num_frames(geometry.num_frames)


def test_constants():
    """Frame rate, audio rate, hop and latent rate are the spec's values and consistent with each other."""
    assert (FPS, AUDIO_SAMPLE_RATE, AUDIO_HOP, LATENTS_PER_SECOND) == (24, 32000, 800, 40)
    assert AUDIO_SAMPLE_RATE == AUDIO_HOP * LATENTS_PER_SECOND


def test_valid_window_gives_sixteen_frame_counts_with_close_audio():
    """The 4–15 s window yields exactly N ∈ {107, 124, …, 362}, and A/40 stays within 1/80 s of N/24."""
    counts = set()
    for n_req in range(96, 361):
        geometry = RequestGeometry.from_frames(768, 768, n_req)
        counts.add(geometry.num_frames)
        assert abs(geometry.audio_seconds - geometry.video_seconds) < 1 / 80
    assert sorted(counts) == list(range(107, 363, 17))


@pytest.mark.parametrize(
    "seconds, n_req, n_frames",
    [(3.98, 96, 107), (4.0, 96, 107), (4.4, 106, 107), (4.1875, 100, 107), (15.0, 360, 362), (15.02, 360, 362)],
)
def test_durations_accepted(seconds, n_req, n_frames):
    """Durations whose N_req = round(24·s) (half-to-even: 100.5 → 100) is in [96, 360] are accepted."""
    geometry = RequestGeometry(1344, 768, seconds)
    assert (geometry.requested_frames, geometry.num_frames) == (n_req, n_frames)


@pytest.mark.parametrize("seconds", [3.9, 3.97, 15.03, 20, 0.5])
def test_durations_outside_window_rejected(seconds):
    """A duration whose N_req falls outside [96, 360] raises GeometryError naming `seconds` and the window."""
    with pytest.raises(GeometryError, match=r"^seconds: expected a duration of 4 to 15 s .* found") as info:
        RequestGeometry(1344, 768, seconds)
    assert info.value.field == "seconds"
    assert str(seconds) in str(info.value)


@pytest.mark.parametrize("seconds", [0, -5, float("nan"), float("inf"), "5", True, None])
def test_non_numeric_or_non_positive_seconds_rejected(seconds):
    """Seconds must be a positive finite real number; anything else names `seconds`."""
    with pytest.raises(GeometryError, match=r"^seconds: expected a positive finite number"):
        RequestGeometry(1344, 768, seconds)


@pytest.mark.parametrize(
    "width, height, field",
    [
        (1000, 768, "width"),
        (1344, 770, "height"),
        (16, 768, "width"),
        (0, 768, "width"),
        (-32, 768, "width"),
        ("1344", 768, "width"),
        (1344.0, 768, "width"),
        (1344, True, "height"),
    ],
)
def test_bad_canvas_sides_rejected(width, height, field):
    """Width and height must be integer multiples of 32 and at least 32; the error names the side and value."""
    with pytest.raises(GeometryError) as info:
        RequestGeometry(width, height, 5)
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(f"{field}: expected ")
    assert "32" in message and repr(width if field == "width" else height) in message


@pytest.mark.parametrize("width, height", [(4096, 512), (160, 32), (32, 160), (512, 4096)])
def test_extreme_aspect_rejected(width, height):
    """Aspect ratios outside [1/4, 4] raise GeometryError naming `aspect` and the canvas seen."""
    expected = rf"^aspect: expected width/height between 1/4 and 4, found {width}x{height}"
    with pytest.raises(GeometryError, match=expected):
        RequestGeometry(width, height, 5)


@pytest.mark.parametrize("width, height", [(128, 32), (32, 128), (1536, 672), (32, 32)])
def test_aspect_bounds_inclusive(width, height):
    """Aspect exactly 4 or 1/4 (and tiny 32-pixel sides) is accepted."""
    geometry = RequestGeometry(width, height, 5)
    assert (geometry.latent_width, geometry.latent_height) == (width // 16, height // 16)


def test_from_frames_rejects_non_integer_frames():
    """from_frames refuses a non-integer or non-positive frame count, naming `num_frames`."""
    for bad in (0, 10.5, "22"):
        with pytest.raises(GeometryError, match=r"^num_frames: expected a positive integer"):
            RequestGeometry.from_frames(256, 128, bad)


def test_geometry_is_frozen_and_hashable():
    """Equal requests give equal, hashable geometries that cannot be mutated (they key per-request caches)."""
    a, b = RequestGeometry(1344, 768, 5), RequestGeometry(1344, 768, 5)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.width = 768  # type: ignore[misc]


def test_sequence_rows_rejects_negative_text():
    """sequence_rows needs a non-negative integer L."""
    with pytest.raises(GeometryError, match=r"^text_rows"):
        RequestGeometry(768, 768, 5).sequence_rows(-1)


@pytest.mark.parametrize(
    "aspect, canvas",
    [(21 / 9, (1536, 672)), (16 / 9, (1344, 768)), (4 / 3, (1024, 768)), (1.0, (768, 768)),
     (3 / 4, (768, 1024)), (9 / 16, (768, 1344))],
)
def test_bucket_canvas_spec_buckets(aspect, canvas):
    """The bucket rule maps the named aspect ratios to the spec's canvases (width, height)."""
    assert bucket_canvas(aspect) == canvas


def test_bucket_canvas_agrees_with_diffusers():
    """For a sweep of ratios in [1/4, 4] the bucket equals diffusers' resolve_canvas_size (which returns h, w)."""
    for i in range(0, 601):
        ratio = 0.25 + i * (3.75 / 600)
        height, width = resolve_canvas_size(ratio, 1.0, 32, 768, 768 * 1344)
        assert bucket_canvas(ratio) == (width, height), ratio
        RequestGeometry(width, height, 5)  # every bucket is itself a valid canvas


@pytest.mark.parametrize("aspect", [0.2, 4.5, 0, -1, float("nan"), "16:9"])
def test_bucket_canvas_rejects_bad_aspect(aspect):
    """bucket_canvas refuses ratios outside [1/4, 4] or non-numbers with a GeometryError on `aspect`."""
    with pytest.raises(GeometryError, match=r"^aspect: expected"):
        bucket_canvas(aspect)


def test_tiny_budget_buckets_agree_with_diffusers():
    """The bucket rule at the tiny budget (short edge 128, 256·128 pixels) equals diffusers' at that budget."""
    for i in range(0, 121):
        ratio = 0.25 + i * (3.75 / 120)
        height, width = resolve_canvas_size(ratio, 1.0, 32, 128, 256 * 128)
        assert bucket_canvas(ratio, short_edge=128, max_pixels=256 * 128) == (width, height), ratio


@pytest.mark.parametrize("profile, aspect, canvas", [
    (V2_CANVAS, "16:9", (1344, 768)), (V2_CANVAS, "9:16", (768, 1344)), (V2_CANVAS, "1:1", (768, 768)),
    (V2_CANVAS, "4:3", (1024, 768)), (V2_CANVAS, "3:4", (768, 1024)),
    (TINY_CANVAS, "16:9", (224, 128)), (TINY_CANVAS, "9:16", (128, 224)), (TINY_CANVAS, "1:1", (128, 128)),
])
def test_aspect_ratio_picks_the_trained_bucket_at_the_release_budget(profile, aspect, canvas):
    """Each aspect_ratio value maps to its bucket at the profile's pixel budget; without one the default applies."""
    assert profile.resolve(None, None, aspect) == canvas
    assert V2_CANVAS.resolve(None, None) == (1344, 768) and TINY_CANVAS.resolve(None, None) == (256, 128)
    assert V2_CANVAS.resolve(512, None) == (512, 768)  # a side left out takes the default's


@pytest.mark.parametrize("call, field", [
    (lambda: V2_CANVAS.resolve(1344, None, "16:9"), "aspect_ratio"),
    (lambda: V2_CANVAS.bucket("2:1"), "aspect_ratio"),
    (lambda: CanvasProfile(250, 128, 128, 32768), "width"),
    (lambda: CanvasProfile(2048, 1024, 768, 32768), "width x height"),
])
def test_canvas_profile_refusals_name_the_field(call, field):
    """A size with an aspect ratio, an unknown ratio, and an unrenderable default raise GeometryError on the field."""
    with pytest.raises(GeometryError) as err:
        call()
    assert err.value.field == field


def test_area_cap_is_the_models_bucket_area():
    """The request contract refuses canvases over 1344·768 pixels with the API's wording; the bucket area passes."""
    check_canvas_area(1344, 768)
    check_canvas_area(1536, 672)
    with pytest.raises(GeometryError, match=r"^width x height: expected at most 1032192 pixels .*1536x1024 = "):
        check_canvas_area(1536, 1024)


@pytest.mark.parametrize("size, canvas", [((1280, 720), (1280, 736)), ((720, 1280), (736, 1280)),
                                          ((1000, 500), (1024, 512)), ((1024, 576), (1024, 576)),
                                          ((100, 50), (128, 64)), ((20, 20), (32, 32))])
def test_nearest_canvas_keeps_the_aspect(size, canvas):
    """A size off the 32-pixel grid maps to the neighbouring multiples of 32 nearest its aspect ratio."""
    assert nearest_canvas(*size) == canvas
    RequestGeometry(*canvas, 4)


def test_geometry_imports_no_torch_or_numpy():
    """The API process can import h3batch.core.geometry without loading torch or numpy."""
    code = (
        "import sys, h3batch.core.geometry as g; g.RequestGeometry(1344, 768, 5); "
        "bad = [m for m in ('torch', 'numpy') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("width, height, seconds, field", [
    (256, 128, 1e308, "seconds"),  # 24 * 1e308 is inf: round() would raise OverflowError
    (32 * 10**400, 128, 4.0, "width"),  # width / height would overflow a float
    (32 * 10**5000, 32 * 10**5000, 4.0, "width"),  # too many digits for int -> str in a message
], ids=["seconds-1e308", "width-400-digits", "square-5000-digits"])
def test_huge_numbers_are_geometry_errors_not_overflows(width, height, seconds, field):
    """The contract refuses absurd sizes and durations with GeometryError naming the field (CLI, API and worker
    all rely on it), and its message stays short."""
    with pytest.raises(GeometryError) as caught:
        RequestGeometry(width, height, seconds)
    assert caught.value.field == field and len(str(caught.value)) < 200
