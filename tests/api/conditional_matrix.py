"""The conditional-request matrix of RFC 9110 §13 (api/conditional.py), run over HTTP against one download route: job
content or batch archive, local directory or S3 store. Each case is (request headers, method, expected status, what
the body must be); `check_matrix` sends them all and fails listing every case that answered otherwise.
"""
from __future__ import annotations

from datetime import timedelta

import requests
from werkzeug.http import http_date, parse_date


def cases(etag: str, last_modified: str | None) -> list[tuple[str, dict[str, str], str, int, str]]:
    """(name, headers, method, status, body) where body is "full", "range" (bytes 0-9), "none" or "error"."""
    weak = f"W/{etag}"
    rng = {"Range": "bytes=0-9"}
    out = [
        ("If-Match *", {"If-Match": "*"}, "GET", 200, "full"),
        ("If-Match current", {"If-Match": etag}, "GET", 200, "full"),
        ("If-Match in a list", {"If-Match": f'"other", {etag}'}, "GET", 200, "full"),
        ("If-Match other", {"If-Match": '"other"'}, "GET", 412, "error"),
        ("If-Match weak current (strong comparison)", {"If-Match": weak}, "GET", 412, "error"),
        ("If-Match other on HEAD", {"If-Match": '"other"'}, "HEAD", 412, "none"),
        ("If-None-Match *", {"If-None-Match": "*"}, "GET", 304, "none"),
        ("If-None-Match current", {"If-None-Match": etag}, "GET", 304, "none"),
        ("If-None-Match weak current (weak comparison)", {"If-None-Match": weak}, "GET", 304, "none"),
        ("If-None-Match current on HEAD", {"If-None-Match": etag}, "HEAD", 304, "none"),
        ("If-None-Match other", {"If-None-Match": '"other"'}, "GET", 200, "full"),
        ("If-Match fails before If-None-Match", {"If-Match": '"other"', "If-None-Match": etag}, "GET", 412, "error"),
        ("If-Match passes, then If-None-Match", {"If-Match": etag, "If-None-Match": etag}, "GET", 304, "none"),
        ("Range alone", rng, "GET", 206, "range"),
        ("If-Range current", {**rng, "If-Range": etag}, "GET", 206, "range"),
        ("If-Range weak current never matches", {**rng, "If-Range": weak}, "GET", 200, "full"),
        ("If-Range other", {**rng, "If-Range": '"other"'}, "GET", 200, "full"),
        ("If-Range with If-None-Match other", {**rng, "If-Range": etag, "If-None-Match": '"x"'}, "GET", 206, "range"),
        ("If-Modified-Since unreadable", {"If-Modified-Since": "yesterday"}, "GET", 200, "full"),
    ]
    if last_modified is None:  # no Last-Modified sent: the date conditions are ignored (RFC 9110 §13.1.3, §13.1.4)
        now = http_date(parse_date("Mon, 01 Jan 2024 00:00:00 GMT"))
        out += [
            ("If-Modified-Since without Last-Modified", {"If-Modified-Since": now}, "GET", 200, "full"),
            ("If-Unmodified-Since without Last-Modified", {"If-Unmodified-Since": now}, "GET", 200, "full"),
            ("If-Range date without Last-Modified", {**rng, "If-Range": now}, "GET", 200, "full"),
        ]
        return out
    lm = parse_date(last_modified)
    before, after = http_date(lm - timedelta(days=1)), http_date(lm + timedelta(days=1))
    out += [
        ("If-Modified-Since = Last-Modified", {"If-Modified-Since": last_modified}, "GET", 304, "none"),
        ("If-Modified-Since later", {"If-Modified-Since": after}, "HEAD", 304, "none"),
        ("If-Modified-Since earlier", {"If-Modified-Since": before}, "GET", 200, "full"),
        ("If-None-Match decides, not If-Modified-Since", {"If-None-Match": '"other"', "If-Modified-Since": after},
         "GET", 200, "full"),
        ("If-Unmodified-Since earlier", {"If-Unmodified-Since": before}, "GET", 412, "error"),
        ("If-Unmodified-Since = Last-Modified", {"If-Unmodified-Since": last_modified}, "GET", 200, "full"),
        ("If-Match decides, not If-Unmodified-Since", {"If-Match": etag, "If-Unmodified-Since": before}, "GET",
         200, "full"),
        ("If-Range = Last-Modified", {**rng, "If-Range": last_modified}, "GET", 206, "range"),
        ("If-Range other date", {**rng, "If-Range": before}, "GET", 200, "full"),
    ]
    return out


def check_matrix(url: str, auth: dict[str, str], *, expect_last_modified: bool) -> int:
    """GET `url` once for its validators, then every case; returns the number of cases run."""
    whole = requests.get(url, headers=auth, timeout=60)
    assert whole.status_code == 200, whole.text[:300]
    etag = whole.headers["ETag"]
    assert etag.startswith('"'), etag  # a strong validator
    last_modified = whole.headers.get("Last-Modified")
    assert (last_modified is not None) == expect_last_modified, whole.headers
    wrong = []
    matrix = cases(etag, last_modified)
    for name, headers, method, status, body in matrix:
        reply = requests.request(method, url, headers={**auth, **headers}, timeout=60)
        ok = reply.status_code == status
        if body == "full":
            ok = ok and reply.content == whole.content
        elif body == "range":
            ok = ok and reply.content == whole.content[:10] and reply.headers.get("Content-Range", "").startswith(
                "bytes 0-9/")
        elif body == "none":
            ok = ok and reply.content == b"" and reply.headers.get("ETag") == etag
        elif body == "error":
            ok = ok and reply.json()["error"]["code"] == "precondition_failed" and reply.headers.get("ETag") == etag
        if not ok:
            wrong.append(f"{name}: {method} {headers} -> {reply.status_code} {reply.content[:120]!r}")
    assert not wrong, "\n".join(wrong)
    return len(matrix)
