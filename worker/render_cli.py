"""`h3batch render`: one prompt to one MP4 on this machine, with a progress bar per step and a JSON summary line.

`--task fl2va` (with `--first-frame` and/or `--last-frame`) and `--task ref2va` (with one `--reference` per image)
need a native MiniMax-H3 release (`h3batch build-tiny --kind native`); t2va is the default on every release.

Exit 0 on success (the last stdout line is the JSON summary), 2 with one line on stderr for bad input (empty prompt,
unsupported size or duration, missing or invalid release, a Hub release the cache or Hub cannot serve), 1 for an
unexpected failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core.geometry import ASPECT_RATIOS
from h3batch.settings import Settings, env_value

DEFAULT_RELEASE = str(env_value("H3BATCH_RELEASE") or Settings().release_dir)
"""--release when left out: $H3BATCH_RELEASE, else the settings' path `var/tiny-release` (relative to the cwd)."""


def _parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="h3batch render", description=__doc__.splitlines()[0])
    p.add_argument("--release", default=None,
                   help="release directory, or Hub repo org/name[@revision] / hf://org/name@revision "
                        f"(default: {DEFAULT_RELEASE})")
    p.add_argument("--prompt", required=True, help="text prompt, used verbatim")
    p.add_argument("--seconds", type=float, default=None,
                   help="duration, 4-15 s (5-15 s on the native release; default: the shortest the release renders)")
    p.add_argument("--task", default="t2va", choices=("t2va", "fl2va", "ref2va"),
                   help="t2va (text only, default), fl2va (keyframes) or ref2va (reference images); "
                        "fl2va and ref2va need a native MiniMax-H3 release")
    p.add_argument("--first-frame", default=None, metavar="IMAGE", help="fl2va: the image the clip starts from")
    p.add_argument("--last-frame", default=None, metavar="IMAGE", help="fl2va: the image the clip ends on")
    p.add_argument("--reference", action="append", default=[], metavar="IMAGE",
                   help="ref2va: a reference image (repeat, up to 9, in the order the prompt reads them)")
    p.add_argument("--width", type=int, default=None,
                   help="multiple of 32 (default: the release's canvas: 1344x768 for V2, 256x128 for the tiny one)")
    p.add_argument("--height", type=int, default=None, help="multiple of 32 (default: the release's canvas)")
    p.add_argument("--aspect-ratio", default=None, choices=sorted(ASPECT_RATIOS),
                   help="instead of a size: the release's trained bucket for this aspect")
    p.add_argument("--seed", type=int, default=0, help="RNG key for the noise (default: %(default)s)")
    p.add_argument("--out", required=True, help="output .mp4 path")
    p.add_argument("--hf-cache", default=None,
                   help="Hugging Face cache holding the base VAEs (default: $HF_HUB_CACHE, else <release>/../hf-cache)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--ranks", default=None,
                   help="sequence-parallel ranks: N processes, one device each (cuda:0..N-1, or gloo on cpu); "
                        "'auto' = every visible GPU (default: $H3BATCH_RANKS, else 1)")
    p.add_argument("--text-placement", default=None, choices=("auto", "resident", "offload", "stream"),
                   help="where the text encoder lives between prompts (default: $H3BATCH_TEXT_ENCODER_PLACEMENT, "
                        "else auto: the memory plan's choice; docs/performance.md)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _fail(message: str) -> int:
    print(f"h3batch render: {message}", file=sys.stderr)
    return 2


def _check_images(task: str, images: dict) -> str | None:
    """The one-line problem with the task's image flags (the wrong flags for the task, a missing one, a file that is
    not an image), or None."""
    flags = {"first_frame": "--first-frame", "last_frame": "--last-frame", "references": "--reference"}
    wanted = {"t2va": (), "fl2va": ("first_frame", "last_frame"), "ref2va": ("references",)}[task]
    for name, value in images.items():
        if value and name not in wanted:
            return f"{flags[name]}: not an input of --task {task}"
    if wanted and not any(images[name] for name in wanted):
        return f"--task {task}: expected {' and/or '.join(flags[n] for n in wanted)}"
    if len(images["references"]) > 9:
        return f"--reference: expected at most 9 images, got {len(images['references'])}"
    from PIL import Image, UnidentifiedImageError

    for name, value in images.items():
        for path in (value if isinstance(value, tuple) else (value,) if value else ()):
            try:
                with Image.open(path) as image:
                    image.verify()
            except FileNotFoundError:
                return f"{flags[name]}: no such file {path!r}"
            except (OSError, UnidentifiedImageError, ValueError) as err:
                return f"{flags[name]}: {path!r} is not an image ({type(err).__name__})"
    return None


def resolve_hf_cache(release: Path | None, explicit: str | None) -> str | None:
    """Explicit flag, else $HF_HUB_CACHE, else the sibling `hf-cache` that `build-tiny` writes when it exists
    (`release` None, a Hub release: huggingface_hub's default cache)."""
    if explicit:
        return explicit
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if release is None:
        return None
    sibling = release.resolve().parent / "hf-cache"
    return str(sibling) if sibling.is_dir() else None


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from h3batch.worker.h3.release_ref import ReleaseRef, ReleaseRefError, parse_release_ref
    try:
        if args.release is None and not env_value("H3BATCH_RELEASE"):
            # The built-in default is a path (`var/tiny-release`), which also reads as a Hub id `org/name`: outside
            # the checkout it must be reported missing, never looked up on the Hub (issue 30).
            ref = ReleaseRef(DEFAULT_RELEASE, directory=Path(DEFAULT_RELEASE))
        else:
            ref = parse_release_ref(args.release or DEFAULT_RELEASE)
    except ReleaseRefError as err:
        return _fail(str(err))
    if not ref.is_hub and not ref.directory.is_dir():
        default = " (the default; pass --release DIR or org/name@revision)" if args.release is None else ""
        return _fail(f"release directory {str(ref.directory)!r} does not exist in {os.getcwd()}{default} "
                     f"(build one: h3batch build-tiny --out DIR)")
    if not args.prompt.strip():
        return _fail("--prompt: expected a non-empty prompt")
    out = Path(args.out)
    if out.suffix.lower() != ".mp4":
        return _fail(f"--out: expected a .mp4 path, got {str(out)!r}")
    if not out.parent.exists():
        return _fail(f"--out: directory {str(out.parent)!r} does not exist")

    images = {"first_frame": args.first_frame, "last_frame": args.last_frame, "references": tuple(args.reference)}
    problem = _check_images(args.task, images)
    if problem:
        return _fail(problem)

    # Heavy imports after argument checks so bad input answers at once.
    from h3batch.core.geometry import V2_CANVAS, GeometryError, RequestGeometry, check_canvas_area
    try:  # a full size (or an aspect ratio) is checked before loading; a half one once the release's canvas is known
        if args.aspect_ratio is not None or None not in (args.width, args.height):
            width, height = V2_CANVAS.resolve(args.width, args.height, args.aspect_ratio)
            RequestGeometry(width, height, args.seconds or 5.0)
            check_canvas_area(width, height)
        else:  # the side given (if any) and the duration window
            side = args.width if args.width is not None else args.height
            RequestGeometry(256 if side is None else side, 256 if side is None else side, args.seconds or 5.0)
    except GeometryError as err:
        return _fail(str(err))

    from tqdm import tqdm

    from h3batch.worker.pipeline import NATIVE_MIN_SECONDS, RenderRequest
    from h3batch.worker.rank_group import RANKS_ENV, RankGroupError, load_pipeline, ranks_from_env

    try:
        ranks = ranks_from_env({RANKS_ENV: args.ranks} if args.ranks is not None else None)
    except ValueError as err:
        return _fail(str(err).replace(RANKS_ENV, "--ranks") if args.ranks is not None else str(err))

    started = time.perf_counter()
    try:
        pipe = load_pipeline(args.release or DEFAULT_RELEASE, ranks=ranks, device=args.device,
                             hf_cache=resolve_hf_cache(ref.directory, args.hf_cache),
                             require_pinned_base=bool(env_value("H3BATCH_REQUIRE_PINNED_BASE")),
                             text_placement=args.text_placement or env_value("H3BATCH_TEXT_ENCODER_PLACEMENT")
                             or "auto")
    except ValueError as err:  # contract, provenance and loader errors all name the field or key
        return _fail(str(err).splitlines()[0])
    except RankGroupError as err:
        print(f"h3batch render: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    load_s = time.perf_counter() - started

    try:
        width, height = pipe.canvas.resolve(args.width, args.height, args.aspect_ratio)
        seconds = args.seconds if args.seconds is not None else (
            NATIVE_MIN_SECONDS if getattr(pipe, "release_kind", "v2") == "native" else 4.0)
        req = RenderRequest(args.prompt, seconds, width, height, args.seed, task=args.task, **images)
        pipe.validate(req)
    except ValueError as err:  # GeometryError too
        pipe.close()
        return _fail(str(err).splitlines()[0])

    steps = getattr(getattr(pipe, "ladder", None), "num_steps", 8)
    bar = None if args.no_progress else tqdm(total=steps, desc="denoise", unit="step", file=sys.stderr)

    def on_progress(stage: str, step: int, total: int) -> None:
        if bar is None:
            return
        bar.set_description(stage, refresh=False)
        if stage == "denoise":
            bar.update(step - bar.n)
        else:
            bar.refresh()

    try:
        result = pipe.render(req, out, on_progress=on_progress)
    except ValueError as err:
        return _fail(str(err).splitlines()[0])
    except RankGroupError as err:
        print(f"h3batch render: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        if bar is not None:
            bar.close()
        pipe.close()
    summary = {
        "out": str(result.path), "release": pipe.release_id, "seed": result.seed, "frames": result.frames,
        "width": result.width, "height": result.height, "seconds": round(result.seconds, 4),
        "tokens": result.tokens, "timings": {"load": round(load_s, 3), **{k: round(v, 3) for k, v in
                                                                        result.timings.items()}},
        "device": str(pipe.device), "ranks": ranks,
    }
    plan = getattr(pipe, "memory_plan", None)
    if plan is not None:
        summary.update(text_encoder_placement=plan.placement, max_rows=plan.max_rows)
    print(json.dumps(summary))
    return 0
