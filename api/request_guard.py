"""Request-shape checks that hold for every route, before any view runs.

Every query parameter of the API takes one value (limit, after, order, status, wait, variant, ...). Flask's
`request.args.get` silently takes the first of `?limit=5&limit=abc`, so the rest would be accepted unread; here a
repeated parameter is 400 `invalid_request` naming it, which is what the OpenAPI document promises (the schemas give
each parameter a single type, and Schemathesis sends repeats as arrays to check that they are refused).

A chunked body (no Content-Length) over MAX_CONTENT_LENGTH is 413 like a declared one: werkzeug stops reading such a
body at the limit and hands the views the first 64 KiB, which they would refuse as broken JSON (400).

`form_parts` is how the multipart views read the parts, each name once (it is no before-request check: /batches raises
the body limit in its own hook, which runs after the app's).
"""
from __future__ import annotations

from flask import Flask, request

from h3batch.api.errors import ApiError

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


def init_request_guard(app: Flask) -> None:
    app.before_request(_one_value_per_query_parameter)
    app.before_request(_chunked_body_within_limit)


def _chunked_body_within_limit() -> None:
    if request.content_length is not None or "chunked" not in request.headers.get("Transfer-Encoding", "").lower():
        return
    request.get_data(cache=True)  # up to the limit; the views read this cached copy
    request.stream.read(1)  # past the limit werkzeug's bounded stream raises RequestEntityTooLarge (413)


def _one_value_per_query_parameter() -> None:
    for name, values in request.args.lists():
        if len(values) > 1:
            raise ApiError(400, "invalid_request", f"{name[:64]}: expected one value, found {len(values)}")
