"""`h3batch submit PROMPT [--seconds S --width W --height H --seed N] [--wait] [--out clip.mp4] [--api URL
--api-key KEY]`: send one job to a running h3batch API, show its progress, download the MP4; or
`h3batch submit --file prompts.jsonl --out-dir clips/`: send a file of prompts as one batch (client/cli_batch.py).

Built on `h3batch.client.Client`: progress from the job's event stream, long polls when the stream is refused or
drops, retries with backoff and an Idempotency-Key per create, downloads resumed with Range.
Exit codes (one job): 0 the job completed (and the MP4 was saved when --out was given); 1 the job failed or was
cancelled; 2 bad arguments, a request the API refused, or an API that cannot be reached (one line on stderr).
The batch mode's exit codes are listed in client/cli_batch.py.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from urllib.parse import urlsplit

from h3batch.cli_args import OneLineArgumentParser
from h3batch.client.cli_common import CliError, refusals, writable_file
from h3batch.client.progress import JobBar as Progress
from h3batch.client.sync import Client
from h3batch.settings import raw_value

DEFAULT_API = "http://127.0.0.1:8000"


def api_url(text: str) -> str:
    """--api: an http(s) URL with a host (argparse turns the ValueError into one line and exit 2)."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (raises ValueError for a port that is no number or out of range)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL such as {DEFAULT_API}, found {text!r} ({exc})")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL such as {DEFAULT_API}, found {text!r}")
    return text


def finite_number(text: str) -> float:
    """--seconds: a finite number (nan and inf cannot be sent as JSON)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a number, found {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """--timeout, --poll: a finite number of seconds above 0."""
    value = finite_number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, found {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="h3batch submit", description="Submit a prompt (or a JSONL file of job "
                                   "requests, as one batch) to an h3batch API.")
    parser.add_argument("prompt", nargs="?", default=None, help="what the clip shows and sounds like")
    parser.add_argument("--seconds", type=finite_number, default=None,
                        help="clip length, 4-15 s (server default 4; with --file: for lines without one)")
    parser.add_argument("--width", type=int, default=None, help="canvas width, multiple of 32 (server default)")
    parser.add_argument("--height", type=int, default=None, help="canvas height, multiple of 32 (server default)")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (random when left out)")
    batch = parser.add_argument_group("batch mode (--file)")
    batch.add_argument("--file", type=Path, default=None,
                       help="JSONL, one job request per line ({\"prompt\": ..., optional \"custom_id\"}), sent as "
                            "one batch instead of PROMPT")
    batch.add_argument("--out-dir", type=Path, default=None,
                       help="where the MP4s go (and the resume state, .h3batch-batch.json); needed with --file")
    batch.add_argument("--no-archive", action="store_true",
                       help="download item by item from the results instead of the batch's zip archive")
    batch.add_argument("--on-invalid", choices=("reject", "skip"), default="reject",
                       help="server-side: refuse the whole batch for a bad line (default) or skip the bad lines")
    batch.add_argument("--metadata", default=None, help="JSON object stored on the batch")
    batch.add_argument("--webhook-url", default=None, help="the server POSTs the finished batch here")
    batch.add_argument("--poll", type=positive_seconds, default=1.0, help="seconds between batch status polls (default 1)")
    parser.add_argument("--wait", action="store_true", help="follow the job until it finishes")
    parser.add_argument("--out", type=Path, default=None, help="save the MP4 here (implies --wait)")
    parser.add_argument("--api", type=api_url, default=raw_value("H3BATCH_API_URL") or DEFAULT_API,
                        help=f"API base URL (env H3BATCH_API_URL, default {DEFAULT_API})")
    parser.add_argument("--api-key", default=raw_value("H3BATCH_API_KEY"),
                        help="Bearer key (env H3BATCH_API_KEY)")
    parser.add_argument("--timeout", type=positive_seconds, default=None,
                        help="give up waiting after this many seconds (one job: default 1800; batch: no limit)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (still prints the outcome)")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.file is not None:
        if args.prompt is not None:
            parser.error("give either PROMPT or --file, not both")
        if args.out is not None or args.wait:
            parser.error("--out and --wait are for one prompt; with --file use --out-dir")
        from h3batch.client import cli_batch  # noqa: PLC0415  (the batch flow only when asked for)

        return cli_batch.run(args, parser)
    for name in ("out_dir", "no_archive", "metadata", "webhook_url"):
        if getattr(args, name) not in (None, False):
            parser.error(f"--{name.replace('_', '-')} needs --file")
    if args.prompt is None:
        parser.error("give a PROMPT (or --file prompts.jsonl)")
    if not args.prompt.strip():
        print("h3batch submit: PROMPT: expected a non-empty text", file=sys.stderr)
        return 2
    body: dict = {"prompt": args.prompt}
    for name in ("seconds", "width", "height", "seed"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    client = Client(args.api, args.api_key)
    progress = None
    try:
        if args.out is not None:
            writable_file(args.out, "--out")  # refused here, before a job is made for nothing
        with refusals():
            job = client.create(**body)
        if not (args.wait or args.out):
            print(job.id)
            return 0
        progress = Progress(not args.no_progress, job.id)
        timeout_s = args.timeout or 1800.0
        with refusals():  # a WaitTimeout is one line too: "job ... did not finish within N s (it keeps running ...)"
            job = client.wait(job, timeout_s=timeout_s, raise_on_failure=False, on_event=progress.show_event)
        progress.show(job.progress, job.stage, job.step)
        progress.close()
        if job.status.value != "completed":
            error = job.error
            detail = f"{error.code}: {error.message}" if error else job.cancel_reason or ""
            print(f"h3batch submit: job {job.id} {job.status.value}" + (f" ({detail})" if detail else ""),
                  file=sys.stderr)
            return 1
        if args.out:
            with refusals("download"):
                size = client.download(job, args.out)
            print(f"{job.id} completed seed={job.seed} -> {args.out} ({size} bytes)")
        else:
            print(f"{job.id} completed seed={job.seed}")
        return 0
    except CliError as exc:
        if progress is not None:
            progress.close()
        print(f"h3batch submit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("h3batch submit: interrupted (the job keeps running on the server)", file=sys.stderr)
        return 130
    finally:
        client.close()
