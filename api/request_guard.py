"""Request-shape checks that hold for every route, before any view runs.

Every query parameter of the API takes one value (limit, after, order, status, wait, variant, ...). Flask's
`request.args.get` silently takes the first of `?limit=5&limit=abc`, so the rest would be accepted unread; here a
repeated parameter is 400 `invalid_request` naming it, which is what the OpenAPI document promises (the schemas give
each parameter a single type, and Schemathesis sends repeats as arrays to check that they are refused).

Every request body (POST, PUT, PATCH) is read here, chunk by chunk, through api/json_budget.py's scanner before any
view parses it (a multipart body only on /batches, whose file is JSONL; elsewhere parts may be binary): one nested deeper than MAX_DEPTH or holding more tokens than the app's budget (from H3BATCH_MAX_BATCH)
is 422 `json_too_complex` naming the limit, decided on its first chunks; the rest is read and dropped, so a hostile
15 MiB body costs the process one chunk, not the ~400 MB `json.loads` would build (issue 26 item 2). What passes is
handed on as the request's input stream. A body over the request's limit (MAX_CONTENT_LENGTH, or the batch route's
own) is 413, chunked or not: werkzeug stops reading a chunked body at the limit and would hand the views the first
64 KiB, which they would refuse as broken JSON (400).

`form_parts` is how the multipart views read the parts, each name once (it is no before-request check: /batches raises
the body limit in its own hook, which runs after the app's).
"""
from __future__ import annotations

import io

from flask import Flask, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from h3batch.api.errors import ApiError
from h3batch.api.json_budget import JsonBudget, TooComplex, max_tokens
from h3batch.core import defaults

UNREADABLE_NAME = "(empty name)"
"""What a part whose name werkzeug cannot read is called: `name="x\\"` (the quote reads as escaped) comes back
keyed None, and sorting or printing None beside str names was a 500. No route accepts this name: an unknown field."""


def form_parts() -> tuple[list[tuple[str, str]], list[str]]:
    """The multipart/urlencoded body as (text parts as (name, value), file part names), every name a str.

    Every form field is sent once, as every query parameter is: werkzeug keeps each repeat of a part (`-F file=@a
    -F file=@b`) and `.get` would silently take the first, so a repeated name, text or file part (or both at once),
    is 400 `invalid_request` naming it.
    """
    counts: dict[str | None, int] = {}
    for name, values in [*request.form.lists(), *request.files.lists()]:
        counts[name] = counts.get(name, 0) + len(values)
    for name, count in counts.items():
        if count > 1:
            raise ApiError(400, "invalid_request", f"{(name or UNREADABLE_NAME)[:64]}: expected one form part, "
                                                   f"found {count}")
    texts = [(name or UNREADABLE_NAME, request.form[name]) for name in request.form]
    return texts, [name or UNREADABLE_NAME for name in request.files]


CHUNK_BYTES = 256 * 1024
"""How much of a body is read (and scanned) at a time."""


def init_request_guard(app: Flask) -> None:
    app.before_request(_one_value_per_query_parameter)
    app.before_request(_bounded_body)


def _bounded_body() -> None:
    """Read the body through the JSON budget (module docstring), then hand it on as the request's input."""
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    length = request.content_length
    if request.method not in ("POST", "PUT", "PATCH") or (length is None and not chunked):
        return
    limit = request.max_content_length
    if length is not None and limit is not None and length > limit:
        return  # werkzeug answers 413 without reading when a view asks for the body
    stream = request.environ["wsgi.input"]
    budget = JsonBudget(max_tokens(int(current_app.config.get("MAX_BATCH", defaults.MAX_BATCH))))
    # a multipart body elsewhere may carry binary parts (not JSON); within 64 KiB its JSON text cannot cost much
    scan = request.mimetype != "multipart/form-data" or request.path.rstrip("/") == "/batches"
    parts: list[bytes] = []
    got = 0
    while length is None or got < length:
        chunk = stream.read(CHUNK_BYTES if length is None else min(CHUNK_BYTES, length - got))
        if not chunk:
            break
        got += len(chunk)
        if limit is not None and got > limit:
            raise RequestEntityTooLarge()
        try:
            if scan:
                budget.feed(chunk)
        except TooComplex as exc:
            _drop_rest(stream, length, got, limit)
            raise ApiError(422, "json_too_complex", budget.describe(exc)) from None
        parts.append(chunk)
    data = b"".join(parts)
    request.environ["wsgi.input"] = io.BytesIO(data)
    request.environ["CONTENT_LENGTH"] = str(len(data))
    request.environ.pop("HTTP_TRANSFER_ENCODING", None)
    request.environ.pop("wsgi.input_terminated", None)


def _drop_rest(stream, length: int | None, got: int, limit: int | None) -> None:
    """Read what is left of a refused body without keeping it, so the client sees the answer, not a reset."""
    while (length is None or got < length) and (limit is None or got <= limit):
        chunk = stream.read(CHUNK_BYTES if length is None else min(CHUNK_BYTES, length - got))
        if not chunk:
            return
        got += len(chunk)


def _one_value_per_query_parameter() -> None:
    for name, values in request.args.lists():
        if len(values) > 1:
            raise ApiError(400, "invalid_request", f"{name[:64]}: expected one value, found {len(values)}")
