"""The API's Redis client, created on first use from `current_app.config["REDIS_URL"]` (flaskr `db.py` shape).

Unlike flaskr's per-request sqlite connection, the client is kept per *app* (in `app.extensions`): a redis-py client
owns a thread-safe connection pool, so reusing it saves a TCP connect on every request (the API overhead budget is
a few milliseconds) and gunicorn threads share it safely. Nothing connects at import time.
"""
from __future__ import annotations

import threading

import redis
from flask import Flask, current_app

_EXTENSION_KEY = "h3batch.redis"
_create_lock = threading.Lock()

SOCKET_TIMEOUT_S = 5.0
"""A request never hangs longer than this on a stuck Redis; it gets 503 storage_unavailable instead."""


def get_redis() -> redis.Redis:
    """The app's Redis client (decode_responses=True: keys and values are str)."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    client = app.extensions.get(_EXTENSION_KEY)
    if client is None:
        with _create_lock:
            client = app.extensions.get(_EXTENSION_KEY)
            if client is None:
                client = redis.Redis.from_url(app.config["REDIS_URL"], decode_responses=True,
                                              socket_timeout=SOCKET_TIMEOUT_S,
                                              socket_connect_timeout=SOCKET_TIMEOUT_S,
                                              health_check_interval=30)
                app.extensions[_EXTENSION_KEY] = client
    return client


def close_redis(app: Flask) -> None:
    """Drop the app's pool (tests and shutdown); the next `get_redis()` makes a new one."""
    client = app.extensions.pop(_EXTENSION_KEY, None)
    if client is not None:
        client.close()
