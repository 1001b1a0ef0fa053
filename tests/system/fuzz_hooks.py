"""Schemathesis hooks for the fuzz run (loaded through SCHEMATHESIS_HOOKS=tests.system.fuzz_hooks).

The fuzz API has no worker, so jobs never finish; a valid blocking wait (`?wait=N`, N <= 60, or any `Prefer: wait=N`,
which the API clamps to 60 s) would then only measure the client's timeout. Valid `?wait` values are shortened to
0.2 s, which keeps them valid (the case stays positive or negative as generated), and every `Prefer: wait=N` becomes
`wait=0`; out-of-range and malformed `?wait` values are sent unchanged and must get 400.
"""
from __future__ import annotations

import re

import schemathesis

_PREFER_WAIT = re.compile(r"(wait\s*=\s*)(\d+)", re.IGNORECASE)


def _short(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return value
    return 0.2 if 0.2 < seconds <= 60 else value


@schemathesis.hook
def before_call(context, case, **kwargs):
    if case.query and "wait" in case.query:
        case.query["wait"] = _short(case.query["wait"])
    if case.headers and isinstance(case.headers.get("Prefer"), str):
        case.headers["Prefer"] = _PREFER_WAIT.sub(lambda m: m.group(1) + "0", case.headers["Prefer"])
