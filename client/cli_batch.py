"""`h3batch submit --file prompts.jsonl --out-dir clips/`: send a JSONL file of job requests as one batch, follow it
with one progress bar, download the MP4s, and pick up where it left off when it is run again.

The file is checked here before anything is sent (JSON per line, an object with a non-empty `prompt`, `custom_id`
usable as a file name and not repeated); the first bad line is one line on stderr and exit 2. The server validates
the rest and a 422 `invalid_batch` is printed one line per bad item, with the file's line numbers.

Resuming: `--out-dir` holds `.h3batch-batch.json` (API base URL, batch id, SHA-256 of the request body, the
Idempotency-Key and the files written with their sizes), written as soon as the batch exists. Running the same
command again re-attaches to that batch instead of creating one; the Idempotency-Key, derived from the body's hash
and the out-dir, is the second guard for an interruption between the POST and the state write (the server answers
the same batch). Files already in the out-dir with the recorded size are not fetched again; a partial archive (or
item) download is continued with a Range request.

Downloads: by default the batch's zip (`GET /batches/{id}/archive`) into `.batch_<id>.zip.partial`, unzipped
member by member into the out-dir (names checked against path traversal), then removed; `--no-archive` fetches each
completed item's `content_url` from `GET /batches/{id}/results` as it finishes (named as in the archive:
`<custom_id>.mp4`, else the zero-padded index, `0002.mp4`) and writes `manifest.jsonl` from the results lines plus
each item's `file`.

Exit codes: 0 every item completed and its MP4 is in the out-dir; 1 the batch finished with at least one item that
did not (failed, cancelled, or expired / deleted on the server before it was fetched), or the batch was cancelled:
the completed items are still saved, and each other item is one line on stderr
(`item INDEX [custom_id]: STATUS (code: message)`), as is a completed item whose file the archive did not deliver
(every completed item's name is checked after unzipping: `item INDEX [custom_id]: completed, but ...`); 2 a bad file or argument, a request the API
refused (a 422 invalid_batch: one line per refused line, with the file's line numbers, then the server's summary),
an unreachable API, or an out-dir that belongs to another batch; 130 interrupted (Ctrl-C or SIGTERM):
the batch keeps running on the server and the same command resumes it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

from h3batch.client.cli_common import BatchRefused, CliError, Gone, detail_text, refusals, writable_dir
from h3batch.client.protocol import partial_path
from h3batch.client.sync import Client
from h3batch.core import jsonl
from h3batch.core.archive_names import member_names

PROG = "h3batch submit"
STATE_NAME = ".h3batch-batch.json"
STATE_VERSION = 1
TERMINAL = frozenset({"completed", "cancelled", "failed", "expired"})
"""Batch statuses after which nothing changes (the contract has completed and cancelled; the others are tolerated)."""
FINISHED_ITEM = ("completed", "failed", "cancelled", "expired")
REQUEST_DEFAULTS = ("seconds", "width", "height", "seed")
"""CLI flags that fill in the same field of every line that does not set it."""
MAX_CUSTOM_ID = 200


# --- the file ---------------------------------------------------------------------------------------------------------

def read_requests(path: Path, defaults: dict[str, Any] | None = None) -> tuple[list[dict], list[int]]:
    """The job requests of a JSONL file and the file line number of each; CliError names the first bad line.

    Blank lines are skipped (numbers still count them); `defaults` fill fields a line leaves out.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CliError(f"--file: cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    requests_: list[dict] = []
    line_numbers: list[int] = []
    seen_ids: dict[str, int] = {}
    for number, line in jsonl.numbered_lines(raw):  # the one line rule the server reads by too (core/jsonl.py)
        where = f"{path.name} line {number}"
        try:
            item = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise CliError(f"{where}: not UTF-8 text") from None
        except ValueError as exc:
            raise CliError(f"{where}: not a JSON line ({exc.msg} at column {exc.colno})") from None
        if not isinstance(item, dict):
            raise CliError(f"{where}: expected a JSON object (a job request), found {type(item).__name__}")
        prompt = item.get("prompt")
        if prompt is None:
            raise CliError(f"{where}: prompt: missing")
        if not isinstance(prompt, str) or not prompt.strip():
            raise CliError(f"{where}: prompt: expected a non-empty text")
        if "custom_id" in item:
            custom_id = item["custom_id"]
            problem = custom_id_problem(custom_id)
            if problem:
                raise CliError(f"{where}: custom_id: {problem}")
            if custom_id in seen_ids:
                raise CliError(f"{where}: custom_id: {custom_id!r} is already used on line {seen_ids[custom_id]}")
            seen_ids[custom_id] = number
        for name, value in (defaults or {}).items():
            item.setdefault(name, value)
        requests_.append(item)
        line_numbers.append(number)
    if not requests_:
        raise CliError(f"--file: {path} holds no job requests")
    return requests_, line_numbers


def custom_id_problem(value: Any) -> str | None:
    """Why `value` cannot name a file in the out-dir, or None when it can."""
    if not isinstance(value, str) or not value:
        return "expected a non-empty text"
    if len(value) > MAX_CUSTOM_ID:
        return f"at most {MAX_CUSTOM_ID} characters"
    if "/" in value or "\\" in value or "\x00" in value or value.startswith(".") or value.strip() != value:
        return "must be usable as a file name (no / or \\, no leading dot or space)"
    return None


def request_body(requests_: list[dict], metadata: dict | None, on_invalid: str,
                 webhook_url: str | None = None) -> dict:
    body: dict[str, Any] = {"requests": requests_, "on_invalid": on_invalid}
    if metadata:
        body["metadata"] = metadata
    if webhook_url:
        body["webhook_url"] = webhook_url
    return body


def body_sha256(body: dict) -> str:
    """Hash of the body as sent (canonical JSON): the same file and flags give the same hash."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def idempotency_key(sha: str, out_dir: Path) -> str:
    """The same file into the same out-dir is the same batch; another out-dir is a new one."""
    where = hashlib.sha256(str(out_dir.resolve()).encode()).hexdigest()[:16]
    return f"h3batch-cli-{sha[:40]}-{where}"


# --- the state file ---------------------------------------------------------------------------------------------------

def load_state(out_dir: Path) -> dict | None:
    path = out_dir / STATE_NAME
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not state.get("batch_id"):
            raise ValueError("not a state file")
    except (OSError, ValueError):
        raise CliError(f"{path} is not a readable h3batch state file; delete it to start a new batch") from None
    state.setdefault("files", {})
    return state


def save_state(out_dir: Path, state: dict) -> None:
    """Atomically: a kill mid-write leaves the previous state, never half a file."""
    path = out_dir / STATE_NAME
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(temp, path)


def have_file(out_dir: Path, state: dict, name: str) -> bool:
    """`name` was written by an earlier run and still has the size it had then."""
    size = state["files"].get(name)
    path = out_dir / name
    return size is not None and path.is_file() and path.stat().st_size == size


# --- naming and unzipping ---------------------------------------------------------------------------------------------

def item_names(results: list[dict]) -> dict[int, str]:
    """File name per item index, as the archive names its members (api/archive_names.py: `<custom_id>.mp4`, else
    the input index zero-padded to at least 4 digits, `0002.mp4`; a name already taken gets `~<index>`)."""
    return member_names((int(r["index"]), r.get("custom_id") or None) for r in results)


def missing_files(results: list[dict], members: list[str], out_dir: Path, state: dict) -> list[str]:
    """One line per completed item whose file the archive did not deliver into out_dir (absent from the zip, the
    zip holding its name twice, or not on disk afterwards): the run must not end as if every clip arrived."""
    names = item_names(results)
    twice = {name for name in members if members.count(name) > 1}
    out = []
    for result in results:
        if result.get("status") != "completed":
            continue
        name = names[int(result["index"])]
        tag = f" [{result['custom_id']}]" if result.get("custom_id") else ""
        if name in twice:
            why = f"the archive holds {name} more than once"
        elif name not in members:
            why = f"{name} is not in the archive"
        elif not have_file(out_dir, state, name):
            why = f"{name} was not written to {out_dir}"
        else:
            continue
        out.append(f"item {result.get('index')}{tag}: completed, but {why}")
    return out


def safe_member(name: str) -> bool:
    """A zip member that lands directly in the out-dir (no folders, no traversal, not our own state file)."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".") and "\x00" not in name


def extract(archive: Path, out_dir: Path, state: dict) -> list[str]:
    """Unzip the members not already present (by recorded size) into out_dir; returns the member names."""
    try:
        with zipfile.ZipFile(archive) as zf:
            names = []
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if not safe_member(info.filename):
                    raise CliError(f"the archive holds an unsafe member name {info.filename!r}; nothing more extracted")
                names.append(info.filename)
                target = out_dir / info.filename
                if have_file(out_dir, state, info.filename) and info.file_size == state["files"][info.filename]:
                    continue
                temp = partial_path(target)
                with zf.open(info) as src, temp.open("wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                os.replace(temp, target)
                state["files"][info.filename] = info.file_size
                save_state(out_dir, state)
            return names
    except zipfile.BadZipFile:
        archive.unlink(missing_ok=True)
        raise CliError(f"the archive of batch {state['batch_id']} is not a valid zip (removed; re-run to fetch "
                       "it again)") from None


# --- progress ---------------------------------------------------------------------------------------------------------

def fmt_eta(eta_s: Any) -> str:
    if not isinstance(eta_s, (int, float)) or eta_s < 0:
        return "?"
    eta_s = int(round(eta_s))
    return f"{eta_s // 60}m{eta_s % 60:02d}s" if eta_s >= 60 else f"{eta_s}s"


def done_count(counts: dict) -> int:
    return sum(int(counts.get(name) or 0) for name in FINISHED_ITEM)


class BatchBar:
    """The one tqdm bar of the batch: items finished / total, the server's ETA and the failure count."""

    def __init__(self, enabled: bool, batch_id: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=0, desc=batch_id[:22], unit="item", file=sys.stderr,
                            bar_format="{desc} {bar} {n_fmt}/{total_fmt} items{postfix}")  # postfix: ", ..."

    def show(self, batch: dict) -> None:
        if self.bar is None:
            return
        counts = batch.get("counts") or {}
        self.bar.total = int(counts.get("total") or 0)
        self.bar.n = done_count(counts)
        parts = [batch.get("status", "")]
        if counts.get("in_progress"):
            parts.append(f"{counts['in_progress']} running")
        if counts.get("failed"):
            parts.append(f"{counts['failed']} failed")
        if batch.get("status") not in TERMINAL:
            parts.append(f"eta {fmt_eta(batch.get('eta_s'))}")
        self.bar.set_postfix_str(" · ".join(p for p in parts if p), refresh=False)
        self.bar.refresh()

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# --- the run ----------------------------------------------------------------------------------------------------------

class Interrupted(BaseException):
    """SIGTERM, handled like Ctrl-C: a BaseException, as KeyboardInterrupt is, so that no library's `except Exception`
    can swallow it. tqdm starts its monitor thread inside one: a SIGTERM that landed there became a warning and the
    CLI kept following the batch (a loaded `make test` saw it, 2026-12-06)."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise Interrupted()


class BatchApi:
    """The batch calls of this flow over `h3batch.client.Client`, answering the wire's plain dicts (the state file,
    the bar and the result lines read its fields) and raising CliError lines (client/cli_common.py)."""

    def __init__(self, client: Client):
        self.client, self.base = client, client.base_url

    def get_batch(self, batch_id: str) -> dict:
        with refusals():
            return self.client.get_batch(batch_id).model_dump(mode="json")

    def create_batch(self, body: dict, idempotency_key: str) -> dict:
        with refusals("batch"):
            return self.client.create_batch(body["requests"], metadata=body.get("metadata"),
                                            on_invalid=body["on_invalid"], webhook_url=body.get("webhook_url"),
                                            idempotency_key=idempotency_key).model_dump(mode="json")

    def batch_results(self, batch: dict) -> list[dict]:
        with refusals():
            return [r.model_dump(mode="json") for r in self.client.batch_results(batch["id"])]

    def fetch_file(self, path: str, out: Path, on_bytes=None, *, trust_partial: bool = False) -> tuple[int, int]:
        try:
            with refusals("download"):
                return self.client.fetch_file(path, out, on_bytes, trust_partial=trust_partial)
        except OSError as exc:
            raise CliError(f"cannot write {out} ({exc.strerror or type(exc).__name__})") from None


def attach_or_create(client: BatchApi, out_dir: Path, body: dict, sha: str) -> tuple[dict, dict, bool]:
    """(batch, state, re-attached): the batch this out-dir already follows, else a new one (state saved at once)."""
    state = load_state(out_dir)
    if state is not None:
        if state.get("api") != client.base or state.get("request_sha256") != sha:
            what = "another API" if state.get("api") != client.base else "another file (or other flags)"
            raise CliError(f"{out_dir} follows batch {state['batch_id']} of {what}; use another --out-dir or delete "
                           f"{out_dir / STATE_NAME}")
        try:
            return client.get_batch(state["batch_id"]), state, True
        except Gone:
            # Deleted or expired on the server: start over, with a key the old batch did not use.
            print(f"{PROG}: batch {state['batch_id']} is gone from the server; submitting the file again",
                  file=sys.stderr)
            key = idempotency_key(sha, out_dir) + "-" + hashlib.sha256(state["batch_id"].encode()).hexdigest()[:8]
            files = state.get("files", {})
    else:
        key, files = idempotency_key(sha, out_dir), {}
    batch = client.create_batch(body, key)
    state = {"version": STATE_VERSION, "api": client.base, "batch_id": batch["id"], "request_sha256": sha,
             "idempotency_key": key, "files": files}
    save_state(out_dir, state)
    return batch, state, False


def follow(client: BatchApi, batch: dict, bar: BatchBar, poll_s: float, timeout_s: float | None,
           on_poll=None) -> dict:
    """GET the batch until it is finished; `on_poll(batch)` runs after each look (item downloads)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        bar.show(batch)
        if on_poll is not None:
            on_poll(batch)
        if batch.get("status") in TERMINAL:
            return batch
        if deadline is not None and time.monotonic() >= deadline:
            raise CliError(f"batch {batch['id']} did not finish within {timeout_s:g} s (it keeps running on the "
                           "server; re-run to resume)")
        time.sleep(poll_s)
        batch = client.get_batch(batch["id"])


class ItemDownloader:
    """--no-archive: fetch each completed item's content_url once it is done (skipping files already here)."""

    def __init__(self, client: BatchApi, out_dir: Path, state: dict, bar: BatchBar):
        self.client, self.out_dir, self.state, self.bar = client, out_dir, state, bar
        self.seen_done = -1
        self.results: list[dict] = []

    def __call__(self, batch: dict) -> None:
        done = int((batch.get("counts") or {}).get("completed") or 0)
        if done == self.seen_done and batch.get("status") not in TERMINAL:
            return
        self.seen_done = done
        self.results = self.client.batch_results(batch)
        names = item_names(self.results)
        for result in self.results:
            if result.get("status") != "completed" or not result.get("content_url"):
                continue
            name = names[int(result["index"])]
            if have_file(self.out_dir, self.state, name):
                continue
            self.bar.note(f"downloading {name}")
            size, _ = self.client.fetch_file(result["content_url"], self.out_dir / name)
            self.state["files"][name] = size
            save_state(self.out_dir, self.state)
        self.bar.show(batch)


def download_archive(client: BatchApi, batch: dict, results: list[dict], out_dir: Path, state: dict,
                     bar: BatchBar) -> tuple[int, int, list[str]]:
    """Fetch (or continue) the archive, unzip what is missing and check every completed item's file arrived.
    Returns (archive bytes, resumed-from byte, one line per completed item whose file did not: missing_files)."""
    done_ids = sorted(r.get("job_id") or "" for r in results if r.get("status") == "completed")
    extracted = state.get("archive")
    if (extracted and extracted.get("job_ids") == done_ids
            and all(have_file(out_dir, state, name) for name in extracted.get("members", []))):
        # an earlier run unzipped this very set of items; every file is still here
        return 0, 0, missing_files(results, extracted.get("members", []), out_dir, state)
    if not done_ids:
        return 0, 0, []
    archive = out_dir / f"{batch['id']}.zip"  # accumulates as .batch_<id>.zip.partial; removed once unzipped
    got = [0]
    partial = partial_path(archive)
    base = partial.stat().st_size if partial.exists() else 0

    def on_bytes(n: int) -> None:
        got[0] += n
        bar.note(f"archive {(base + got[0]) / 1e6:.1f} MB")

    size, resumed_from = client.fetch_file(batch.get("archive_url") or f"/batches/{batch['id']}/archive", archive,
                                           on_bytes, trust_partial=True)
    members = extract(archive, out_dir, state)
    state["archive"] = {"job_ids": done_ids, "members": members}
    save_state(out_dir, state)
    archive.unlink(missing_ok=True)
    return size, resumed_from, missing_files(results, members, out_dir, state)


def write_manifest(out_dir: Path, results: list[dict]) -> None:
    """--no-archive: manifest.jsonl from the results lines, each with the file it was saved as."""
    lines = []
    names = item_names(results)
    for result in results:
        line = dict(result)
        if result.get("status") == "completed":
            line["file"] = names[int(result["index"])]
        lines.append(json.dumps(line, sort_keys=True))
    (out_dir / "manifest.jsonl").write_text("\n".join(lines) + "\n")


def failure_lines(results: list[dict]) -> list[str]:
    out = []
    for result in results:
        if result.get("status") == "completed":
            continue
        error = result.get("error") or {}
        detail = f" ({error.get('code')}: {error.get('message')})" if isinstance(error, dict) and error else ""
        tag = f" [{result['custom_id']}]" if result.get("custom_id") else ""
        out.append(f"item {result.get('index')}{tag}: {result.get('status')}{detail}")
    return out


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The batch flow of `h3batch submit --file`; see the module docstring for the exit codes."""
    if args.out_dir is None:
        parser.error("--file needs --out-dir (where the MP4s and the resume state go)")
    metadata = None
    if args.metadata is not None:
        try:
            metadata = json.loads(args.metadata)
        except ValueError:
            metadata = None
        if not isinstance(metadata, dict):
            parser.error("--metadata: expected a JSON object")
    defaults = {name: getattr(args, name) for name in REQUEST_DEFAULTS if getattr(args, name) is not None}
    out_dir: Path = args.out_dir
    bar = None
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    state = None
    try:
        requests_, line_numbers = read_requests(args.file, defaults)
        if out_dir.exists() and not out_dir.is_dir():
            raise CliError(f"--out-dir: {out_dir} is not a folder")
        writable_dir(out_dir, "--out-dir")  # refused here, before a batch is made for nothing
        body = request_body(requests_, metadata, args.on_invalid, args.webhook_url)
        sha = body_sha256(body)
        client = BatchApi(Client(args.api, args.api_key))
        try:
            batch, state, reattached = attach_or_create(client, out_dir, body, sha)
        except BatchRefused as exc:
            for line in exc.lines:
                print(f"{PROG}: {_file_line(line, args.file, line_numbers)}", file=sys.stderr)
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
        if reattached:
            print(f"{PROG}: resuming batch {batch['id']} ({batch.get('status')})", file=sys.stderr)
        for skipped in batch.get("skipped") or []:
            print(f"{PROG}: skipped {_skipped_text(skipped, args.file, line_numbers)}", file=sys.stderr)
        bar = BatchBar(not args.no_progress, batch["id"])
        downloader = ItemDownloader(client, out_dir, state, bar) if args.no_archive else None
        batch = follow(client, batch, bar, args.poll, args.timeout, downloader)
        missing: list[str] = []
        if downloader is not None:
            results = downloader.results
            write_manifest(out_dir, results)
            note = f"{sum(1 for r in results if r.get('status') == 'completed')} files"
        else:
            results = client.batch_results(batch)
            size, resumed_from, missing = download_archive(client, batch, results, out_dir, state, bar)
            if size:
                note = f"archive {size} bytes" + (f", resumed at byte {resumed_from}" if resumed_from else "")
            elif any(r.get("status") == "completed" for r in results):
                note = "all files already here"
            else:
                note = "nothing to download"
        bar.close()
        failures = failure_lines(results) + missing
        for line in failures:
            print(f"{PROG}: {line}", file=sys.stderr)
        counts = batch.get("counts") or {}
        completed = int(counts.get("completed") or 0)
        print(f"{batch['id']} {batch.get('status')}: {completed}/{counts.get('total', len(results))} items "
              f"completed -> {out_dir} ({note})")
        return 1 if failures or batch.get("status") != "completed" else 0
    except CliError as exc:
        if bar is not None:
            bar.close()
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted):
        if bar is not None:
            bar.close()
        which = f"batch {state['batch_id']} keeps running on the server; " if state else ""
        print(f"{PROG}: interrupted ({which}run the same command again to resume)", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _file_line(detail_line: str, path: Path, line_numbers: list[int]) -> str:
    """`line N: ...` from the server counts the requests sent; name the file's own line instead."""
    head, sep, rest = detail_line.partition(": ")
    if head.startswith("line ") and head[5:].isdigit():
        position = int(head[5:])
        if 1 <= position <= len(line_numbers):
            return f"{path.name} line {line_numbers[position - 1]}: {rest}"
    return f"{path.name} {detail_line}" if sep else detail_line


def _skipped_text(skipped: Any, path: Path, line_numbers: list[int]) -> str:
    if isinstance(skipped, dict):
        line = skipped.get("line")
        text = f"line {line}: {detail_text(skipped)}"
        return _file_line(text, path, line_numbers)
    return str(skipped)
