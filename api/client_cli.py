"""`h3batch submit PROMPT [--seconds S --width W --height H --seed N] [--wait] [--out clip.mp4] [--api URL
--api-key KEY]`: send one job to a running h3batch API, show its progress, download the MP4.

Progress comes from the job's server-sent event stream (`GET /jobs/{id}/events`, read with `requests` streaming;
the few lines of SSE parsing are written here because the project has no SSE client dependency and the format is
four line prefixes); if the stream is refused or drops, the client falls back to long-polling `GET /jobs/{id}?wait=`.
Exit codes: 0 the job completed (and the MP4 was saved when --out was given); 1 the job failed or was cancelled;
2 bad arguments, a request the API refused, or an API that cannot be reached (one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from h3batch.cli_args import OneLineArgumentParser
from h3batch.settings import raw_value

TERMINAL = ("completed", "failed", "cancelled", "expired")
DEFAULT_API = "http://127.0.0.1:8000"


class CliError(Exception):
    """One line for stderr; exit code 2."""


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="h3batch submit", description="Submit a prompt to an h3batch API.")
    parser.add_argument("prompt", help="what the clip shows and sounds like")
    parser.add_argument("--seconds", type=float, default=None, help="clip length, 4-15 s (server default 4)")
    parser.add_argument("--width", type=int, default=None, help="canvas width, multiple of 32 (server default)")
    parser.add_argument("--height", type=int, default=None, help="canvas height, multiple of 32 (server default)")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (random when left out)")
    parser.add_argument("--wait", action="store_true", help="follow the job until it finishes")
    parser.add_argument("--out", type=Path, default=None, help="save the MP4 here (implies --wait)")
    parser.add_argument("--api", default=raw_value("H3BATCH_API_URL") or DEFAULT_API,
                        help=f"API base URL (env H3BATCH_API_URL, default {DEFAULT_API})")
    parser.add_argument("--api-key", default=raw_value("H3BATCH_API_KEY"),
                        help="Bearer key (env H3BATCH_API_KEY)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up waiting after this many seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (still prints the outcome)")
    return parser


class Client:
    """The few API calls the CLI makes, with the key and one error shape."""

    def __init__(self, base: str, api_key: str | None):
        self.base = base.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        try:
            return self.session.request(method, self.base + path, timeout=kwargs.pop("timeout", 30), **kwargs)
        except requests.RequestException as exc:
            raise CliError(f"cannot reach the API at {self.base} ({type(exc).__name__})") from None

    @staticmethod
    def _refused(response: requests.Response) -> CliError:
        try:
            error = response.json()["error"]
            return CliError(f"the API refused the request: {error['code']}: {error['message']}")
        except (ValueError, KeyError, TypeError):
            return CliError(f"the API answered HTTP {response.status_code}")

    def create(self, body: dict) -> dict:
        response = self._call("POST", "/jobs", json=body)
        if response.status_code not in (200, 202):
            raise self._refused(response)
        return response.json()

    def get(self, job_id: str, wait_s: int = 0) -> dict:
        response = self._call("GET", f"/jobs/{job_id}" + (f"?wait={wait_s}" if wait_s else ""),
                              timeout=wait_s + 30)
        if response.status_code != 200:
            raise self._refused(response)
        return response.json()

    def events(self, job_id: str, last_id: str | None) -> Iterator[tuple[str, dict, str | None]]:
        """(event, data, id) from the job's SSE stream until it ends; raises CliError if refused."""
        headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_id} if last_id else {})}
        response = self._call("GET", f"/jobs/{job_id}/events", headers=headers, stream=True, timeout=(10, 60))
        if response.status_code != 200:
            raise self._refused(response)
        with response:
            name, data, event_id = "message", [], None
            for line in response.iter_lines(decode_unicode=True):
                if line is None:
                    continue
                if line == "":  # blank line: dispatch
                    if data:
                        yield name, json.loads("\n".join(data)), event_id
                    name, data = "message", []
                    continue
                if line.startswith(":"):
                    continue  # keep-alive comment
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "event":
                    name = value
                elif field == "data":
                    data.append(value)
                elif field == "id":
                    event_id = value

    def download(self, job_id: str, out: Path) -> int:
        response = self._call("GET", f"/jobs/{job_id}/content", stream=True, timeout=(10, 300))
        if response.status_code != 200:
            raise self._refused(response)
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = out.with_name(f".{out.name}.partial")
        size = 0
        with response, temp.open("wb") as f:
            for chunk in response.iter_content(1 << 16):
                f.write(chunk)
                size += len(chunk)
        os.replace(temp, out)
        return size


class Progress:
    """A tqdm bar 0..100 labelled with the stage (or nothing with --no-progress)."""

    def __init__(self, enabled: bool, job_id: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=100, desc=job_id[:16], unit="%", bar_format="{desc} {bar} {n:.0f}% {postfix}",
                            file=sys.stderr)

    def show(self, progress: float | None, stage: str | None, step: int | None = None) -> None:
        if self.bar is None:
            return
        if progress is not None:
            self.bar.n = round(progress * 100, 1)
        if stage:
            self.bar.set_postfix_str(stage + (f" {step}/8" if stage == "denoise" and step else ""), refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def follow(client: Client, job: dict, progress: Progress, timeout_s: float) -> dict:
    """Until the job is finished: SSE first, long-polling if the stream is refused or drops. Returns the job."""
    deadline = time.monotonic() + timeout_s
    last_id = None
    use_stream = True
    while time.monotonic() < deadline:
        if job["status"] in TERMINAL:
            return job
        if use_stream:
            try:
                for name, data, event_id in client.events(job["id"], last_id):
                    last_id = event_id or last_id
                    progress.show(data.get("progress"), data.get("stage"), data.get("step"))
                    if name in TERMINAL:
                        break
                    if time.monotonic() >= deadline:
                        break
            except (CliError, requests.RequestException, ValueError):
                use_stream = False  # refused (e.g. 503 too_many_streams) or dropped: poll instead
        job = client.get(job["id"], wait_s=0 if use_stream else 10)
        progress.show(job.get("progress"), job.get("stage"), job.get("step"))
    raise CliError(f"job {job['id']} did not finish within {timeout_s:g} s (it keeps running on the server)")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
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
        job = client.create(body)
        if not (args.wait or args.out):
            print(job["id"])
            return 0
        progress = Progress(not args.no_progress, job["id"])
        job = follow(client, job, progress, args.timeout)
        progress.close()
        if job["status"] != "completed":
            error = job.get("error") or {}
            detail = f"{error.get('code')}: {error.get('message')}" if error else job.get("cancel_reason") or ""
            print(f"h3batch submit: job {job['id']} {job['status']}" + (f" ({detail})" if detail else ""),
                  file=sys.stderr)
            return 1
        if args.out:
            size = client.download(job["id"], args.out)
            print(f"{job['id']} completed seed={job['seed']} -> {args.out} ({size} bytes)")
        else:
            print(f"{job['id']} completed seed={job['seed']}")
        return 0
    except CliError as exc:
        if progress is not None:
            progress.close()
        print(f"h3batch submit: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("h3batch submit: interrupted (the job keeps running on the server)", file=sys.stderr)
        return 130
