"""Stream slots: keep `GET /jobs/{id}/events` (server-sent events; the route is in api/jobs.py) from starving the
API's threads.

Under gunicorn's gthread workers (what `h3batch api` runs) every open event stream holds one thread of one worker
process for as long as the client listens. Two guards, applied around the view without changing it:

- at most `SSE_MAX_STREAMS` streams per process (H3BATCH_SSE_MAX_STREAMS, default 16) and
  `SSE_MAX_STREAMS_PER_KEY` per API key (default 8), both cut down to what the process's threads allow
  (api/slots.py `slot_budget`: 16 of the default 64); one more gets 503 `too_many_streams` + `Retry-After`, so plain
  requests always find a free thread and one key cannot take every stream;
- each stream lasts at most `SSE_MAX_S` seconds (H3BATCH_SSE_MAX_S, default 300); it then ends after an SSE
  `retry:` hint, and a client reconnects with `Last-Event-ID` and misses nothing (events replay from the Redis
  stream).

The slot is released when the WSGI server closes the response (end of stream or client gone: the generator's
`finally`; the view polls the client's socket every half second, so a hang-up frees it at once), or at once when the
view answered with an error instead of a stream.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

from flask import Flask, current_app, g, request

from h3batch.api import slots as slot_pools
from h3batch.api.errors import ApiError

EVENTS_ENDPOINT = "jobs.events"
DEFAULT_MAX_S = 300.0
RETRY_AFTER_S = 2


def init_stream_slots(app: Flask) -> None:
    """Install the stream guards (call after auth, so an unauthenticated request never takes a slot, and after
    slots.init_slots, which made the pool)."""
    app.before_request(_take_slot)
    app.after_request(_hand_over_slot)


def _take_slot() -> None:
    if request.endpoint != EVENTS_ENDPOINT:
        return
    pool: slot_pools.SlotPool = current_app.extensions[slot_pools.STREAMS_KEY]
    owner = g.get("owner") or ""
    if not pool.try_take(owner):
        whose = (f"this API key already has {pool.per_key}" if pool.in_use(owner) >= pool.per_key
                 else f"this API process already has {pool.per_process}")
        raise ApiError(503, "too_many_streams", f"{whose} event streams open; retry shortly or poll GET /jobs/{{id}}",
                       True, {"Retry-After": str(RETRY_AFTER_S)})
    g.sse_slot = (pool, owner)


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
    held = g.pop("sse_slot", None)
    if held is None:
        return response
    pool, owner = held
    if response.mimetype != "text/event-stream" or not response.is_streamed:
        pool.release(owner)  # the view answered with an error: no stream holds the slot
        return response
    released = threading.Event()
    lock = threading.Lock()

    def release() -> None:
        with lock:  # the generator's finally and the server's close may both call it
            if released.is_set():
                return
            released.set()
        pool.release(owner)

    response.response = _bounded(response.response, float(current_app.config["SSE_MAX_S"]), release)
    response.call_on_close(release)  # the server closing the response early (client gone) also frees it
    return response
