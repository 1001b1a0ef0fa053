"""`Client`: the h3batch API from Python, blocking (httpx2). `AsyncClient` (client/aio.py) has the same methods.

    from h3batch.client import Client

    with Client("http://127.0.0.1:8000", api_key="...") as client:
        job = client.create("rain on a tin roof", seconds=4)
        job = client.wait(job, on_event=print)       # the event stream, or long polls if it is refused
        client.download(job, "rain.mp4")             # continues a broken download with Range

Every call retries network failures and 429 / 502 / 503 / 504 answers (and 409 idempotency_key_in_use) with
backoff, pausing for the server's Retry-After when it sends one (client/protocol.py `RetryPolicy`); every create
carries an Idempotency-Key of its own, the same on each retry, so a create whose answer was lost never makes a
second job. A refusal raises the exception of its code (client/errors.py).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx2

from h3batch.client import protocol
from h3batch.client.errors import (APIError, ConnectionFailed, JobAlreadyTerminal, OriginError, WaitTimeout,
                                   job_failed)
from h3batch.client.models import Batch, BatchPage, BatchResult, Job, JobEvent, JobPage, Usage
from h3batch.client.protocol import RetryPolicy

DEFAULT_API = "http://127.0.0.1:8000"
LONG_POLL_S = 10.0
"""One blocking GET /jobs/{id}?wait= of the long-poll fallback (the server allows up to 60)."""

JobRef = str | Job


def _id(job: JobRef) -> str:
    return job.id if isinstance(job, Job) else job


def user_agent() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return f"h3batch-client/{version('h3batch')}"
    except PackageNotFoundError:
        return "h3batch-client"


class Client:
    """The h3batch API. `base_url` defaults to $H3BATCH_API_URL (else http://127.0.0.1:8000), `api_key` to
    $H3BATCH_API_KEY; `timeout` is per request (seconds); `retry` says how often and how long to retry."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 retry: RetryPolicy = RetryPolicy()):
        self.base_url = (base_url or os.environ.get("H3BATCH_API_URL") or DEFAULT_API).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("H3BATCH_API_KEY")
        headers = {"User-Agent": user_agent(), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.retry = retry
        self._http = httpx2.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------------------------------------

    def url(self, path_or_url: str) -> str:
        """An absolute URL on the API's origin; OriginError for a URL on another host (the key never goes there)."""
        url = urljoin(self.base_url + "/", path_or_url) if not path_or_url.startswith("/") else \
            self.base_url + path_or_url
        a, b = urlsplit(url), urlsplit(self.base_url)
        if (a.scheme, a.netloc) != (b.scheme, b.netloc):
            raise OriginError(f"refusing to fetch {url}: not on the API's origin {self.base_url}")
        return url

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """`call()` under the retry policy; network failures that outlast it become ConnectionFailed."""
        retry_number = 0
        while True:
            try:
                return call()
            except (httpx2.TransportError, APIError) as exc:
                pause = protocol.should_retry(exc, self.retry, retry_number)
                if pause is None:
                    if isinstance(exc, httpx2.TransportError):
                        raise ConnectionFailed(f"cannot reach the API at {self.base_url} "
                                               f"({type(exc).__name__})") from exc
                    raise
                time.sleep(pause)
                retry_number += 1

    def request(self, method: str, path: str, *, timeout: float | None = None, **kwargs) -> httpx2.Response:
        """One API call under the retry policy; the answer, read, or the APIError of its code."""
        url = self.url(path)
        extra = {} if timeout is None else {"timeout": timeout}

        def once() -> httpx2.Response:
            response = self._http.request(method, url, **extra, **kwargs)
            protocol.raise_for_error(response)
            return response

        return self._retrying(once)

    # --- jobs -------------------------------------------------------------------------------------------------------

    def create(self, prompt: str, *, seconds: float | None = None, width: int | None = None,
               height: int | None = None, seed: int | None = None, aspect_ratio: str | None = None,
               idempotency_key: str | None = None, **fields: Any) -> Job:
        """Queue a render (POST /jobs); other body fields (precision, webhook_url, webhook_events, ...) as
        keywords. The Idempotency-Key is made here unless given, and sent again on every retry."""
        body = protocol.job_body(prompt, {"seconds": seconds, "width": width, "height": height, "seed": seed,
                                          "aspect_ratio": aspect_ratio, **fields})
        key = idempotency_key or protocol.new_idempotency_key()
        response = self.request("POST", "/jobs", json=body, headers={"Idempotency-Key": key})
        return Job.model_validate(response.json())

    def get(self, job: JobRef, *, wait_s: float = 0) -> Job:
        """The job (GET /jobs/{id}); `wait_s` > 0 blocks on the server until it finishes or the time is up."""
        params = {"wait": f"{wait_s:g}"} if wait_s else None
        response = self.request("GET", f"/jobs/{_id(job)}", params=params, timeout=wait_s + 30)
        return Job.model_validate(response.json())

    def list(self, *, limit: int = 20, after: str | None = None, order: str = "desc",
             status: str | None = None) -> JobPage:
        """One page of your jobs (GET /jobs); the next page is `after=page.last_id` while `page.has_more`."""
        params = {"limit": limit, "order": order, **({"after": after} if after else {}),
                  **({"status": status} if status else {})}
        return JobPage.model_validate(self.request("GET", "/jobs", params=params).json())

    def iter_jobs(self, *, order: str = "desc", status: str | None = None, page_size: int = 100) -> Iterator[Job]:
        """Every job of yours, page after page."""
        after = None
        while True:
            page = self.list(limit=page_size, after=after, order=order, status=status)
            yield from page.data
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    def events(self, job: JobRef, *, last_event_id: str | None = None) -> Iterator[JobEvent]:
        """The job's server-sent events (GET /jobs/{id}/events, parsed by httpx2's EventSource) until the stream
        ends; after `last_event_id` when given. A refusal (e.g. 503 too_many_streams) raises its APIError."""
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        url = self.url(f"/jobs/{_id(job)}/events")
        with self._http.sse(url, headers=headers, timeout=httpx2.Timeout(30.0, read=120.0)) as source:
            if source.response.status_code >= 400:
                source.response.read()
                protocol.raise_for_error(source.response)
            for sse in source:
                yield JobEvent(event=sse.event, id=sse.id or None, data=sse.json() if sse.data else {})

    def wait(self, job: JobRef, *, timeout_s: float = 1800.0, on_event: Callable[[JobEvent], None] | None = None,
             use_events: bool = True, raise_on_failure: bool = True) -> Job:
        """Until the job is finished: its event stream (each event to `on_event`), resumed with Last-Event-ID when
        it ends early; long polls (GET ?wait=) when the stream is refused or breaks. Returns the finished job;
        raises its JobFailed subclass when it did not complete (unless `raise_on_failure=False`) and WaitTimeout
        after `timeout_s` (the job keeps running)."""
        job_id = _id(job)
        deadline = time.monotonic() + timeout_s
        current = job if isinstance(job, Job) else self.get(job_id)
        last_id = None
        while not current.finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"job {job_id} did not finish within {timeout_s:g} s "
                                  "(it keeps running on the server)")
            if use_events:
                try:
                    for event in self.events(job_id, last_event_id=last_id):
                        last_id = event.id or last_id
                        if on_event is not None:
                            on_event(event)
                        if event.event in protocol.TERMINAL_EVENTS or time.monotonic() >= deadline:
                            break
                except (APIError, httpx2.HTTPError, ValueError):
                    use_events = False  # refused (503 too_many_streams) or broken: long-poll instead
                current = self.get(job_id)
            else:
                current = self.get(job_id, wait_s=max(1.0, min(LONG_POLL_S, remaining)))
                if on_event is not None:
                    on_event(JobEvent(event="poll", data=current.model_dump(
                        mode="json", include={"status", "stage", "progress", "step"})))
        if raise_on_failure and current.status.value != "completed":
            raise job_failed(current)
        return current

    def usage(self, from_: Any = None, to: Any = None) -> Usage:
        """Your key's usage (GET /usage) over the UTC days from `from_` to `to` (each a datetime, date, Unix
        seconds or ISO-8601 text; defaults: the 30 days up to now): jobs by final status, seconds of video and
        GPU-seconds, each job counted once."""
        return Usage.model_validate(self.request("GET", "/usage", params=protocol.usage_params(from_, to)).json())

    def logs(self, job: JobRef) -> list[dict[str, Any]]:
        """The worker's log lines about the job (GET /jobs/{id}/logs): `{ts, level, logger, message}`, oldest first."""
        return self.request("GET", f"/jobs/{_id(job)}/logs").json()["data"]

    def cancel(self, job: JobRef) -> Job:
        """Cancel (POST /jobs/{id}/cancel): a queued job at once, a running one at its next step. A job already
        finished is returned as it is (a retried cancel whose first answer was lost lands here too)."""
        try:
            return Job.model_validate(self.request("POST", f"/jobs/{_id(job)}/cancel").json())
        except JobAlreadyTerminal:
            return self.get(job)

    def delete(self, job: JobRef) -> None:
        """Stop the job if it runs, then remove it and its video (DELETE /jobs/{id})."""
        self.request("DELETE", f"/jobs/{_id(job)}")

    def download(self, job: JobRef, out: str | os.PathLike, *, on_bytes: Callable[[int], None] | None = None) -> int:
        """The job's MP4 into `out` (GET /jobs/{id}/content); a download that broke off continues from its partial
        file with a Range request. Returns the file's size."""
        return self.fetch_file(f"/jobs/{_id(job)}/content", Path(out), on_bytes)[0]

    def fetch_file(self, path: str, out: Path, on_bytes: Callable[[int], None] | None = None, *,
                   trust_partial: bool = False) -> tuple[int, int]:
        """GET `path` into `out` through `.<name>.partial`, continued with `Range` + `If-Range` (the ETag kept
        beside it) after a break, also across retries; renamed into place only at the announced size.
        Returns (size, byte the server resumed at, 0 for a whole download)."""
        url = self.url(path)
        out.parent.mkdir(parents=True, exist_ok=True)

        def once() -> tuple[int, int]:
            headers, offset = protocol.resume_headers(out, trust_partial)
            with self._http.stream("GET", url, headers=headers, timeout=httpx2.Timeout(30.0, read=300.0),
                                   follow_redirects=True) as r:
                if r.status_code == 416:  # the partial file is no prefix of this resource: start again
                    protocol.partial_path(out).unlink(missing_ok=True)
                    headers, offset = {}, 0
                    r.close()
                    return self._fetch_whole(url, out, on_bytes)
                if r.status_code >= 400:
                    r.read()
                    protocol.raise_for_error(r)
                return self._write_body(r, out, offset, path, on_bytes)

        return self._retrying(once)

    def _fetch_whole(self, url: str, out: Path, on_bytes) -> tuple[int, int]:
        with self._http.stream("GET", url, timeout=httpx2.Timeout(30.0, read=300.0), follow_redirects=True) as r:
            if r.status_code >= 400:
                r.read()
                protocol.raise_for_error(r)
            return self._write_body(r, out, 0, url, on_bytes)

    @staticmethod
    def _write_body(r: httpx2.Response, out: Path, offset: int, what: str, on_bytes) -> tuple[int, int]:
        mode, resumed_from, total = protocol.body_plan(r, offset, what)
        if r.headers.get("ETag"):
            protocol.etag_path(out).write_text(r.headers["ETag"])
        size = resumed_from
        with protocol.partial_path(out).open(mode) as f:
            for chunk in r.iter_bytes(1 << 16):
                f.write(chunk)
                size += len(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        if total is not None and size != total:
            raise httpx2.ReadError(f"download of {what} ended at {size} of {total} bytes")
        os.replace(protocol.partial_path(out), out)
        protocol.etag_path(out).unlink(missing_ok=True)
        return size, resumed_from

    def run(self, prompt: str, out: str | os.PathLike | None = None, *, timeout_s: float = 1800.0,
            on_event: Callable[[JobEvent], None] | None = None, **fields: Any) -> Job:
        """create + wait (+ download into `out`): the finished job, or its JobFailed."""
        job = self.wait(self.create(prompt, **fields), timeout_s=timeout_s, on_event=on_event)
        if out is not None:
            self.download(job, out)
        return job

    # --- batches ----------------------------------------------------------------------------------------------------

    def create_batch(self, requests: Iterable[dict[str, Any]] | str | os.PathLike, *,
                     metadata: dict[str, Any] | None = None, on_invalid: str = "reject",
                     webhook_url: str | None = None, idempotency_key: str | None = None) -> Batch:
        """Queue many renders as one batch (POST /batches) from job requests (each a /jobs body, optionally with
        `custom_id`) or a JSONL file of them. InvalidBatch lists refused lines in `details`."""
        if isinstance(requests, (str, os.PathLike)):
            requests = protocol.read_requests(Path(requests))[0]
        body = protocol.batch_body(requests, metadata, on_invalid, webhook_url)
        key = idempotency_key or protocol.new_idempotency_key()
        response = self.request("POST", "/batches", json=body, headers={"Idempotency-Key": key}, timeout=120)
        return Batch.model_validate(response.json())

    def get_batch(self, batch: str | Batch) -> Batch:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        return Batch.model_validate(self.request("GET", f"/batches/{batch_id}").json())

    def list_batches(self, *, limit: int = 20, after: str | None = None) -> BatchPage:
        params = {"limit": limit, **({"after": after} if after else {})}
        return BatchPage.model_validate(self.request("GET", "/batches", params=params).json())

    def batch_results(self, batch: str | Batch) -> list[BatchResult]:
        """One result per item in input order (GET /batches/{id}/results)."""
        batch_id = batch.id if isinstance(batch, Batch) else batch
        text = self.request("GET", f"/batches/{batch_id}/results", timeout=120).text
        return [BatchResult.model_validate_json(line) for line in text.splitlines() if line.strip()]

    def wait_batch(self, batch: str | Batch, *, on_progress: Callable[[Batch], None] | None = None,
                   poll_s: float = 1.0, timeout_s: float | None = None) -> Batch:
        """GET the batch every `poll_s` until it is finished, handing each look to `on_progress`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        current = batch if isinstance(batch, Batch) else self.get_batch(batch)
        while True:
            if on_progress is not None:
                on_progress(current)
            if current.finished:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"batch {current.id} did not finish within {timeout_s:g} s "
                                  "(it keeps running on the server)")
            time.sleep(poll_s)
            current = self.get_batch(current.id)

    def download_archive(self, batch: str | Batch, out: str | os.PathLike,
                         on_bytes: Callable[[int], None] | None = None) -> tuple[int, int]:
        """The finished batch's zip (GET /batches/{id}/archive) into `out`, resumed with Range after a break.
        Returns (size, resumed-from byte)."""
        batch_id = batch.id if isinstance(batch, Batch) else batch
        return self.fetch_file(f"/batches/{batch_id}/archive", Path(out), on_bytes, trust_partial=True)

    def cancel_batch(self, batch: str | Batch) -> Batch:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        return Batch.model_validate(self.request("POST", f"/batches/{batch_id}/cancel").json())

    def delete_batch(self, batch: str | Batch) -> None:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        self.request("DELETE", f"/batches/{batch_id}")
