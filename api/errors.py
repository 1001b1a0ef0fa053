"""One error shape for every non-2xx answer: `{"error": {"code", "message", "retryable", "request_id"}}`.

Views raise `ApiError`; werkzeug's own HTTP errors (404 for an unknown route, 405, 413 from `MAX_CONTENT_LENGTH`)
and anything unexpected are turned into the same JSON shape here, so a client never sees HTML or a traceback. The
router's redirects (308 for `//jobs` or a missing trailing slash) carry the envelope too, and a Location that is only
a path: werkzeug builds an absolute URL from the request's Host header, which a client can set to anything.
gunicorn's own answers (414, 431, bad request lines) get the envelope in api/gunicorn_worker.py.
"""
from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

import redis.exceptions
from flask import Flask, g, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import RequestRedirect

log = logging.getLogger("h3batch.api")


class ApiError(Exception):
    """An HTTP error with a stable machine-readable `code`; `headers` are added to the response (e.g. Retry-After)."""

    def __init__(self, status: int, code: str, message: str, retryable: bool = False,
                 headers: dict[str, str] | None = None, details: list[dict] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.headers = dict(headers or {})
        self.details = details  # `error.details`: e.g. POST /batches' refused lines


def error_response(status: int, code: str, message: str, retryable: bool = False,
                   headers: dict[str, str] | None = None, details: list[dict] | None = None):
    """A Flask response carrying the error envelope."""
    body = {"error": {"code": code, "message": message, "retryable": retryable,
                      "request_id": g.get("request_id")}}
    if details is not None:
        body["error"]["details"] = details
    response = jsonify(body)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _code_for(exc: HTTPException) -> str:
    """werkzeug's class name as snake case: NotFound -> not_found, RequestEntityTooLarge -> request_entity_too_large."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


# Statuses a client may usefully retry unchanged.
_RETRYABLE_STATUSES = frozenset({408, 429, 502, 503, 504})


def register_error_handlers(app: Flask) -> None:
    """Map ApiError, werkzeug HTTP errors and uncaught exceptions to the JSON envelope."""

    app.after_request(_redirect_as_envelope)

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.retryable, exc.headers, exc.details)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        status = exc.code or 500
        # Keep werkzeug's protocol headers (Allow on 405, Content-Range on 416), not its HTML content type.
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        code = "request_too_large" if status == 413 else _code_for(exc)
        message = exc.description or exc.name
        return error_response(status, code, message, status in _RETRYABLE_STATUSES, headers)

    @app.errorhandler(redis.exceptions.ConnectionError)
    @app.errorhandler(redis.exceptions.TimeoutError)
    @app.errorhandler(redis.exceptions.OutOfMemoryError)
    def _storage_down(exc: Exception):
        # Redis down or full (noeviction): the job store cannot take the request; a retry later may succeed.
        log.error("redis unavailable request_id=%s error=%s", g.get("request_id"), type(exc).__name__)
        return error_response(503, "storage_unavailable", "the job store (Redis) is unavailable; retry later", True,
                              {"Retry-After": "5"})

    @app.errorhandler(RecursionError)
    def _too_deep(exc: RecursionError):
        # Only a JSON body nested thousands deep (it still fits MAX_CONTENT_LENGTH) recurses this far: the parser
        # gives up, and the client hears that its body is not acceptable JSON rather than a 500.
        return error_response(400, "invalid_json", "the JSON body is nested too deeply", False)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        # Log the traceback server-side with the request id; the client gets a bare code.
        log.exception("unhandled error request_id=%s", g.get("request_id"))
        return error_response(500, "internal_error", "internal server error; see the server log for this request_id",
                              True)


def _redirect_as_envelope(response):
    # Flask hands routing redirects straight to the client, past every error handler; they arrive here as
    # werkzeug's HTML response.
    if not isinstance(request.routing_exception, RequestRedirect):
        return response
    target = urlsplit(request.routing_exception.new_url)
    location = (target.path or "/") + (f"?{target.query}" if target.query else "")
    return error_response(response.status_code, "permanent_redirect",
                          f"this resource is at {location}; repeat the request there", False,
                          {"Location": location})
