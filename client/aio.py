"""`AsyncClient`: the h3batch API from asyncio (httpx2.AsyncClient), with the methods of `Client` (client/sync.py) as
coroutines (`events` and `iter_jobs` are async iterators), the same retries, Idempotency-Keys and exceptions.

    async with AsyncClient("http://127.0.0.1:8000", api_key="...") as client:
        jobs = [await client.create(p, seconds=4) for p in prompts]
        done = await asyncio.gather(*(client.wait(j) for j in jobs))

Kept as a second class beside `Client` rather than one generated from the other: every method is a few lines over
client/protocol.py, and the two read the same line by line. Files are written with ordinary blocking writes of
64 KiB chunks (the standard library has no async file I/O; a chunk costs microseconds).
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import httpx2

from h3batch.client import protocol
from h3batch.client.errors import APIError, ConnectionFailed, JobAlreadyTerminal, WaitTimeout, job_failed
from h3batch.client.models import Batch, BatchResult, Job, JobEvent, JobPage, Usage
from h3batch.client.protocol import RetryPolicy
from h3batch.client.sync import DEFAULT_API, LONG_POLL_S, JobRef, _id, user_agent


class AsyncClient:
    """The h3batch API for asyncio; arguments as `Client`."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout: float = 30.0,
                 retry: RetryPolicy = RetryPolicy()):
        self.base_url = (base_url or os.environ.get("H3BATCH_API_URL") or DEFAULT_API).rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get("H3BATCH_API_KEY")
        headers = {"User-Agent": user_agent(), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self.retry = retry
        self._http = httpx2.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def url(self, path: str) -> str:
        """The API's URL for an absolute path (what every answer's links are)."""
        return self.base_url + path

    async def _retrying(self, call: Callable[[], Any]) -> Any:
        retry_number = 0
        while True:
            try:
                return await call()
            except (httpx2.TransportError, APIError) as exc:
                pause = protocol.should_retry(exc, self.retry, retry_number)
                if pause is None:
                    if isinstance(exc, httpx2.TransportError):
                        raise ConnectionFailed(f"cannot reach the API at {self.base_url} "
                                               f"({type(exc).__name__})") from exc
                    raise
                await asyncio.sleep(pause)
                retry_number += 1

    async def request(self, method: str, path: str, *, timeout: float | None = None, **kwargs) -> httpx2.Response:
        url = self.url(path)
        extra = {} if timeout is None else {"timeout": timeout}

        async def once() -> httpx2.Response:
            response = await self._http.request(method, url, **extra, **kwargs)
            protocol.raise_for_error(response)
            return response

        return await self._retrying(once)

    # --- jobs -------------------------------------------------------------------------------------------------------

    async def create(self, prompt: str, *, seconds: float | None = None, width: int | None = None,
                     height: int | None = None, seed: int | None = None, aspect_ratio: str | None = None,
                     idempotency_key: str | None = None, **fields: Any) -> Job:
        body = protocol.job_body(prompt, {"seconds": seconds, "width": width, "height": height, "seed": seed,
                                          "aspect_ratio": aspect_ratio, **fields})
        key = idempotency_key or protocol.new_idempotency_key()
        response = await self.request("POST", "/jobs", json=body, headers={"Idempotency-Key": key})
        return Job.model_validate(response.json())

    async def get(self, job: JobRef, *, wait_s: float = 0) -> Job:
        params = {"wait": f"{wait_s:g}"} if wait_s else None
        response = await self.request("GET", f"/jobs/{_id(job)}", params=params, timeout=wait_s + 30)
        return Job.model_validate(response.json())

    async def list(self, *, limit: int = 20, after: str | None = None, order: str = "desc",
                   status: str | None = None) -> JobPage:
        params = {"limit": limit, "order": order, **({"after": after} if after else {}),
                  **({"status": status} if status else {})}
        return JobPage.model_validate((await self.request("GET", "/jobs", params=params)).json())

    async def iter_jobs(self, *, order: str = "desc", status: str | None = None,
                        page_size: int = 100) -> AsyncIterator[Job]:
        after = None
        while True:
            page = await self.list(limit=page_size, after=after, order=order, status=status)
            for job in page.data:
                yield job
            if not page.has_more or not page.last_id:
                return
            after = page.last_id

    async def events(self, job: JobRef, *, last_event_id: str | None = None) -> AsyncIterator[JobEvent]:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        url = self.url(f"/jobs/{_id(job)}/events")
        async with self._http.sse(url, headers=headers, timeout=httpx2.Timeout(30.0, read=120.0)) as source:
            if source.response.status_code >= 400:
                await source.response.aread()
                protocol.raise_for_error(source.response)
            async for sse in source:
                yield JobEvent(event=sse.event, id=sse.id or None, data=sse.json() if sse.data else {})

    async def wait(self, job: JobRef, *, timeout_s: float = 1800.0,
                   on_event: Callable[[JobEvent], None] | None = None, use_events: bool = True,
                   raise_on_failure: bool = True) -> Job:
        job_id = _id(job)
        deadline = time.monotonic() + timeout_s
        current = job if isinstance(job, Job) else await self.get(job_id)
        last_id = None
        while not current.finished:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(f"job {job_id} did not finish within {timeout_s:g} s "
                                  "(it keeps running on the server)")
            if use_events:
                try:
                    async for event in self.events(job_id, last_event_id=last_id):
                        last_id = event.id or last_id
                        if on_event is not None:
                            on_event(event)
                        if event.event in protocol.TERMINAL_EVENTS or time.monotonic() >= deadline:
                            break
                except (APIError, httpx2.HTTPError, ValueError):
                    use_events = False
                current = await self.get(job_id)
            else:
                current = await self.get(job_id, wait_s=max(1.0, min(LONG_POLL_S, remaining)))
                if on_event is not None:
                    on_event(JobEvent(event="poll", data=current.model_dump(
                        mode="json", include={"status", "stage", "progress", "step"})))
        if raise_on_failure and current.status.value != "completed":
            raise job_failed(current)
        return current

    async def usage(self, from_: Any = None, to: Any = None) -> Usage:
        params = protocol.usage_params(from_, to)
        return Usage.model_validate((await self.request("GET", "/usage", params=params)).json())

    async def logs(self, job: JobRef) -> list[dict[str, Any]]:
        return (await self.request("GET", f"/jobs/{_id(job)}/logs")).json()["data"]

    async def cancel(self, job: JobRef) -> Job:
        try:
            return Job.model_validate((await self.request("POST", f"/jobs/{_id(job)}/cancel")).json())
        except JobAlreadyTerminal:
            return await self.get(job)

    async def delete(self, job: JobRef) -> None:
        await self.request("DELETE", f"/jobs/{_id(job)}")

    async def download(self, job: JobRef, out: str | os.PathLike,
                       on_bytes: Callable[[int], None] | None = None) -> int:
        """The job's MP4 into `out`, resumed with Range after a break (as `Client.download`)."""
        out = Path(out)
        url = self.url(f"/jobs/{_id(job)}/content")
        out.parent.mkdir(parents=True, exist_ok=True)

        async def once() -> int:
            headers, offset = protocol.resume_headers(out, False)
            async with self._http.stream("GET", url, headers=headers,
                                         timeout=httpx2.Timeout(30.0, read=300.0), follow_redirects=True) as r:
                if r.status_code >= 400:
                    await r.aread()
                    protocol.partial_path(out).unlink(missing_ok=True)  # a 416 too: start afresh next time
                    protocol.raise_for_error(r)
                mode, resumed_from, total = protocol.body_plan(r, offset, url)
                if r.headers.get("ETag"):
                    protocol.etag_path(out).write_text(r.headers["ETag"])
                size = resumed_from
                with protocol.partial_path(out).open(mode) as f:
                    async for chunk in r.aiter_bytes(1 << 16):
                        f.write(chunk)
                        size += len(chunk)
                        if on_bytes is not None:
                            on_bytes(len(chunk))
            if total is not None and size != total:
                raise httpx2.ReadError(f"download of {url} ended at {size} of {total} bytes")
            os.replace(protocol.partial_path(out), out)
            protocol.etag_path(out).unlink(missing_ok=True)
            return size

        return await self._retrying(once)

    # --- batches ----------------------------------------------------------------------------------------------------

    async def create_batch(self, requests: Iterable[dict[str, Any]] | str | os.PathLike, *,
                           metadata: dict[str, Any] | None = None, on_invalid: str = "reject",
                           webhook_url: str | None = None, idempotency_key: str | None = None) -> Batch:
        if isinstance(requests, (str, os.PathLike)):
            requests = protocol.read_requests(Path(requests))[0]
        body = protocol.batch_body(requests, metadata, on_invalid, webhook_url)
        key = idempotency_key or protocol.new_idempotency_key()
        response = await self.request("POST", "/batches", json=body, headers={"Idempotency-Key": key}, timeout=120)
        return Batch.model_validate(response.json())

    async def get_batch(self, batch: str | Batch) -> Batch:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        return Batch.model_validate((await self.request("GET", f"/batches/{batch_id}")).json())

    async def batch_results(self, batch: str | Batch) -> list[BatchResult]:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        text = (await self.request("GET", f"/batches/{batch_id}/results", timeout=120)).text
        return [BatchResult.model_validate_json(line) for line in text.splitlines() if line.strip()]

    async def wait_batch(self, batch: str | Batch, *, on_progress: Callable[[Batch], None] | None = None,
                         poll_s: float = 1.0, timeout_s: float | None = None) -> Batch:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        current = batch if isinstance(batch, Batch) else await self.get_batch(batch)
        while True:
            if on_progress is not None:
                on_progress(current)
            if current.finished:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"batch {current.id} did not finish within {timeout_s:g} s "
                                  "(it keeps running on the server)")
            await asyncio.sleep(poll_s)
            current = await self.get_batch(current.id)

    async def cancel_batch(self, batch: str | Batch) -> Batch:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        return Batch.model_validate((await self.request("POST", f"/batches/{batch_id}/cancel")).json())

    async def delete_batch(self, batch: str | Batch) -> None:
        batch_id = batch.id if isinstance(batch, Batch) else batch
        await self.request("DELETE", f"/batches/{batch_id}")
