"""Request geometry for FastH3 V2 (spec h3-model.md §7): canvas, frame count and every latent size derived from them.

Pure Python on purpose (stdlib only): the API process imports this module to refuse a bad request at the door, and it
must not pull in torch or numpy to do so (diffusers' `resolve_canvas_size`/`align_num_frames` would drag both in;
the tests check agreement with them). Everything here is integer arithmetic plus the two float roundings the spec
names (`round(24·duration)` and `round(N/24·40)`, both Python's half-to-even `round`, as in the diffusers oracle).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real

FPS = 24
"""Video frame rate; fixed for every request."""
AUDIO_SAMPLE_RATE = 32000
"""Audio VAE output rate in Hz."""
AUDIO_HOP = 800
"""Waveform samples per audio latent (32000 / 40)."""
LATENTS_PER_SECOND = 40
"""Audio latents per second of video."""
AUDIO_CHANNELS = 2
"""Stereo: the packed sequence holds one block of audio rows per channel."""

CANVAS_MULTIPLE = 32
"""Width and height must be multiples of this: 16× VAE downsampling times the 2× spatial patch."""
MIN_ASPECT_RATIO = 1 / 4
MAX_ASPECT_RATIO = 4.0
CANVAS_SHORT_EDGE = 768
"""Default short edge of a bucketed canvas."""
CANVAS_MAX_PIXELS = 768 * 1344
"""Area cap of a bucketed canvas."""
MAX_EDGE = CANVAS_MAX_PIXELS // 32
"""Longest edge that can pass the area cap (the other edge at its 32-pixel minimum): longer ones are refused before
any float arithmetic."""

VAE_FRAMES_PER_CHUNK = 17
"""The video VAE decodes N = 17n + 5 frames from T = 5n + 2 latent frames."""
VAE_FRAME_REMAINDER = 5
MIN_REQUESTED_FRAMES = 4 * FPS
"""Duration window, recommended by the spec: 4 s ≤ N_req/24 ≤ 15 s."""
MAX_REQUESTED_FRAMES = 15 * FPS
VAE_SPATIAL_FACTOR = 16
PATCH_SPATIAL = 2
MAX_TEXT_ROWS = 1024
"""Longest prompt the text encoder reads, in tokens (h3batch policy, FastVideo's training cap; the text encoder
refuses longer ones): the text rows the capacity measure `RequestGeometry.capacity_rows` counts for every request."""


class GeometryError(ValueError):
    """A request's canvas or duration is not one FastH3 V2 can generate; the message names the field."""

    def __init__(self, field_name: str, expected: str, found: str):
        self.field = field_name
        self.expected = expected
        self.found = found  # display text of what arrived
        super().__init__(f"{field_name}: expected {expected}, found {found}")


def shown(value: object, limit: int = 40) -> str:
    """repr(value) cut to `limit` characters, so a 5000-digit number neither fills a message nor hits int->str limits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _check_dimension(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GeometryError(name, f"an integer number of pixels (multiple of {CANVAS_MULTIPLE})", shown(value))
    if value < CANVAS_MULTIPLE or value % CANVAS_MULTIPLE:
        raise GeometryError(name, f"a multiple of {CANVAS_MULTIPLE} that is at least {CANVAS_MULTIPLE}", shown(value))
    if value > MAX_EDGE:  # before any float arithmetic: a 400-digit width would overflow it
        raise GeometryError(name, f"at most {MAX_EDGE} pixels (the 1344x768 area at the {CANVAS_MULTIPLE}-pixel minimum "
                                  "edge)", shown(value))
    return value


def _check_aspect(aspect: float, found: str) -> None:
    if not MIN_ASPECT_RATIO <= aspect <= MAX_ASPECT_RATIO:
        raise GeometryError("aspect", "width/height between 1/4 and 4", found)


def requested_frames(seconds: float) -> int:
    """N_req = round(24·seconds), half-to-even."""
    return round(FPS * seconds)


def aligned_frames(num_frames: int) -> int:
    """Smallest N ≥ num_frames with N mod 17 = 5 (the frame counts the video VAE decodes)."""
    return num_frames + (VAE_FRAME_REMAINDER - num_frames) % VAE_FRAMES_PER_CHUNK


def audio_latent_count(num_frames: int) -> int:
    """A = round(N/24·40): audio latents per channel covering N frames (same float expression as the oracle)."""
    return int(round(num_frames / FPS * LATENTS_PER_SECOND))


@dataclass(frozen=True)
class RequestGeometry:
    """Every size one T2VA request implies, derived from (width, height, seconds) and validated per §7.

    `check_duration_window=False` is for tests and tiny CPU runs only (e.g. the 22-frame example of §7).
    Hashable, so it can key per-request caches (VSA plans).
    """

    width: int
    height: int
    seconds: float
    check_duration_window: bool = field(default=True, kw_only=True)

    requested_frames: int = field(init=False)  # N_req
    num_frames: int = field(init=False)  # N = 17n + 5
    num_chunks: int = field(init=False)  # n
    latent_frames: int = field(init=False)  # T = 5n + 2
    latent_height: int = field(init=False)  # Hl = H/16
    latent_width: int = field(init=False)  # Wl = W/16
    audio_latents: int = field(init=False)  # A, per channel

    def __post_init__(self) -> None:
        width = _check_dimension("width", self.width)
        height = _check_dimension("height", self.height)
        _check_aspect(width / height, f"{width}x{height} ({width / height:.4g})")
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, Real) or not math.isfinite(seconds) or seconds <= 0:
            raise GeometryError("seconds", "a positive finite number of seconds", shown(seconds))
        if not math.isfinite(FPS * float(seconds)):  # round(24 * 1e308) would raise OverflowError
            raise GeometryError("seconds", "a duration of 4 to 15 s", shown(seconds))
        n_req = requested_frames(float(seconds))
        if self.check_duration_window and not MIN_REQUESTED_FRAMES <= n_req <= MAX_REQUESTED_FRAMES:
            raise GeometryError(
                "seconds",
                f"a duration of 4 to 15 s (round(24*seconds) between {MIN_REQUESTED_FRAMES} and "
                f"{MAX_REQUESTED_FRAMES} frames)",
                f"{seconds!r} s = {n_req} frames",
            )
        if n_req < 1:
            raise GeometryError("seconds", "at least one frame (seconds >= 1/48)", repr(seconds))
        n_frames = aligned_frames(n_req)
        n = (n_frames - VAE_FRAME_REMAINDER) // VAE_FRAMES_PER_CHUNK
        derived = {
            "requested_frames": n_req,
            "num_frames": n_frames,
            "num_chunks": n,
            "latent_frames": 5 * n + 2,
            "latent_height": height // VAE_SPATIAL_FACTOR,
            "latent_width": width // VAE_SPATIAL_FACTOR,
            "audio_latents": audio_latent_count(n_frames),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @classmethod
    def from_frames(cls, width: int, height: int, num_frames: int, *, check_duration_window: bool = True):
        """Geometry of a request given as a frame count at 24 fps (N_req = num_frames)."""
        if isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1:
            raise GeometryError("num_frames", "a positive integer", repr(num_frames))
        return cls(width, height, num_frames / FPS, check_duration_window=check_duration_window)

    # Spec notation (§7), for code that follows the formulas.
    @property
    def N(self) -> int:
        return self.num_frames

    @property
    def n(self) -> int:
        return self.num_chunks

    @property
    def T(self) -> int:
        return self.latent_frames

    @property
    def Hl(self) -> int:
        return self.latent_height

    @property
    def Wl(self) -> int:
        return self.latent_width

    @property
    def A(self) -> int:
        return self.audio_latents

    @property
    def patch_grid(self) -> tuple[int, int, int]:
        """(T, Hl/2, Wl/2): the video token grid, rows in raster order t → h → w."""
        return (self.latent_frames, self.latent_height // PATCH_SPATIAL, self.latent_width // PATCH_SPATIAL)

    @property
    def video_rows(self) -> int:
        """T·(Hl/2)·(Wl/2) packed video rows."""
        t, h, w = self.patch_grid
        return t * h * w

    @property
    def audio_rows(self) -> int:
        """2A packed audio rows (left channel, then right)."""
        return AUDIO_CHANNELS * self.audio_latents

    @property
    def audio_samples(self) -> int:
        """Waveform samples per channel after the audio VAE: 800·A."""
        return AUDIO_HOP * self.audio_latents

    @property
    def video_seconds(self) -> float:
        return self.num_frames / FPS

    @property
    def audio_seconds(self) -> float:
        return self.audio_latents / LATENTS_PER_SECOND

    def sequence_rows(self, text_rows: int) -> int:
        """S = L + 2A + video rows for a prompt of `text_rows` (L) tokens."""
        if isinstance(text_rows, bool) or not isinstance(text_rows, int) or text_rows < 0:
            raise GeometryError("text_rows", "a non-negative integer token count", repr(text_rows))
        return text_rows + self.audio_rows + self.video_rows

    @property
    def capacity_rows(self) -> int:
        """The rows a worker must be able to serve for this request: `sequence_rows(MAX_TEXT_ROWS)`, i.e. video and
        audio rows plus the longest prompt the text encoder reads. The API does not tokenize, so it counts every
        request at the longest prompt; this is the measure of `max_rows` in worker heartbeats and of 422
        `exceeds_worker_capacity`."""
        return self.sequence_rows(MAX_TEXT_ROWS)


def bucket_canvas(aspect: float, *, short_edge: int = CANVAS_SHORT_EDGE,
                  max_pixels: int = CANVAS_MAX_PIXELS) -> tuple[int, int]:
    """Default canvas (width, height) for an aspect ratio width/height (§7 bucket rule).

    Short edge 768; the area is capped at 768·1344 keeping the ratio; each side is then rounded to the nearest
    multiple of 32 (half-to-even, minimum 32). 16/9 → (1344, 768), 1 → (768, 768), 21/9 → (1536, 672).
    `short_edge` / `max_pixels` scale the same rule to another release's pixel budget (the tiny one's).
    """
    if isinstance(aspect, bool) or not isinstance(aspect, Real) or not math.isfinite(aspect) or aspect <= 0:
        raise GeometryError("aspect", "a positive finite width/height ratio", repr(aspect))
    ratio = float(aspect)
    _check_aspect(ratio, repr(ratio))
    if ratio >= 1.0:
        width, height = short_edge * ratio, float(short_edge)
    else:
        width, height = float(short_edge), short_edge / ratio
    area = width * height
    if area > max_pixels:
        scale = math.sqrt(max_pixels / area)
        width, height = width * scale, height * scale
    return (
        max(CANVAS_MULTIPLE, round(width / CANVAS_MULTIPLE) * CANVAS_MULTIPLE),
        max(CANVAS_MULTIPLE, round(height / CANVAS_MULTIPLE) * CANVAS_MULTIPLE),
    )


# --- the request contract's canvas rules, shared by the API, `h3batch render` and the pipeline ---

MAX_CANVAS_PIXELS = CANVAS_MAX_PIXELS
"""Largest canvas area any request may ask for: the model's bucket area (1344x768). Larger would only OOM workers."""

ASPECT_RATIOS: dict[str, float] = {"16:9": 16 / 9, "9:16": 9 / 16, "1:1": 1.0, "4:3": 4 / 3, "3:4": 3 / 4}
"""The `aspect_ratio` values a request may give instead of a size; each picks the trained bucket at the release's
pixel budget (`CanvasProfile.bucket`)."""


def check_canvas_area(width: int, height: int, max_pixels: int = MAX_CANVAS_PIXELS) -> None:
    """GeometryError on `width x height` when the canvas is larger than the model's bucket area."""
    if width * height > max_pixels:
        raise GeometryError("width x height", f"at most {max_pixels} pixels (the model's 1344x768 area)",
                            f"{width}x{height} = {width * height}")


@dataclass(frozen=True)
class CanvasProfile:
    """A release's canvas facts: the size a request without one renders, and the pixel budget of its buckets."""

    default_width: int
    default_height: int
    short_edge: int
    max_pixels: int

    def __post_init__(self) -> None:
        RequestGeometry(self.default_width, self.default_height, 4.0)  # a default must itself be renderable
        check_canvas_area(self.default_width, self.default_height)
        for name in ("short_edge", "max_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < CANVAS_MULTIPLE:
                raise GeometryError(name, f"an integer of at least {CANVAS_MULTIPLE}", repr(value))

    @property
    def default(self) -> tuple[int, int]:
        return self.default_width, self.default_height

    def bucket(self, aspect_ratio: str) -> tuple[int, int]:
        """The trained bucket (width, height) of one of `ASPECT_RATIOS` at this release's pixel budget."""
        if aspect_ratio not in ASPECT_RATIOS:
            raise GeometryError("aspect_ratio", f"one of {', '.join(ASPECT_RATIOS)}", repr(aspect_ratio))
        return bucket_canvas(ASPECT_RATIOS[aspect_ratio], short_edge=self.short_edge, max_pixels=self.max_pixels)

    def resolve(self, width: int | None, height: int | None, aspect_ratio: str | None = None) -> tuple[int, int]:
        """The canvas a request renders: its own size, else its aspect ratio's bucket, else the default. A side left
        out takes the default's; `aspect_ratio` together with a size is refused (GeometryError on aspect_ratio)."""
        if aspect_ratio is not None:
            if width is not None or height is not None:
                raise GeometryError("aspect_ratio", "either aspect_ratio or width/height, not both",
                                    f"aspect_ratio={aspect_ratio!r} with width={width!r}, height={height!r}")
            return self.bucket(aspect_ratio)
        return (self.default_width if width is None else width, self.default_height if height is None else height)

    def as_json(self) -> dict[str, int]:
        return {"default_width": self.default_width, "default_height": self.default_height,
                "short_edge": self.short_edge, "max_pixels": self.max_pixels}


V2_CANVAS = CanvasProfile(1344, 768, CANVAS_SHORT_EDGE, CANVAS_MAX_PIXELS)
"""FastH3 V2 (the 33B shapes): 1344x768 by default, §7 buckets at 768·1344 pixels."""
TINY_CANVAS = CanvasProfile(256, 128, 128, 256 * 128)
"""The tiny CPU release (recorded by `h3batch build-tiny`): 256x128 by default, buckets at 256·128 pixels."""
CANVAS_PROFILES = {"v2": V2_CANVAS, "tiny": TINY_CANVAS}
"""By name, for H3BATCH_CANVAS (the API does not load the release, so it is told which one the workers serve)."""


def nearest_canvas(width: int, height: int) -> tuple[int, int]:
    """The canvas nearest a size that is not in multiples of 32 (an OpenAI `size` such as 1280x720), keeping its
    aspect: each side rounded down or up to a multiple of 32 (min 32), the combination whose aspect ratio is closest
    to the request's (ties: the smaller area). 1280x720 → 1280x736, 720x1280 → 736x1280."""
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GeometryError(name, "a positive integer number of pixels", repr(value))
    target = math.log(width / height)

    def sides(value: int) -> set[int]:
        low = max(CANVAS_MULTIPLE, value // CANVAS_MULTIPLE * CANVAS_MULTIPLE)
        return {low, low + CANVAS_MULTIPLE} if value % CANVAS_MULTIPLE else {value}

    candidates = [(w, h) for w in sides(width) for h in sides(height)]
    return min(candidates, key=lambda c: (round(abs(math.log(c[0] / c[1]) - target), 12), c[0] * c[1]))


CONTRACT_MAX_ROWS = RequestGeometry(1344, 768, MAX_REQUESTED_FRAMES / FPS).capacity_rows
"""`capacity_rows` of the largest request the contract allows: 15 s at the 1344x768 area cap (every allowed canvas
has at most that area, and video rows grow with area only), with the longest prompt. 110,086 rows; a worker without
a memory plan or H3BATCH_MAX_ROWS advertises this (worker/capacity.py)."""
