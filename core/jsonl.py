"""How a JSONL file is cut into lines, one rule for the server (POST /batches uploads, api/batch_service.py) and the
client (`h3batch submit --file`, client/cli_batch.py), so both count the same lines and name the same line numbers.

A line ends at `\\n`, with one `\\r` before it taken as part of the ending (files written on Windows). Nothing else
ends a line: U+2028, U+2029, U+0085, `\\v`, `\\f` and `\\x1c`-`\\x1e` are valid inside a JSON string, and
`str.splitlines()` would cut a prompt holding one of them in two. A line is blank when it holds only JSON whitespace
(space, tab, `\\r`); blank lines are skipped and still counted. A UTF-8 byte order mark at the start is dropped.
Written by hand because the standard library has no line splitter with this rule (`splitlines` knows every Unicode
break, `bytes.split` keeps the `\\r`).
"""
from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import AnyStr

_JSON_SPACE = " \t\r"


def numbered_lines(data: AnyStr) -> Iterator[tuple[int, AnyStr]]:
    """(line number from 1, line without its ending) for every line of `data` (str or bytes) that is not blank."""
    if isinstance(data, bytes):
        newline, cr, space = b"\n", b"\r", _JSON_SPACE.encode()
        if data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8):]
    else:
        newline, cr, space = "\n", "\r", _JSON_SPACE
        if data.startswith("\ufeff"):
            data = data[1:]
    for number, line in enumerate(data.split(newline), start=1):
        if line.endswith(cr):
            line = line[:-1]
        if line.strip(space):
            yield number, line
