"""Conditional requests (RFC 9110 §13) for the two download routes, the job content and the batch archive, decided
in one place.

werkzeug parses the headers (`parse_etags`, `unquote_etag`, `parse_date`) but its `make_conditional` evaluates them
in an order of its own: `If-Match: *` fails there, `If-Range` drops the weakness of a validator (so `W/"x"` matches
`"x"`), and If-Unmodified-Since is never read. The order of §13.2.2 is a few lines, written here:

1. If-Match (strong comparison; `*` matches the current representation): false → 412;
2. else If-Unmodified-Since (only when the route sends Last-Modified; an unreadable date is ignored): modified
   after it → 412;
3. If-None-Match (weak comparison; `*` matches): a match → 304 for GET/HEAD, 412 for any other method;
4. else If-Modified-Since (GET/HEAD, only with Last-Modified): not modified since → 304;
5. If-Range (GET with a Range): only a strong entity tag equal to the current one, or a date equal to Last-Modified,
   keeps the Range; a weak tag never matches, so the full representation is sent with 200.

A route calls `precondition(...)` first (an `ApiError` 412, or a 304 response to return), then `range_applies(...)`
to know whether to act on its Range header.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from flask import Response, request
from werkzeug.http import http_date, parse_date, parse_etags, unquote_etag

from h3batch.api.errors import ApiError

CONDITIONAL_HEADERS = ("If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range")


@dataclass(frozen=True)
class Validators:
    """What the route sends about the representation: its ETag as sent (`"abc"` or `W/"abc"`) and, when the route
    sends one, its Last-Modified time."""

    etag: str
    last_modified: datetime | float | None = None

    @property
    def modified(self) -> datetime | None:
        """Last-Modified at the one-second resolution of an HTTP date, or None."""
        when = self.last_modified
        if when is None:
            return None
        if not isinstance(when, datetime):
            when = datetime.fromtimestamp(when, tz=timezone.utc)
        return when.replace(microsecond=0)


def _strong_match(header: str, etag: str) -> bool:
    """If-Match's strong comparison: `*`, or a listed strong tag equal to the current tag, which must be strong."""
    tags = parse_etags(header)
    if tags.star_tag:
        return True
    value, weak = unquote_etag(etag)
    return not weak and tags.is_strong(value)


def _weak_match(header: str, etag: str) -> bool:
    """If-None-Match's weak comparison: `*`, or any listed tag (weak or strong) with the current tag's value."""
    tags = parse_etags(header)
    if tags.star_tag:
        return True
    value, _ = unquote_etag(etag)
    return tags.contains_weak(value)


def evaluate(method: str, headers, v: Validators) -> tuple[int, str] | None:
    """Steps 1-4 of the module docstring: (412 or 304, the header that decided it), or None (go on and serve)."""
    modified = v.modified
    if_match = headers.get("If-Match")
    if if_match is not None:
        if not _strong_match(if_match, v.etag):
            return 412, "If-Match"
    elif modified is not None and (since := parse_date(headers.get("If-Unmodified-Since"))) is not None:
        if modified > since:
            return 412, "If-Unmodified-Since"
    if_none_match = headers.get("If-None-Match")
    if if_none_match is not None:
        if _weak_match(if_none_match, v.etag):
            return (304 if method in ("GET", "HEAD") else 412), "If-None-Match"
    elif method in ("GET", "HEAD") and modified is not None:
        since = parse_date(headers.get("If-Modified-Since"))
        if since is not None and modified <= since:
            return 304, "If-Modified-Since"
    return None


def range_applies(headers, v: Validators) -> bool:
    """Step 5: act on the Range header? True without If-Range; with it, only when it names this representation by
    a strong validator (RFC 9110 §13.1.5)."""
    if_range = headers.get("If-Range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith(('W/"', 'w/"')):
        return False  # a weak validator never matches
    if if_range.startswith('"'):
        value, weak = unquote_etag(v.etag)
        return not weak and if_range == f'"{value}"'
    when = parse_date(if_range)
    return when is not None and v.modified is not None and when == v.modified


def precondition(v: Validators, headers: dict[str, str]) -> Response | None:
    """Check the current request's preconditions: a 304 response (with `headers`, the validators and no body) to
    return, None to go on; raises ApiError 412 `precondition_failed` naming the header that failed."""
    outcome = evaluate(request.method, request.headers, v)
    if outcome is None:
        return None
    status, header = outcome
    sent = {**headers, "ETag": v.etag}
    if v.modified is not None:
        sent["Last-Modified"] = http_date(v.modified)
    if status == 304:
        return Response(status=304, headers=sent)
    raise ApiError(412, "precondition_failed", f"{header}: {_FAILED[header]}", False, sent)


_FAILED = {"If-Match": "the current ETag matches none of the tags sent",
           "If-None-Match": "the current ETag matches a tag sent",
           "If-Unmodified-Since": "the representation was modified after the date sent"}


def strip_from_environ(environ: dict) -> None:
    """Remove the conditional headers once decided here, so werkzeug's range handling that follows decides
    nothing a second time."""
    for name in CONDITIONAL_HEADERS:
        environ.pop("HTTP_" + name.upper().replace("-", "_"), None)
