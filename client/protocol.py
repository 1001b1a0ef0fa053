"""What the sync and async clients share, without I/O: the retry rule and its delays, the Idempotency-Key, answers
turned into models or exceptions, request bodies, and the byte bookkeeping of a resumable download.

Written here because no library in the lock does these for this API: httpx2 retries only failed connects (not a
429/503 with Retry-After, nor a POST whose answer was lost), and a download that continues a `.partial` file with
`Range` + `If-Range` and checks `Content-Range` against the bytes on disk is a few lines over httpx2's stream.
"""
from __future__ import annotations

import email.utils
import json
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from h3batch.client.errors import APIError, DownloadError, IdempotencyKeyInUse, api_error
from h3batch.core import jsonl

RETRY_STATUSES = frozenset({429, 502, 503, 504})
"""Answers worth another try after a pause: rate limits, a full queue, an unavailable store, a proxy in between."""
TERMINAL_EVENTS = frozenset({"completed", "failed", "cancelled"})
"""Event names after which the server ends a job's event stream."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry. `attempts` counts the first try; the n-th pause is `backoff_s * 2**n`
    with ±25 % jitter, capped at `max_backoff_s`, or the server's Retry-After when it sent one (capped at
    `max_retry_after_s`, beyond which the error is raised: a 30 s `queue_full` is the caller's decision)."""

    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0

    def delay(self, retry_number: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return retry_after
        pause = min(self.max_backoff_s, self.backoff_s * 2 ** retry_number)
        return pause * random.uniform(0.75, 1.25)


NO_RETRIES = RetryPolicy(attempts=1)


def retry_after_s(headers: httpx2.Headers) -> float | None:
    """Seconds the Retry-After header asks for (delta-seconds or an HTTP date), None without one."""
    value = headers.get("Retry-After")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def should_retry(error: Exception, policy: RetryPolicy, retry_number: int) -> float | None:
    """The pause before retry `retry_number` (0-based) after `error`, or None when it is not worth one: a network
    failure, a RETRY_STATUSES answer, or 409 idempotency_key_in_use (the first create is still being handled)."""
    if retry_number + 1 >= policy.attempts:
        return None
    if isinstance(error, httpx2.TransportError):
        return policy.delay(retry_number, None)
    if isinstance(error, APIError) and (error.status in RETRY_STATUSES or isinstance(error, IdempotencyKeyInUse)):
        if error.retry_after is not None and error.retry_after > policy.max_retry_after_s:
            return None
        return policy.delay(retry_number, error.retry_after)
    return None


def new_idempotency_key() -> str:
    """One per create call, sent again on each of its retries: the server replays the first answer instead of
    making a second job (docs/api.md "Idempotency")."""
    return f"h3batch-client-{uuid.uuid4().hex}"


def raise_for_error(response: httpx2.Response) -> None:
    """The APIError subclass for a 4xx/5xx answer (the body must have been read)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    raise api_error(response.status_code, body, retry_after_s(response.headers))


def usage_params(from_: Any, to: Any) -> dict[str, str]:
    """GET /usage's query: each end as the server reads it, a datetime or date as ISO-8601 (a naive datetime is
    UTC there), a number as Unix seconds, a string as it is; None leaves the server's default."""
    params = {}
    for name, value in (("from", from_), ("to", to)):
        if value is None:
            continue
        if hasattr(value, "isoformat"):
            params[name] = value.isoformat()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            params[name] = f"{value:.6f}".rstrip("0").rstrip(".")
        else:
            params[name] = str(value)
    return params


def job_body(prompt: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A POST /jobs body: the prompt and every field given (None means 'server default', so it is left out)."""
    return {"prompt": prompt, **{name: value for name, value in fields.items() if value is not None}}


def batch_body(requests: Iterable[dict[str, Any]], metadata: dict | None, on_invalid: str,
               webhook_url: str | None) -> dict[str, Any]:
    """A POST /batches body from job requests (each a /jobs body, optionally with `custom_id`)."""
    body: dict[str, Any] = {"requests": list(requests), "on_invalid": on_invalid}
    if metadata:
        body["metadata"] = metadata
    if webhook_url:
        body["webhook_url"] = webhook_url
    return body


class BatchFileError(ValueError):
    """A JSONL file of job requests that cannot be sent; the message names the file's line."""


def read_requests(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """The job requests of a JSONL file (one JSON object per line; blank lines skipped) and each one's line number,
    cut by the same line rule the server uses (core/jsonl.py). BatchFileError names the first line that is no JSON
    object; the fields are left to the server, which names each bad one by line."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BatchFileError(f"cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    found, numbers = [], []
    for number, line in jsonl.numbered_lines(raw):
        where = f"{path.name} line {number}"
        try:
            item = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise BatchFileError(f"{where}: not UTF-8 text") from None
        except ValueError as exc:
            raise BatchFileError(f"{where}: not a JSON line ({exc.msg} at column {exc.colno})") from None
        if not isinstance(item, dict):
            raise BatchFileError(f"{where}: expected a JSON object (a job request), found {type(item).__name__}")
        found.append(item)
        numbers.append(number)
    if not found:
        raise BatchFileError(f"{path} holds no job requests")
    return found, numbers


# --- resumable downloads -----------------------------------------------------------------------------------------

def partial_path(out: Path) -> Path:
    """Where a download of `out` accumulates until it is complete."""
    return out.with_name(f".{out.name}.partial")


def etag_path(out: Path) -> Path:
    """Beside the partial file: the ETag of the resource it is a prefix of (sent back as If-Range)."""
    temp = partial_path(out)
    return temp.with_name(temp.name + ".etag")


def resume_headers(out: Path, trust_partial: bool) -> tuple[dict[str, str], int]:
    """(headers, offset) for the next GET of `out`: `Range: bytes=N-` when a partial file can be tied to the
    resource (its ETag was kept, or the caller names the resource uniquely: `trust_partial`), else none and 0."""
    temp, etag = partial_path(out), etag_path(out)
    offset = temp.stat().st_size if temp.exists() else 0
    if not offset or not (etag.exists() or trust_partial):
        return {}, 0
    headers = {"Range": f"bytes={offset}-"}
    if etag.exists():
        headers["If-Range"] = etag.read_text().strip()
    return headers, offset


def content_range(value: str) -> tuple[int, int | None]:
    """(first byte, total or None) of `bytes FIRST-LAST/TOTAL` (RFC 9110 14.4)."""
    try:
        unit, _, rest = value.partition(" ")
        span, _, total = rest.partition("/")
        first = int(span.split("-")[0])
        if unit != "bytes":
            raise ValueError(unit)
        return first, (None if total in ("", "*") else int(total))
    except ValueError:
        raise DownloadError(f"the server answered 206 with a Content-Range I cannot read: {value!r}") from None


def body_plan(response: httpx2.Response, offset: int, what: str) -> tuple[str, int, int | None]:
    """(file mode, resumed-from byte, total size or None) for writing a 200/206 answer over the partial file.
    Any other answer (a redirect left unfollowed, a 204) is refused: its body is no video."""
    if response.status_code not in (200, 206):
        raise DownloadError(f"GET {what} answered {response.status_code}, not the file (200 or 206)")
    if response.status_code == 206:
        start, total = content_range(response.headers.get("Content-Range", ""))
        if start != offset:
            raise DownloadError(f"the server resumed {what} at byte {start}, not {offset}")
        return "ab", offset, total
    length = response.headers.get("Content-Length")
    return "wb", 0, int(length) if length is not None else None
