"""Bearer API keys from H3BATCH_API_KEYS.

Keys are kept only as SHA-256 digests; a presented key is hashed and compared with `hmac.compare_digest` against
every digest (no early exit), so timing says nothing about which key or how much of it matched. A job belongs to the
key that created it (its digest prefix), and another key's job reads as 404. With no keys configured the API is open,
which create_app logs as a warning at start.
"""
from __future__ import annotations

import hashlib
import hmac
import logging

from flask import Flask, g, request

from h3batch.api.errors import ApiError

log = logging.getLogger("h3batch.api")

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/", "/ui/batches", "/ui/sweeps", "/metrics"})
"""Routes answered without a key (the web UI's pages hold no data; their script sends the key; /metrics has its
own token, api/metrics.py)."""
OPEN_PREFIXES = ("/static/",)
"""Path prefixes answered without a key: the web UI's script and stylesheet."""

_EXTENSION_KEY = "h3batch.key_digests"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def key_id(digest: bytes) -> str:
    """Short public id of a key (first 12 hex of its digest): job owner, and safe to log."""
    return digest.hex()[:12]


def init_auth(app: Flask) -> None:
    """Hash the configured keys and install the before-request check."""
    digests = [_digest(k) for k in app.config.get("API_KEYS") or ()]
    app.extensions[_EXTENSION_KEY] = digests
    if not digests:
        log.warning("H3BATCH_API_KEYS is unset: the job API is OPEN to anyone who can reach it")
    else:
        log.info("api keys loaded count=%d ids=%s", len(digests), ",".join(key_id(d) for d in digests))
    app.before_request(_authenticate)


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, False, {"WWW-Authenticate": 'Bearer realm="h3batch"'})


def _authenticate() -> None:
    from flask import current_app  # noqa: PLC0415

    digests: list[bytes] = current_app.extensions[_EXTENSION_KEY]
    g.owner = ""
    if not digests or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("expected an 'Authorization: Bearer <key>' header")
    presented = _digest(token.strip())
    match = None
    for digest in digests:
        if hmac.compare_digest(presented, digest):
            match = digest
    if match is None:
        raise _unauthorized("the API key is not valid")
    g.owner = key_id(match)
