"""`h3batch demo` (`make demo`): one job through the real service, end to end, on the tiny release.

Starts the local stack (worker/serve.py `LocalStack`: tiny release under ./var, Redis, worker, API), POSTs a job
over HTTP, shows its progress (stage, step, bar), downloads ./out/demo.mp4, prints the job JSON, and stops
everything it started, also on Ctrl-C or an error. Uses only the stdlib HTTP client, like any outside client would.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core.exceptions import ConfigError
from h3batch.worker.serve import LocalStack, _sigterm_as_interrupt

DEMO_PROMPT = "A red fox trots across fresh snow at dawn; wind hisses and a distant crow calls."
BAR_WIDTH = 30


def _call(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        detail = json.loads(exc.read() or b"{}").get("error", {})
        raise ConfigError(f"{method} {url} answered {exc.code} {detail.get('code')}: {detail.get('message')}") \
            from None


def _progress_line(job: dict) -> str:
    filled = int(round(job["progress"] * BAR_WIDTH))
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    where = f"queue #{job['queue_position']}" if job["status"] == "queued" else job["stage"]
    if job["stage"] == "denoise":
        where += f" {job['step']}/{job['total_steps']}"
    return f"\r[{bar}] {job['progress'] * 100:5.1f}%  {job['status']:<11} {where:<16}"


def _download(url: str, dest: Path) -> int:
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(dest.suffix + ".partial")
    with urllib.request.urlopen(url, timeout=60) as reply, partial.open("wb") as f:
        while chunk := reply.read(1 << 16):
            f.write(chunk)
    os.replace(partial, dest)
    return dest.stat().st_size


def run_demo(stack: LocalStack, out_path: Path, *, seconds: float, width: int, height: int, seed: int) -> dict:
    """POST one job, display its progress until it finishes, download the MP4; returns the final job JSON."""
    job = _call("POST", f"{stack.base_url}/jobs",
                {"prompt": DEMO_PROMPT, "seconds": seconds, "width": width, "height": height, "seed": seed})
    print(f"job {job['id']} queued ({width}x{height}, {seconds} s, seed {seed})", flush=True)
    started = time.monotonic()
    while job["status"] in ("queued", "in_progress"):
        print(_progress_line(job), end="", flush=True)
        time.sleep(0.1)
        stack.check_children()
        job = _call("GET", f"{stack.base_url}/jobs/{job['id']}")
    print(_progress_line(job), flush=True)
    if job["status"] != "completed":
        error = job.get("error") or {}
        raise ConfigError(f"job {job['id']} ended {job['status']}: {error.get('code')}: {error.get('message')}")
    size = _download(stack.base_url + job["links"]["content"], out_path)
    print(f"downloaded {out_path} ({size} bytes) in {time.monotonic() - started:.1f} s", flush=True)
    return job


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch demo", description="One job through API + worker to out/demo.mp4.")
    parser.add_argument("--out", default="out/demo.mp4", help="where to write the MP4 (default out/demo.mp4)")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
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
