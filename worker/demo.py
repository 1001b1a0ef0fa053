"""`h3batch demo` (`make demo`): one job through the real service, end to end, on the tiny release.

Starts the local stack (worker/serve.py `LocalStack`: tiny release under ./var, Redis, worker, API), POSTs a job
over HTTP, shows its progress (the same tqdm bar as `h3batch submit`, client/progress.py), downloads
./out/demo.mp4, prints the job JSON, and stops everything it started, also on Ctrl-C or an error. It talks to the API
through `h3batch.client`, as a Python user would (the demo is the one worker-room module that is an API client).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from h3batch.cli_args import OneLineArgumentParser
from h3batch.client import APIError, Client, H3BatchError
from h3batch.client.progress import JobBar
from h3batch.core.exceptions import ConfigError
from h3batch.worker.serve import LocalStack, stop_on_interrupt_signals

DEMO_PROMPT = "A red fox trots across fresh snow at dawn; wind hisses and a distant crow calls."


def run_demo(stack: LocalStack, out_path: Path, *, seconds: float, width: int, height: int, seed: int) -> dict:
    """POST one job, show its progress until it finishes, download the MP4; returns the final job JSON. Polls every
    0.1 s rather than following the event stream, so a worker that dies mid-job is seen at once (check_children)."""
    with Client(stack.base_url, api_key="") as client:
        try:
            job = client.create(DEMO_PROMPT, seconds=seconds, width=width, height=height, seed=seed)
            print(f"job {job.id} queued ({width}x{height}, {seconds} s, seed {seed})", flush=True)
            started = time.monotonic()
            bar = JobBar(True, job.id, file=sys.stdout)
            while not job.finished:
                bar.show(job.progress, job.stage, job.step, queue_position=job.queue_position)
                time.sleep(0.1)
                stack.check_children()
                job = client.get(job)
            bar.show(job.progress, job.stage, job.step)
            bar.close()
            if job.status.value != "completed":
                error = job.error
                raise ConfigError(f"job {job.id} ended {job.status.value}: {error.code if error else None}: "
                                  f"{error.message if error else None}")
            size = client.download(job, out_path)
        except APIError as exc:
            raise ConfigError(f"the API answered {exc.status} {exc.code}: {exc.message}") from None
        except H3BatchError as exc:
            raise ConfigError(str(exc)) from None
    print(f"downloaded {out_path} ({size} bytes) in {time.monotonic() - started:.1f} s", flush=True)
    return job.model_dump(mode="json")


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch demo", description="One job through API + worker to out/demo.mp4.")
    parser.add_argument("--out", default="out/demo.mp4", help="where to write the MP4 (default out/demo.mp4)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    stop_on_interrupt_signals()
    try:
        with LocalStack() as stack:
            job = run_demo(stack, Path(args.out), seconds=args.seconds, width=args.width, height=args.height,
                           seed=args.seed)
            print(json.dumps(job, indent=2))
    except ConfigError as exc:
        print(f"\nh3batch demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nh3batch demo: interrupted; stopped everything it started", file=sys.stderr)
        return 130
    return 0
