"""Stream slots: keep `GET /jobs/{id}/events` (server-sent events; the route is in api/jobs.py) from starving the
API's threads.

Under gunicorn's gthread workers (what `h3batch api` runs) every open event stream holds one thread of one worker
process for as long as the client listens. Two guards, applied around the view without changing it:

- at most `SSE_MAX_STREAMS` streams per process (H3BATCH_SSE_MAX_STREAMS, default 4, i.e. half of the default 8
  threads); one more gets 503 `too_many_streams` + `Retry-After`, so plain requests always find a free thread;
- each stream lasts at most `SSE_MAX_S` seconds (H3BATCH_SSE_MAX_S, default 300); it then ends after an SSE
  `retry:` hint, and a client reconnects with `Last-Event-ID` and misses nothing (events replay from the Redis
  stream).

The slot is released when the WSGI server closes the response (end of stream or client gone: the generator's
`finally`), or at once when the view answered with an error instead of a stream.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

from flask import Flask, current_app, g, request

from h3batch.api.errors import ApiError

EVENTS_ENDPOINT = "jobs.events"
_SLOTS_KEY = "h3batch.sse_slots"
DEFAULT_MAX_STREAMS = 4
DEFAULT_MAX_S = 300.0
RETRY_AFTER_S = 2


def init_stream_slots(app: Flask) -> None:
    """Install the stream guards (call after auth, so an unauthenticated request never takes a slot)."""
    app.extensions[_SLOTS_KEY] = threading.BoundedSemaphore(max(1, int(app.config["SSE_MAX_STREAMS"])))
    app.before_request(_take_slot)
    app.after_request(_hand_over_slot)


def _take_slot() -> None:
    if request.endpoint != EVENTS_ENDPOINT:
        return
    slots: threading.BoundedSemaphore = current_app.extensions[_SLOTS_KEY]
    if not slots.acquire(blocking=False):
        raise ApiError(503, "too_many_streams",
                       f"this API process already serves {current_app.config['SSE_MAX_STREAMS']} event streams; "
                       f"retry shortly or poll GET /jobs/{{id}}", True, {"Retry-After": str(RETRY_AFTER_S)})
    g.sse_slot = slots


def _bounded(chunks: Iterable, max_s: float, release) -> Iterator:
    """Yield the view's chunks until it ends or `max_s` passed; always release the slot and close the view."""
    deadline = time.monotonic() + max_s
    iterator = iter(chunks)
    try:
        for chunk in iterator:
            yield chunk
            if time.monotonic() >= deadline:
                yield "retry: 1000\n: stream time limit reached; reconnect with Last-Event-ID\n\n"
                return
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        release()


def _hand_over_slot(response):
    slots = g.pop("sse_slot", None)
    if slots is None:
        return response
    if response.mimetype != "text/event-stream" or not response.is_streamed:
        slots.release()  # the view answered with an error: no stream holds the slot
        return response
    released = threading.Event()

    def release() -> None:
        if not released.is_set():
            released.set()
            slots.release()

    response.response = _bounded(response.response, float(current_app.config["SSE_MAX_S"]), release)
    response.call_on_close(release)  # the server closing the response early (client gone) also frees it
    return response
