"""The HTTP side of `h3batch submit`: the few API calls the CLI makes (jobs and batches), with the Bearer key, one
error shape (`CliError`, one line, exit 2) and resumable downloads.

Shared by the single-job flow (api/client_cli.py) and the batch flow (api/client_batch.py), so both speak to the API
the same way. Downloads write `.<name>.partial` beside the target and continue it with `Range: bytes=N-` (guarded by
`If-Range` with the ETag the first response carried), then rename it into place; a server that answers 200 instead of
206 simply sends the whole file again.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests


class CliError(Exception):
    """One line for stderr; exit code 2."""


class BatchRefused(CliError):
    """422 invalid_batch: one line per bad item (`line N: field: message`)."""

    def __init__(self, message: str, lines: list[str]):
        super().__init__(message)
        self.lines = lines


class NotFound(CliError):
    """404 from the API (a batch that was deleted or expired)."""


def detail_text(detail: dict) -> str:
    """`field: message` of one refused line (the server's message often starts with the field already)."""
    field, message = str(detail.get("field") or "body"), str(detail.get("message"))
    return message if message.startswith(field + ":") else f"{field}: {message}"


def partial_path(out: Path) -> Path:
    """Where a download of `out` accumulates until it is complete."""
    return out.with_name(f".{out.name}.partial")


def writable_file(out: Path, flag: str) -> None:
    """CliError naming `flag` unless a file can be written at `out` (its folder made if missing): checked by writing
    and removing a temporary file beside it, so a read-only mount, a missing permission or a path through a file
    is found before any work starts."""
    if out.is_dir():
        raise CliError(f"{flag}: {out} is a folder; name the file to write")
    writable_dir(out.parent, flag)


def writable_dir(folder: Path, flag: str) -> None:
    """CliError naming `flag` unless `folder` exists (or can be made) and a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".h3batch-probe-"):
            pass
    except OSError as exc:
        raise CliError(f"{flag}: cannot write in {folder} ({exc.strerror or type(exc).__name__})") from None


class Client:
    """The few API calls the CLI makes, with the key and one error shape."""

    def __init__(self, base: str, api_key: str | None):
        self.base = base.rstrip("/")
        self.session = requests.Session()
        self.api_key = api_key
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _url(self, path_or_url: str) -> str:
        return urljoin(self.base + "/", path_or_url) if not path_or_url.startswith("/") else self.base + path_or_url

    def _same_origin(self, url: str) -> bool:
        a, b = urlsplit(url), urlsplit(self.base)
        return (a.scheme, a.netloc) == (b.scheme, b.netloc)

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        url = self._url(path)
        if not self._same_origin(url):  # never hand the key to another host a results line might name
            raise CliError(f"refusing to fetch {url}: not on the API's origin {self.base}")
        try:
            return self.session.request(method, url, timeout=kwargs.pop("timeout", 30), **kwargs)
        except requests.RequestException as exc:
            raise CliError(f"cannot reach the API at {self.base} ({type(exc).__name__})") from None

    @staticmethod
    def _refused(response: requests.Response) -> CliError:
        try:
            error = response.json()["error"]
            message = f"the API refused the request: {error['code']}: {error['message']}"
        except (ValueError, KeyError, TypeError):
            message = f"the API answered HTTP {response.status_code}"
        return NotFound(message) if response.status_code == 404 else CliError(message)

    # --- jobs -------------------------------------------------------------------------------------------------------

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
        """The job's MP4 into `out`; returns its size."""
        return self.fetch_file(f"/jobs/{job_id}/content", out)[0]

    # --- batches ----------------------------------------------------------------------------------------------------

    def create_batch(self, body: dict, idempotency_key: str) -> dict:
        """POST /batches (JSON); a 422 invalid_batch raises BatchRefused with one line per bad item."""
        response = self._call("POST", "/batches", json=body, headers={"Idempotency-Key": idempotency_key},
                              timeout=120)
        if response.status_code in (200, 201, 202):
            return response.json()
        if response.status_code == 422:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = None
            if isinstance(error, dict) and isinstance(error.get("details"), list) and error["details"]:
                lines = [f"line {d.get('line', '?')}: {detail_text(d)}" for d in error["details"] if isinstance(d, dict)]
                raise BatchRefused(f"the API refused the batch: {error.get('code')}: {error.get('message')}",
                                   lines)
        raise self._refused(response)

    def get_batch(self, batch_id: str) -> dict:
        response = self._call("GET", f"/batches/{batch_id}")
        if response.status_code != 200:
            raise self._refused(response)
        return response.json()

    def batch_results(self, batch: dict) -> list[dict]:
        """The results lines of a batch, in input order."""
        response = self._call("GET", batch.get("results_url") or f"/batches/{batch['id']}/results", timeout=120)
        if response.status_code != 200:
            raise self._refused(response)
        try:
            return [json.loads(line) for line in response.text.splitlines() if line.strip()]
        except ValueError:
            raise CliError(f"the results of batch {batch['id']} are not JSON lines") from None

    # --- downloads --------------------------------------------------------------------------------------------------

    def fetch_file(self, path: str, out: Path, on_bytes: Callable[[int], None] | None = None, *,
                   trust_partial: bool = False) -> tuple[int, int]:
        """GET `path` into `out`, continuing `.<name>.partial` with a Range request when one is there.

        A partial file is continued only when it can be tied to this resource: its ETag was kept (sent back as
        If-Range, so a changed resource comes whole) or the caller names it uniquely (`trust_partial`, e.g. the
        archive of one batch id). Returns (size, resumed_from): resumed_from is the byte the server's 206 continued
        at (0 for a full download). The file is renamed into place only when its size matches what the server
        announced.
        """
        try:
            return self._fetch_file(path, out, on_bytes, trust_partial)
        except requests.RequestException as exc:  # an OSError too: named before the local-file case below
            raise CliError(f"the download of {path} broke off ({type(exc).__name__}); re-run to continue") from None
        except OSError as exc:
            raise CliError(f"cannot write {out} ({exc.strerror or type(exc).__name__})") from None

    def _fetch_file(self, path: str, out: Path, on_bytes: Callable[[int], None] | None,
                    trust_partial: bool) -> tuple[int, int]:
        out.parent.mkdir(parents=True, exist_ok=True)
        temp = partial_path(out)
        etag_file = temp.with_name(temp.name + ".etag")
        offset = temp.stat().st_size if temp.exists() else 0
        headers = {}
        if offset and (etag_file.exists() or trust_partial):
            headers["Range"] = f"bytes={offset}-"
            if etag_file.exists():
                headers["If-Range"] = etag_file.read_text().strip()
        else:
            offset = 0
        response = self._call("GET", path, headers=headers, stream=True, timeout=(10, 300))
        if response.status_code == 416:  # the partial file is no prefix of this one: start again
            response.close()
            temp.unlink(missing_ok=True)
            return self._fetch_file(path, out, on_bytes, False)  # no partial now: one retry at most
        if response.status_code not in (200, 206):
            raise self._refused(response)
        with response:
            if response.status_code == 206:
                start, total = _content_range(response.headers.get("Content-Range", ""))
                if start != offset:
                    raise CliError(f"the server resumed {path} at byte {start}, not {offset}")
                mode, resumed_from = "ab", offset
            else:
                total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
                mode, resumed_from = "wb", 0
            if response.headers.get("ETag"):
                etag_file.write_text(response.headers["ETag"])
            size = resumed_from
            with temp.open(mode) as f:
                for chunk in response.iter_content(1 << 16):
                    f.write(chunk)
                    size += len(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
        if total is not None and size != total:
            raise CliError(f"download of {path} ended at {size} of {total} bytes (re-run to continue)")
        os.replace(temp, out)
        etag_file.unlink(missing_ok=True)
        return size, resumed_from


def _content_range(value: str) -> tuple[int, int | None]:
    """(first byte, total or None) of `bytes FIRST-LAST/TOTAL`."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        first = int(span.split("-")[0])
        if unit != "bytes":
            raise ValueError(unit)
        return first, (None if total in ("", "*") else int(total))
    except ValueError:
        raise CliError(f"the server answered 206 with a Content-Range I cannot read: {value!r}") from None
