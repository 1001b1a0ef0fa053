"""A bound on what parsing a request body can cost, checked on the raw bytes before any object is built.

`json.loads` has no limits: a 15 MiB body of `[],[],…` becomes five million lists, and the API process grew by
~400 MB per such request (issue 26 item 2). `JsonBudget` is fed the body chunk by chunk as it is read from the socket
(api/request_guard.py) and raises `TooComplex` as soon as the body holds more structural tokens than MAX_TOKENS or
nests deeper than MAX_DEPTH, so a hostile body is refused after its first chunk and the rest is read and dropped,
never held. What passes is bounded: parsing at most MAX_TOKENS tokens builds at most that many containers and
values (plus string bytes, bounded by the body size).

Tokens: `[`, `]`, `{`, `}`, `,`, each string, and each line break that `str.splitlines` honours (a JSONL upload is
split into lines before its lines are parsed). Strings are skipped with their escapes, following JSON's own rule:
a string ends at an unescaped `"`, and a raw control character inside one is where `json.loads` (strict) stops, so
the scanner leaves the string there too (never under-counting what the parser goes on to read).

Written here rather than taken from a library: the streaming JSON parsers on the package index (ijson) walk every
token in Python to report it, seconds per hostile body, and stop at the first invalid line of a JSONL upload, whose
lines must each be judged; this scanner does its counting with C-speed `bytes.count` and two regular expressions and
walks brackets one by one only while the depth could pass the limit.
"""
from __future__ import annotations

import re

MAX_DEPTH = 32
"""Deepest nesting of arrays and objects parsed (a batch body needs 4)."""
TOKENS_PER_ITEM = 64
"""Structural tokens allowed per job request a batch may carry (a request with every field uses about 20)."""
BASE_TOKENS = 4096
"""Tokens allowed on top of TOKENS_PER_ITEM per request (the batch's own fields, a multipart envelope)."""
LINE_BREAKS = (b"\n", b"\r", b"\x0b", b"\x0c", b"\x1c", b"\x1d", b"\x1e", b"\xc2\x85", b"\xe2\x80\xa8",
               b"\xe2\x80\xa9")
"""What `str.splitlines` splits on, in UTF-8: each one makes a line, counted as a token."""

_STRING_REST = re.compile(rb'[^"\\\x00-\x1f]*(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*)*')
_BRACKET = re.compile(rb"[\[\]{}]")


def max_tokens(max_batch: int) -> int:
    """The token budget of a body when a batch may carry `max_batch` requests."""
    return BASE_TOKENS + TOKENS_PER_ITEM * max_batch


class TooComplex(ValueError):
    """The body passed a limit: `what` (`tokens` or `depth`), the limit, and how far the scan got."""

    def __init__(self, what: str, limit: int, found: int):
        super().__init__(f"{what} over {limit}")
        self.what, self.limit, self.found = what, limit, found


class JsonBudget:
    """Counts a body's tokens and depth across chunks; `feed` raises TooComplex past a limit."""

    def __init__(self, tokens: int, depth: int = MAX_DEPTH):
        self.max_tokens, self.max_depth = tokens, depth
        self.tokens = self.depth = 0
        self.in_string = self.escaped = False

    def feed(self, chunk: bytes) -> None:
        self._count(sum(chunk.count(brk) for brk in LINE_BREAKS))
        pos, end = 0, len(chunk)
        while pos < end:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                    if chunk[pos] < 0x20:  # a control character ends what json.loads reads
                        self.in_string = False
                    pos += 1
                    continue
                stop = _STRING_REST.match(chunk, pos).end()
                if stop == end:
                    return
                byte = chunk[stop]
                if byte == 0x5C:  # a backslash as the chunk's last byte: its escaped byte comes next
                    self.escaped = True
                    return
                self.in_string = False
                pos = stop + (1 if byte == 0x22 else 0)
                continue
            quote = chunk.find(b'"', pos)
            stop = end if quote < 0 else quote
            self._segment(chunk, pos, stop)
            if quote < 0:
                return
            self._count(1)
            self.in_string, pos = True, quote + 1

    def _segment(self, chunk: bytes, start: int, stop: int) -> None:
        """Count the tokens between strings, and follow the depth (bracket by bracket only when it could pass)."""
        opens = chunk.count(b"[", start, stop) + chunk.count(b"{", start, stop)
        closes = chunk.count(b"]", start, stop) + chunk.count(b"}", start, stop)
        self._count(opens + closes + chunk.count(b",", start, stop))
        if self.depth + opens <= self.max_depth:
            self.depth = max(0, self.depth + opens - closes)
            return
        for match in _BRACKET.finditer(chunk, start, stop):  # at most max_tokens brackets: counted above
            if match.group() in (b"[", b"{"):
                self.depth += 1
                if self.depth > self.max_depth:
                    raise TooComplex("depth", self.max_depth, self.depth)
            else:
                self.depth = max(0, self.depth - 1)

    def _count(self, n: int) -> None:
        self.tokens += n
        if self.tokens > self.max_tokens:
            raise TooComplex("tokens", self.max_tokens, self.tokens)

    def end_line(self) -> None:
        """A JSONL line ended: the next one starts outside any string."""
        self.in_string = self.escaped = False

    def describe(self, exc: TooComplex) -> str:
        if exc.what == "depth":
            return f"the body nests arrays or objects more than {exc.limit} deep; refused before parsing"
        return (f"the body holds more than {exc.limit} JSON tokens (brackets, commas, strings and line breaks; "
                f"{TOKENS_PER_ITEM} per job request a batch may carry, plus {BASE_TOKENS}); refused before parsing")
